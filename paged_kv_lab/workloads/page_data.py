"""What the "Real workloads" page shows, computed without Streamlit: a trace checked against the
page's budget (``page_trace_limits`` of paged_kv_lab/workloads/trace_limits.py, the module the CLI's
checks live in too), replayed whole (the figures and the cache history "Why?" reads), a sweep of
pool sizes, and a window of steps recorded for the large-pool player.

The replay is workloads/replay.py's (the real kvcore Scheduler / KVCacheManager / BlockPool,
model-free). A window is recorded by replaying again, deterministically, to just before it with
nothing attached (from the whole run's last checkpoint before it, ``Checkpoints``), then
attaching the Recorder and stepping one real step at a time while a FrameRecorder keeps
keyframes plus deltas (recording/pool_frames.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from paged_kv_lab.recording.pool_frames import CacheLog, FrameRecorder, PoolFrame
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.store.server_cache import Shared, stop_point, yielding
from paged_kv_lab.text.i18n import Text
from paged_kv_lab.why.explain_replay import ReplayHit, explain_replay_hit
from paged_kv_lab.workloads import SHIPPED_TRACE
from paged_kv_lab.workloads.replay import Checkpoints, Replay, ReplaySettings, replay_settings
from paged_kv_lab.workloads.trace_formats import Trace, TraceError, load_trace, parse_trace
from paged_kv_lab.workloads.trace_limits import TraceLimits, check, check_trace

SHIPPED_ENV = "PAGED_KV_LAB_REPLAY_TRACE"  # another file to offer as the shipped trace


def shipped_trace_path() -> Path:
    return Path(os.environ.get(SHIPPED_ENV) or SHIPPED_TRACE)


def read_upload(data: bytes, name: str, limits: TraceLimits) -> Trace:
    """An uploaded trace: its bytes, then its requests and tokens, against the page's budget
    (BudgetError names the limit and its variable; TraceError the line and field)."""
    check(
        Text("refusal.what.trace_file", {"name": repr(name)}), len(data), limits, "max_trace_bytes"
    )
    lines = [line for line in data.splitlines() if line.strip()]
    # counted before any line is parsed
    what = Text("refusal.what.trace_file_requests", {"name": repr(name)})
    check(what, len(lines), limits, "max_requests")
    trace = parse_trace(lines, name)
    check_trace(trace, None, limits)
    return trace


def shipped_trace(start: int, count: int, limits: TraceLimits) -> Trace:
    """Requests ``start .. start + count`` of the shipped trace (read once per process)."""
    check(Text("refusal.what.requests_asked"), count, limits, "max_requests")
    whole = _load_shipped(str(shipped_trace_path()))
    if start >= len(whole):
        at = {"count": f"{len(whole):,}", "start": f"{start:,}"}
        raise TraceError(Text("refusal.trace.start_past_end", at))
    trace = whole.slice(start, start + count)
    check_trace(trace, None, limits)
    return trace


SHIPPED: Shared[Trace] = Shared("shipped traces")  # by path, read once per process


def _load_shipped(path: str) -> Trace:
    def read() -> Trace:
        if not Path(path).is_file():
            raise TraceError(
                Text("problem.trace.shipped_missing", {"path": path, "env": SHIPPED_ENV})
            )
        return load_trace(path)

    return SHIPPED.get(path, read)


# -- replaying -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    """What the page lets a visitor choose (everything else: the replay's defaults)."""

    block_size: int = 16
    num_gpu_blocks: int = 10_000
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    arrival: str = "timestamps"
    speedup: float = 1.0
    # 0: one full-attention layer (one KV cache group); else a full-attention layer and a
    # sliding-window layer of this window, two groups, the sliding one's blocks
    # ``sliding_block_multiple`` times block_size (vLLM's equal pages, as case 7 plays them)
    sliding_window: int = 0
    sliding_block_multiple: int = 1

    def engine_overrides(self) -> dict[str, Any]:
        """The engine settings the page sets (the replay's defaults for the rest)."""
        out: dict[str, Any] = {
            "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
        }
        if self.sliding_window:
            out["layer_types"] = ["full_attention", "sliding_attention"]
            out["sliding_window"] = self.sliding_window
            out["sliding_block_multiple"] = self.sliding_block_multiple
        return out

    def replay_settings(self, trace: Trace) -> ReplaySettings:
        return replay_settings(
            trace,
            overrides=self.engine_overrides(),
            arrival=self.arrival,
            speedup=self.speedup,
        )


@dataclass
class WorkloadRun:
    """One trace replayed whole with the page's settings: the figures (workload's ReplayResult)
    and the cache history (CacheLog) the Why? panel reads."""

    trace: Trace
    settings: Settings
    result: Any
    cache: CacheLog
    checkpoints: Optional[Checkpoints] = None  # where a window's replay resumes

    def explain(self, request_id: str) -> list[ReplayHit]:
        return explain_replay_hit(self.cache, request_id)


def _budgeted(r: Replay, limits: TraceLimits) -> None:
    check(Text("refusal.what.replay_steps"), r.step_count, limits, "max_steps")


STEPS_PER_STOP = 16  # replay steps between two stop points (one is ~0.1 s or less)


def run_workload(
    trace: Trace,
    settings: Settings,
    limits: TraceLimits,
    progress: Optional[Callable[[int, int], None]] = None,
) -> WorkloadRun:
    """Replay ``trace`` to the end with a CacheLog as the pool's observer (so one real step at a
    time); ``progress(finished, total)`` now and then. BudgetError past the page's step limit."""
    replay = settings.replay_settings(trace)
    check_trace(trace, replay, limits)
    r = Replay(trace, replay)
    cache = CacheLog(r.scheduler)
    r.block_pool.observer = cache
    cache.step = 1

    checkpoints = Checkpoints()

    def hook(info) -> None:
        cache.step = info.step + 1
        checkpoints.due(r)
        if info.step % STEPS_PER_STOP == 0:
            # the warm-up replays the first slice: it waits here while a page is drawn (a step
            # early in the trace, full of arrivals, takes ~5 ms on two cores)
            stop_point()

    r.add_step_hook(hook)
    while not r.done:
        stop_point()  # a replay in the background ends here when the process exits
        r.advance(until_step=r.step_count + 2000, progress=progress)
        _budgeted(r, limits)
    return WorkloadRun(trace, settings, r.result(), cache, checkpoints)


FILL_EVERY_STEPS = 64  # a filled run's checkpoints: at most this many steps apart


def fill_checkpoints(run: WorkloadRun, every_steps: int = FILL_EVERY_STEPS) -> int:
    """Checkpoints of ``run`` at most ``every_steps`` apart (``Checkpoints.fill``), taken ahead
    of visitors (it waits while a page is drawn), so that a moment's window resumes near it: the
    ones taken while it ran are as far apart as a quarter second of replay or more. The bytes
    added (up to the checkpoints' bound)."""
    if run.checkpoints is None:
        return 0
    with yielding():
        return run.checkpoints.fill(
            run.trace,
            run.settings.replay_settings(run.trace),
            run.result.steps,
            every_steps,
            stop_point,
        )


@dataclass(frozen=True)
class Window:
    """Recorded steps ``frames[0].step .. frames[-1].step`` of a replay, ``start`` the frame the
    player opens at."""

    frames: tuple[PoolFrame, ...]
    start: int
    num_gpu_blocks: int
    block_size: int  # the scheduler's (where the groups' sizes differ, their least common multiple)
    groups: tuple[dict[str, Any], ...] = ()  # the KV cache groups (kind, sliding_window)
    group_block_sizes: tuple[int, ...] = ()  # each group's own, only where they differ


def record_window(
    trace: Trace,
    settings: Settings,
    at_step: int,
    limits: TraceLimits,
    before: int = 40,
    after: int = 80,
    keyframe_every: int = 64,
    checkpoints: Optional[Checkpoints] = None,
    show_before: Optional[int] = None,
    show_after: Optional[int] = None,
) -> Window:
    """Steps around ``at_step`` for the player: replay to ``at_step - before - 1`` with nothing
    attached (resuming from the last of ``checkpoints``, the whole run's, at or before that
    step), then record each step with the Recorder (events) and a FrameRecorder.

    ``show_before`` / ``show_after`` (at most ``before`` / ``after``) keep fewer frames: from
    ``at_step - show_before`` to ``at_step + show_after``. The steps before those are still
    followed from ``at_step - before`` (the FrameRecorder learns the blocks' parents there), so
    each frame kept shows what the same step of the whole window shows; the page sends such a
    glimpse first, as it costs a few recorded steps instead of ``before + after + 1``."""
    replay = settings.replay_settings(trace)
    check_trace(trace, replay, limits)
    check(Text("refusal.what.window"), before + after + 1, limits, "max_window")
    first = max(1, at_step - before)
    shown = max(1, at_step - min(before, before if show_before is None else show_before))
    last = at_step + min(after, after if show_after is None else show_after)
    r = checkpoints.resume(trace, replay, first - 1) if checkpoints is not None else None
    if r is None:
        r = Replay(trace, replay)
    if first > 1:
        r.advance(until_step=first - 1)
        _budgeted(r, limits)
    frames = FrameRecorder(r.scheduler, keyframe_every=keyframe_every)
    if shown > first:  # followed with nothing attached: stretches of decodes fast-forward
        requests = dict(r.requests)

        def follow(info) -> None:
            nonlocal requests
            frames.follow({rid: req for rid, req in requests.items() if rid not in r.requests})
            requests = dict(r.requests)

        r.add_step_hook(follow)
        r.advance(until_step=shown - 1)
        r.remove_step_hook(follow)
    recorder = Recorder()
    r.attach(recorder)
    while not r.done and r.step_count < last:
        requests = dict(r.requests)
        info = r.step()
        finished = {rid: req for rid, req in requests.items() if rid not in r.requests}
        events = tuple(recorder.drain())
        scheduled = {e.request_id: e.num_tokens for e in events if e.kind == "scheduled"}
        frames.capture(info.step, scheduled, events, finished)
    if not frames.frames:
        raise ValueError(f"the replay has no step {at_step} (it ran {r.step_count} steps)")
    start = next(
        (i for i, f in enumerate(frames.frames) if f.step >= at_step), len(frames.frames) - 1
    )
    return Window(
        tuple(frames.frames),
        start,
        settings.num_gpu_blocks,
        frames.block_size,
        frames.groups,
        tuple(frames.group_block_sizes) if frames.sizes_differ else (),
    )


def admission_step(run: WorkloadRun, request_id: str) -> Optional[int]:
    got = run.cache.admissions.get(request_id)
    return got[0].step if got else None


def smallest_pool(trace: Trace, block_size: int) -> int:
    """The fewest blocks (null block included) in which the trace's longest request fits."""
    longest = max((r.input_length + r.output_length - 1 for r in trace.requests), default=1)
    return -(-longest // block_size) + 1


def sweep_values(
    trace: Trace, settings: Settings, limits: TraceLimits, points: int = 6
) -> list[int]:
    """Pool sizes from where the longest request fits (or an eighth of the chosen size) to four
    times the chosen size, spaced evenly on a log scale, the chosen size among them, within the
    page's limit."""
    lo = max(smallest_pool(trace, settings.block_size), settings.num_gpu_blocks // 8)
    hi = max(lo, min(limits.max_num_gpu_blocks, settings.num_gpu_blocks * 4))
    vals = {settings.num_gpu_blocks} if lo <= settings.num_gpu_blocks <= hi else set()
    for i in range(points):
        vals.add(round(lo * (hi / lo) ** (i / max(1, points - 1))))
    return sorted(vals)


def series_rows(result: Any, max_points: int = 2000) -> list[dict[str, Any]]:
    """The replay's time series (change points) as rows for the charts, thinned."""
    s = result.series.sample(max_points)
    usage, rates = s.usage(), s.hit_rate()
    return [
        {
            "step": s.step[i],
            "clock_s": s.clock_ms[i] / 1000.0,
            "usage": usage[i],
            "hit_rate": rates[i],
            "running": s.running[i],
            "waiting": s.waiting[i],
        }
        for i in range(len(s.step))
    ]
