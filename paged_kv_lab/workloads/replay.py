"""A trace replayed through the real kvcore Scheduler / KVCacheManager / BlockPool, model-free.

Each trace request becomes a kvcore ``Request`` whose prompt tokens come from its hash ids
(``workload.tokens``) and whose answer is ``output_length`` placeholder tokens, with no EOS: the
runner samples ``PLACEHOLDER_TOKEN`` for every request that reached the end of its tokens, and
``Scheduler.update_from_output`` stops it at ``max_tokens``. Everything else (admission, chunked
prefill, prefix-cache hits, allocation, eviction, preemption, freeing) is kvcore's own code.

Arrival rules:

- ``sequential``: a request is added when no request is unfinished (one at a time).
- ``timestamps``: the trace's clock, compressed by ``speedup``. The engine's clock follows a
  stated step-time model: a step that schedules ``n`` tokens lasts ``step_ms + token_ms * n``.
  A request is added at the start of the first step whose clock has reached its arrival; an idle
  engine jumps to the next arrival. The clock counts integer nanoseconds, so a fast-forwarded
  stretch lands on exactly the clock the step-by-step run reaches.

Fast-forward: a stretch of steps in which every running request only decodes one token into a
block it already holds (no allocation, no block filled, no finish, no arrival, no admission
possible) changes nothing but the requests' tokens; it is applied in one go. Every figure and
every per-step series point is the same as stepping (tests/lab/test_replay_fastforward.py).
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
import zlib
from array import array
from bisect import bisect_right
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Optional

from kvcore.core.kv_cache_inspect import num_blocks_held, num_cached_blocks
from kvcore.core.kv_cache_observer import KVCacheObserver
from kvcore.core.sched.scheduler import Scheduler
from kvcore.model.memory import hybrid_bytes_per_block
from kvcore.model.shapes import hybrid_shape
from kvcore.outputs import ModelRunnerOutput
from kvcore.request import Request
from kvcore.utils.math_utils import cdiv
from paged_kv_lab.run.engine import (
    block_hasher_for,
    hybrid_kv_cache_manager_off,
    kv_cache_groups,
    kv_cache_manager_for,
    scheduler_config_for,
)
from paged_kv_lab.run.scenario import (
    EngineSettings,
    ScenarioError,
    load_scenario,
    resolve_from_model,
)
from paged_kv_lab.text.i18n import Text
from paged_kv_lab.workloads.tokens import (
    PLACEHOLDER_TOKEN,
    SharedBlockHasher,
    check_block_size,
    prompt_token_ids,
)
from paged_kv_lab.workloads.trace_formats import Trace, TraceRequest

SEQUENTIAL = "sequential"
TIMESTAMPS = "timestamps"
ARRIVALS = (SEQUENTIAL, TIMESTAMPS)
# A replay's pool when none is given: this many token slots (plus the null block).
DEFAULT_POOL_TOKENS = 1 << 20
REPLAY_ENGINE_DEFAULTS = {"block_size": 16, "max_num_seqs": 256, "max_num_batched_tokens": 8192}
# Engine settings a model-free replay cannot honour.
_UNSUPPORTED = {
    "speculative": Text("problem.replay.no_speculative"),
    "kv_events": Text("problem.replay.no_kv_events"),
    "cpu_offload": Text("problem.replay.no_cpu_offload"),
}


class ReplayError(ValueError):
    """A replay that cannot run as asked (a request that never fits, a bad setting)."""


@dataclass(frozen=True)
class ReplaySettings:
    """Engine settings plus the arrival rule. ``step_ms`` / ``token_ms``: the step-time model of
    ``timestamps`` arrival (a step lasts step_ms + token_ms x scheduled tokens)."""

    engine: EngineSettings
    arrival: str = SEQUENTIAL
    speedup: float = 1.0
    step_ms: float = 10.0
    token_ms: float = 0.05
    fast_forward: bool = True

    def to_dict(self) -> dict:
        d = asdict(self)
        d["engine"] = {k: v for k, v in d["engine"].items() if k not in _UNSUPPORTED}
        return d


def replay_settings(
    trace: Trace,
    overrides: Optional[dict[str, Any]] = None,
    arrival: str = SEQUENTIAL,
    speedup: float = 1.0,
    step_ms: float = 10.0,
    token_ms: float = 0.05,
    fast_forward: bool = True,
) -> ReplaySettings:
    """Replay defaults for this trace, then ``overrides`` (engine settings, checked as a scenario
    file's are: ScenarioError lists every problem). ``max_model_len`` follows the trace."""
    overrides = dict(overrides or {})
    for key, why in _UNSUPPORTED.items():
        if overrides.get(key) is not None:
            raise ScenarioError([Text("problem.replay.unsupported", {"key": key, "why": why})])
    # model / dtype (a scenario's top-level fields): a hybrid model's layers, and the block size
    # and pool resolved from its shape as a scenario's are
    top = {k: overrides.pop(k) for k in ("model", "dtype") if k in overrides}
    engine = {**REPLAY_ENGINE_DEFAULTS, "max_model_len": trace.max_model_len, **overrides}
    shape = hybrid_shape(top["model"]) if isinstance(top.get("model"), str) else None
    if shape is not None:
        engine.setdefault("layer_types", list(shape.layer_types))
        if "block_size" not in overrides:
            del engine["block_size"]
    raw = resolve_from_model({"name": trace.name, **top, "engine": engine})
    engine = raw["engine"]
    if "num_gpu_blocks" not in engine:
        bs = engine.get("block_size")
        if isinstance(bs, int) and not isinstance(bs, bool) and bs >= 1:
            engine["num_gpu_blocks"] = DEFAULT_POOL_TOKENS // bs + 1
    scenario = load_scenario(raw)
    settings = scenario.engine
    if settings.num_gpu_blocks == "auto":
        if shape is None or settings.kv_cache_memory_bytes is None:
            raise ScenarioError([Text("problem.replay.auto_blocks")])
        # the stated KV budget over one block of the hybrid pool, as vLLM divides it
        per_block = hybrid_bytes_per_block(shape, settings.block_size, scenario.dtype)
        blocks = settings.kv_cache_memory_bytes // per_block
        if blocks < 2:
            at = {"bytes": settings.kv_cache_memory_bytes, "per_block": per_block}
            raise ScenarioError([Text("problem.replay.budget_too_small", at)])
        settings = replace(settings, num_gpu_blocks=blocks)
    if arrival not in ARRIVALS:
        at = {"choices": ", ".join(ARRIVALS), "got": repr(arrival)}
        raise ScenarioError([Text("problem.replay.arrival", at)])
    for name, v, low in (("speedup", speedup, 0.0), ("step_ms", step_ms, 0.0)):
        if not isinstance(v, (int, float)) or not v > low:
            at = {"name": name, "low": f"{low:g}", "got": repr(v)}
            raise ScenarioError([Text("problem.replay.above", at)])
    if not isinstance(token_ms, (int, float)) or token_ms < 0:
        raise ScenarioError([Text("problem.replay.token_ms", {"got": repr(token_ms)})])
    check_block_size(settings.block_size, trace.block_size)
    return ReplaySettings(
        settings, arrival, float(speedup), float(step_ms), float(token_ms), fast_forward
    )


@dataclass(frozen=True)
class StepInfo:
    """What one step (or one fast-forwarded stretch of ``num_steps`` steps) did; ``step`` is the
    last step it covers, ``clock_ms`` the clock after it. ``queries`` / ``hits`` are cumulative
    (vLLM's PrefixCacheStats over first admissions)."""

    step: int
    num_steps: int
    clock_ms: float
    num_running: int
    num_waiting: int
    num_scheduled_tokens: int
    used_blocks: int
    usage: float
    admitted: tuple[str, ...]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    evictions: int
    queries: int
    hits: int


@dataclass(frozen=True)
class RequestResult:
    """One trace request's replay. ``hit_tokens``: its prefix-cache hit at first admission
    (vLLM's ``num_cached_tokens``); -1 fields: it never got there."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrival_ms: float
    hit_tokens: int
    admitted_step: int
    finished_step: int
    num_preemptions: int


@dataclass(frozen=True)
class TimeSeries:
    """Change points over the run: a point after every step at which the running or waiting
    count, the blocks in use or the cumulative hit counts changed, plus the first and last step.
    Between two points every value stays as at the earlier one."""

    step: tuple[int, ...]
    clock_ms: tuple[float, ...]
    running: tuple[int, ...]
    waiting: tuple[int, ...]
    used_blocks: tuple[int, ...]
    queries: tuple[int, ...]
    hits: tuple[int, ...]
    usable_blocks: int

    def __len__(self) -> int:
        return len(self.step)

    def usage(self) -> list[float]:
        n = self.usable_blocks or 1
        return [u / n for u in self.used_blocks]

    def hit_rate(self) -> list[float]:
        """The cumulative hit rate after each point."""
        return [h / q if q else 0.0 for q, h in zip(self.queries, self.hits)]

    def sample(self, max_points: int) -> "TimeSeries":
        """At most ``max_points`` of the points, spread evenly, with every peak and trough kept:
        the points fall into equal buckets, and each bucket keeps its first point and those
        where the blocks in use, the running and the waiting counts are at their highest and
        lowest in it (the first and last points kept). Even spacing alone would lose the usage
        peak a chart is read for. Fewer than 14 points asked: evenly spread only."""
        n = len(self.step)
        if n <= max_points or max_points < 2:
            return self
        if max_points < 14:
            keep = {round(i * (n - 1) / (max_points - 1)) for i in range(max_points)}
        else:
            buckets = (max_points - 1) // 7  # at most 7 points a bucket, and the last point
            keep = {n - 1}
            extremes = (self.used_blocks, self.running, self.waiting)
            for b in range(buckets):
                lo, hi = b * n // buckets, (b + 1) * n // buckets
                keep.add(lo)
                for values in extremes:
                    part = values[lo:hi]
                    keep.add(lo + part.index(max(part)))
                    keep.add(lo + part.index(min(part)))
        idx = sorted(keep)
        return TimeSeries(
            *(tuple(getattr(self, f)[i] for i in idx) for f in _SERIES_FIELDS),
            usable_blocks=self.usable_blocks,
        )

    def to_dict(self) -> dict:
        d = {f: list(getattr(self, f)) for f in _SERIES_FIELDS}
        d["usage"] = self.usage()
        d["hit_rate"] = self.hit_rate()
        return d


_SERIES_FIELDS = ("step", "clock_ms", "running", "waiting", "used_blocks", "queries", "hits")


@dataclass(frozen=True)
class ReplayResult:
    """The figures of a replay (complete when ``done``). Hit counts mean what vLLM's
    ``PrefixCacheStats`` means: tokens at admission, first admissions in ``queries`` /
    ``hit_tokens``, requests resumed after preemption apart in ``preempted_*``."""

    trace: str
    format: str
    settings: dict
    done: bool
    requests: int
    prompt_tokens: int
    output_tokens: int
    queries: int
    hit_tokens: int
    preempted_requests: int
    preempted_queries: int
    preempted_hits: int
    evictions: int
    preemptions: int
    steps: int
    fast_forwarded_steps: int
    simulated_s: float
    wall_s: float
    upper_bound_hit_tokens: int
    per_request: tuple[RequestResult, ...]
    series: TimeSeries

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queries if self.queries else 0.0

    @property
    def upper_bound_hit_rate(self) -> float:
        return self.upper_bound_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self, series_points: Optional[int] = 1000) -> dict:
        """The CLI's ``--json``: every figure, ``per_request`` in trace order."""
        series = self.series if series_points is None else self.series.sample(series_points)
        return {
            "trace": self.trace,
            "format": self.format,
            "settings": self.settings,
            "done": self.done,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "queries": self.queries,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "preempted_requests": self.preempted_requests,
            "preempted_queries": self.preempted_queries,
            "preempted_hits": self.preempted_hits,
            "evictions": self.evictions,
            "preemptions": self.preemptions,
            "steps": self.steps,
            "fast_forwarded_steps": self.fast_forwarded_steps,
            "simulated_s": self.simulated_s,
            "wall_s": self.wall_s,
            "upper_bound": {
                "hit_tokens": self.upper_bound_hit_tokens,
                "hit_rate": self.upper_bound_hit_rate,
                "meaning": "an infinite cache: each prompt hits the longest prefix any earlier "
                "request in trace order had (in full blocks, capped as vLLM caps a hit)",
            },
            "per_request": [asdict(r) for r in self.per_request],
            "series": series.to_dict(),
        }


def max_hit_tokens(num_tokens: int, block_size: int, max_cache_hit_length: Optional[int]) -> int:
    """The longest hit vLLM allows a prompt of ``num_tokens``: full blocks of at most
    num_tokens - 1 tokens (the last token is always computed) and ``max_cache_hit_length``."""
    cap = num_tokens - 1
    if max_cache_hit_length is not None:
        cap = min(cap, max_cache_hit_length)
    return cap // block_size * block_size


def upper_bound_hits(trace: Trace, block_size: int, max_cache_hit_length=None) -> list[int]:
    """Per request, in trace order: the hit an infinite cache gives, i.e. the longest prefix
    (in full cache blocks, capped as a hit is) that any earlier request's prompt had.

    A cache block's content is named by the trace ids up to its trace block (interned as one
    chain id per prefix) and where it ends inside that trace block: the same naming as the
    derived tokens, so it counts exactly the blocks the replay's chained hashes can share."""
    tb = trace.block_size
    chains: dict[tuple[int, int], int] = {}
    seen: set[tuple[int, int]] = set()
    out = []
    for r in trace.requests:
        keys = []
        chain = -1
        full = r.input_length // block_size
        for j, h in enumerate(r.hash_ids):
            chain = chains.setdefault((chain, h), len(chains))
            start = j * tb
            for k in range(start // block_size, min(full, (start + tb) // block_size)):
                keys.append((chain, k))
        cap = max_hit_tokens(r.input_length, block_size, max_cache_hit_length) // block_size
        hit = 0
        while hit < cap and keys[hit] in seen:
            hit += 1
        out.append(hit * block_size)
        seen.update(keys)
    return out


def _fast_forward_allowed(observer) -> bool:
    """Skipped steps make no block operation and no decision, so an observer that only hears
    block operations (it says so with ``allows_fast_forward``) misses nothing; a recorder, which
    records every step, does."""
    return observer is None or getattr(observer, "allows_fast_forward", False)


class EvictionCounter(KVCacheObserver):
    """A pool's metrics collector that counts evictions (vLLM's collector hears them at the
    same place, ``BlockPool._maybe_evict_cached_block``)."""

    def __init__(self) -> None:
        self.evicted = 0

    def on_block_evicted(self, block) -> None:
        self.evicted += 1


class Replay:
    """One trace through one kvcore engine, stepped on demand.

    Invariants: requests enter the scheduler in trace order (``own_arrivals``) or in the order
    they were given (``add_request``); ``step_count`` counts engine steps (fast-forwarded ones
    included) and the clock is an integer count of nanoseconds; the figures kept per request are
    fixed once the request was first admitted / finished.

    A driver (paged_kv_lab/run/driver.py): ``add_request(Request)``, ``step() -> StepInfo``,
    ``has_unfinished()``, ``kv_events()``, ``outputs()`` (a ``RequestResult`` per request).
    ``own_arrivals=False``: the replay adds only the requests given to ``add_request`` (a fleet's
    router sends them; the trace names them and holds their arrival times). ``kv_events=True``:
    the pool queues vLLM's KV events and each step publishes them (``kv_events()``).
    """

    def __init__(
        self,
        trace: Trace,
        settings: ReplaySettings,
        own_arrivals: bool = True,
        kv_events: bool = False,
    ) -> None:
        s = settings.engine
        check_block_size(s.block_size, trace.block_size)
        self.trace = trace
        self.settings = settings
        num_layers = 1 if s.layer_types is None else len(s.layer_types)
        self.groups, _ = kv_cache_groups(s, num_layers, hybrid_kv_cache_manager_off(s, num_layers))
        self.max_model_len = s.max_model_len or trace.max_model_len
        self.kv_cache_manager = kv_cache_manager_for(s, self.groups, self.max_model_len, kv_events)
        self.block_pool = self.kv_cache_manager.block_pool
        self.scheduler = Scheduler(
            scheduler_config_for(s, self.max_model_len), self.kv_cache_manager
        )
        self.hasher = SharedBlockHasher(block_hasher_for(s)) if s.enable_prefix_caching else None
        self._all_full = all(g.kv_cache_spec.kind == "full" for g in self.groups)
        self._check_fits()
        # Evictions: counted where vLLM counts them, in the pool's metrics collector (the pool's
        # observer stays free for a recorder or a log).
        self._counters = EvictionCounter()
        self.block_pool.metrics_collector = self._counters
        n = len(trace)
        self.step_count = 0
        self.fast_forwarded_steps = 0
        self._clock_ns = 0
        self._step_ns = max(1, round(settings.step_ms * 1e6))  # a step always takes time
        self._token_ns = round(settings.token_ms * 1e6)
        self._arrival_ns = [round(r.arrival_ms * 1e6 / settings.speedup) for r in trace.requests]
        if settings.arrival == TIMESTAMPS and n:
            t0 = min(self._arrival_ns)
            self._arrival_ns = [a - t0 for a in self._arrival_ns]
        self.own_arrivals = own_arrivals
        self._next = 0 if own_arrivals else n  # the next trace request to add
        self._queued: list[Request] = []  # given to add_request, added at the next step
        self._taken: list[int] = []  # the trace indices given to add_request
        self._publishes = kv_events
        self._kv_events: tuple = ()  # the last step's
        self.hit_tokens = array("q", [-1]) * n
        self.admitted_step = array("q", [-1]) * n
        self.finished_step = array("q", [-1]) * n
        self.num_preemptions = array("q", [0]) * n
        self.preemptions = 0
        self.num_finished = 0
        self._hooks: list[Callable[[StepInfo], None]] = []
        self._last_changed = True  # the last step admitted, preempted, finished or added
        self._series = tuple(array("q") for _ in range(7))
        self._last_point: Optional[tuple] = None
        self._wall = 0.0
        self._upper: Optional[list[int]] = None

    # -- set-up -------------------------------------------------------------------------
    def _check_fits(self) -> None:
        s = self.settings.engine
        full_groups = sum(1 for g in self.groups if g.kv_cache_spec.kind == "full")
        usable = s.num_gpu_blocks - 1
        for r in self.trace.requests:
            if r.input_length >= self.max_model_len:
                raise ReplayError(
                    f"request {r.index}: its prompt of {r.input_length:,} tokens reaches "
                    f"max_model_len {self.max_model_len:,}"
                )
            # The last sampled token never gets a slot.
            tokens = min(r.input_length + r.output_length - 1, self.max_model_len - 1)
            need = cdiv(tokens, s.block_size) * full_groups
            if need > usable:
                raise ReplayError(
                    f"request {r.index} needs {need:,} blocks of {s.block_size} tokens "
                    f"({r.input_length:,} prompt + {r.output_length:,} output tokens) but the "
                    f"pool has {usable:,} usable blocks (num_gpu_blocks={s.num_gpu_blocks:,}); "
                    f"raise num_gpu_blocks to at least {need + 1:,}"
                )

    @property
    def evictions(self) -> int:
        """Cached blocks evicted so far (their hash dropped to reuse the block)."""
        return self._counters.evicted

    def attach(self, recorder) -> Any:
        """Attach a ``record.recorder.Recorder`` as the pool's observer (it then hears every
        decision; fast-forward is off while the pool has an observer that does not allow it).
        The eviction count, in the pool's metrics collector, is unaffected. Returns the
        recorder."""
        recorder.attach(self.kv_cache_manager)
        return recorder

    def add_step_hook(self, fn: Callable[[StepInfo], None]) -> None:
        """``fn(info)`` after every step (one call per fast-forwarded stretch)."""
        self._hooks.append(fn)

    def remove_step_hook(self, fn: Callable[[StepInfo], None]) -> None:
        self._hooks.remove(fn)

    # -- reading ------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return (
            self._next >= len(self.trace)
            and not self._queued
            and not self.scheduler.has_unfinished_requests()
        )

    def has_unfinished(self) -> bool:
        return not self.done

    def kv_events(self) -> tuple:
        """The KV cache events the last step published (none after a fast-forwarded stretch,
        which touches no block; always none unless built with ``kv_events=True``)."""
        return self._kv_events

    def queued(self) -> tuple[str, ...]:
        """The requests given to ``add_request`` and not yet in the scheduler."""
        return tuple(r.request_id for r in self._queued)

    @property
    def clock_ns(self) -> int:
        return self._clock_ns

    @property
    def clock_ms(self) -> float:
        return self._clock_ns / 1e6

    @property
    def requests(self) -> dict[str, Request]:
        return self.scheduler.requests

    def arrival_times_ns(self) -> list[int]:
        """Each trace request's arrival on this replay's clock, in nanoseconds (under
        ``timestamps``: the trace's clock compressed by ``speedup``, the first arrival at 0)."""
        return list(self._arrival_ns)

    def trace_request(self, request_id: str) -> TraceRequest:
        return self.trace.requests[int(request_id)]

    def used_blocks(self) -> int:
        pool = self.block_pool
        return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()

    def peak_used_blocks(self) -> int:
        """The most blocks in use after any step so far."""
        used = self._series[4]
        return max(used) if len(used) else 0

    # -- arrivals -----------------------------------------------------------------------
    def make_request(self, tr: TraceRequest) -> Request:
        """The kvcore Request of trace request ``tr``: its prompt tokens (workloads/tokens.py),
        ``output_length`` tokens to generate, its block hashes when prefix caching is on."""
        return Request(
            tr.request_id,
            prompt_token_ids(tr, self.trace.block_size),
            tr.output_length,
            arrival_time=tr.index,
            block_hasher=self.hasher,
        )

    def add_request(self, request: Request) -> None:
        """Take ``request`` (``make_request`` made it of one of this replay's trace requests): it
        enters the scheduler at the start of the next step, after those taken before it. An idle
        replay's clock first jumps to the request's arrival. Only a replay built with
        ``own_arrivals=False`` takes requests this way."""
        if self.own_arrivals:
            raise ReplayError(
                "this replay adds its trace's requests itself (build it with own_arrivals=False "
                "to give it requests)"
            )
        i = int(request.request_id)
        arrival = self._arrival_ns[i]
        if self.done and self._clock_ns < arrival:
            self._clock_ns = arrival
        self._queued.append(request)
        self._taken.append(i)

    def _add_arrivals(self) -> int:
        """Add the requests due at the start of this step; returns how many."""
        if self._queued:
            added = len(self._queued)
            for req in self._queued:
                self.scheduler.add_request(req)
            self._queued = []
            return added
        trace = self.trace.requests
        n = len(trace)
        if self._next >= n:
            return 0
        sched = self.scheduler
        if self.settings.arrival == SEQUENTIAL:
            if sched.has_unfinished_requests():
                return 0
            sched.add_request(self.make_request(trace[self._next]))
            self._next += 1
            return 1
        if not sched.has_unfinished_requests() and self._arrival_ns[self._next] > self._clock_ns:
            self._clock_ns = self._arrival_ns[self._next]  # idle: jump to the next arrival
        added = 0
        while self._next < n and self._arrival_ns[self._next] <= self._clock_ns:
            sched.add_request(self.make_request(trace[self._next]))
            self._next += 1
            added += 1
        return added

    # -- stepping -----------------------------------------------------------------------
    def step(self) -> StepInfo:
        """One engine step (never fast-forwarded)."""
        t0 = time.perf_counter()
        info = self._step(want_info=True)
        self._wall += time.perf_counter() - t0
        return info

    def _step(self, want_info: bool = False) -> Optional[StepInfo]:
        if self.done:
            raise ReplayError("the replay is done: every request finished")
        added = self._add_arrivals()
        sched = self.scheduler
        kvm = self.kv_cache_manager
        evictions_before = self.evictions
        out = sched.schedule()
        self.step_count += 1
        step = self.step_count
        num_scheduled = out.num_scheduled_tokens
        if not num_scheduled and not sched.running:
            raise ReplayError(
                f"step {step}: nothing could be scheduled and nothing runs (the waiting request "
                f"{sched.waiting.peek_request().request_id} never fits these settings)"
            )
        req_ids = list(num_scheduled)
        requests = sched.requests
        sampled = [
            [PLACEHOLDER_TOKEN]
            if requests[rid].num_computed_tokens >= requests[rid].num_tokens
            else []
            for rid in req_ids
        ]
        finished = sched.update_from_output(
            out, ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled)
        )
        kvm.make_prefix_cache_stats()
        for new in out.scheduled_new_reqs:
            i = int(new.req_id)
            if self.num_preemptions[i]:
                continue  # resumed after preemption: its first admission's figures stand
            self.hit_tokens[i] = new.num_computed_tokens
            self.admitted_step[i] = step
        preempted = out.preempted_req_ids
        for rid in preempted:
            self.num_preemptions[int(rid)] += 1
        self.preemptions += len(preempted)
        for rid in finished:
            self.finished_step[int(rid)] = step
        self.num_finished += len(finished)
        total = out.total_num_scheduled_tokens
        self._clock_ns += self._step_ns + self._token_ns * total
        self._last_changed = bool(added or out.scheduled_new_reqs or preempted or finished)
        self._point()
        if self._publishes:
            self._kv_events = tuple(kvm.take_events())
        if not self._hooks and not want_info:
            return None
        info = self._info(
            1,
            total,
            tuple(n.req_id for n in out.scheduled_new_reqs),  # new and resumed, in order
            tuple(sorted(preempted, key=int)),
            tuple(finished),
            self.evictions - evictions_before,
        )
        for fn in self._hooks:
            fn(info)
        return info

    def _info(self, num_steps, tokens, admitted, preempted, finished, evictions) -> StepInfo:
        totals = self.kv_cache_manager.prefix_cache_totals
        used = self.used_blocks()
        usable = self.block_pool.num_gpu_blocks - 1
        return StepInfo(
            self.step_count,
            num_steps,
            self.clock_ms,
            len(self.scheduler.running),
            self.scheduler.get_request_counts()[1],
            tokens,
            used,
            used / usable if usable else 0.0,
            admitted,
            preempted,
            finished,
            evictions,
            totals.queries,
            totals.hits,
        )

    def _point(self) -> None:
        """A series point if anything it shows changed since the last one."""
        totals = self.kv_cache_manager.prefix_cache_totals
        sched = self.scheduler
        values = (
            len(sched.running),
            sched.get_request_counts()[1],
            self.used_blocks(),
            totals.queries,
            totals.hits,
        )
        if values == self._last_point and not self.done:
            return
        self._last_point = values
        step, clock, running, waiting, used, queries, hits = self._series
        step.append(self.step_count)
        clock.append(self._clock_ns)
        running.append(values[0])
        waiting.append(values[1])
        used.append(values[2])
        queries.append(values[3])
        hits.append(values[4])

    # -- fast-forward -------------------------------------------------------------------
    def _fast_forward_steps(self, limit: int, until_ns: Optional[int] = None) -> int:
        """How many of the next steps (at most ``limit``) are pure decode into blocks already
        held, with nothing else able to happen; 0 when fast-forward does not apply. ``until_ns``
        (a replay given its requests): the next arrival its caller knows of; no step of the
        stretch starts at or after it."""
        s = self.settings
        sched = self.scheduler
        running = sched.running
        if (
            not s.fast_forward
            or limit <= 0
            or not running
            or self._last_changed
            or self._queued
            or not _fast_forward_allowed(self.block_pool.observer)
            or not self._all_full
            or sched.config.num_spec_tokens
            or sched.finished_req_ids
            or len(running) > sched.config.max_num_batched_tokens
        ):
            return 0
        # A waiting request refused in the last step (which changed nothing) is refused again
        # in each step of the stretch: the pool, the running set and the budget stay the same.
        kvm = self.kv_cache_manager
        bs = kvm.block_size
        caching = kvm.enable_caching
        max_len = self.max_model_len
        k = limit
        for req in running:
            n = req.num_tokens
            if req.num_computed_tokens != n - 1 or req.spec_token_ids:
                return 0
            rid = req.request_id
            k = min(
                k,
                num_blocks_held(kvm, rid) * bs - n + 1,  # steps before a new block is needed
                req.max_tokens - req.num_output_tokens - 1,  # steps before it finishes
                max_len - n - 1,
            )
            if caching:
                k = min(k, (num_cached_blocks(kvm, rid) + 1) * bs - n)  # before one fills
            if k <= 0:
                return 0
        if s.arrival == TIMESTAMPS and self._next < len(self.trace):
            until_ns = self._arrival_ns[self._next]
        if until_ns is not None:
            d = self._step_ns + self._token_ns * len(running)
            gap = until_ns - self._clock_ns
            if gap <= 0:
                return 0
            k = min(k, -(-gap // d))  # the steps that start before the arrival
        return max(k, 0)

    def _apply_fast_forward(self, k: int) -> None:
        running = self.scheduler.running
        tokens = [PLACEHOLDER_TOKEN] * k
        for req in running:
            req.append_output_token_ids(tokens)
            req.num_computed_tokens += k
        self.step_count += k
        self.fast_forwarded_steps += k
        self._kv_events = ()
        self._clock_ns += k * (self._step_ns + self._token_ns * len(running))
        if self._hooks:
            info = self._info(k, k * len(running), (), (), (), 0)
            for fn in self._hooks:
                fn(info)

    def step_until(self, until_ns: Optional[int] = None) -> None:
        """One step, or one exact fast-forwarded stretch in which no step starts at or after
        ``until_ns`` (a fleet's next arrival; None: no bound). ``kv_events()`` then holds what
        it published."""
        k = self._fast_forward_steps(1 << 62, until_ns)
        if k > 0:
            self._apply_fast_forward(k)
        else:
            self._step()

    def advance(
        self,
        until_step: Optional[int] = None,
        progress: Optional[Callable[[int, int], None]] = None,
    ) -> None:
        """Run until ``step_count`` reaches ``until_step`` (never past it) or every request
        finished, fast-forwarding where exact. ``progress(finished, total)`` is called now and
        then."""
        t0 = time.perf_counter()
        total = len(self.trace)
        last_report = -1
        try:
            while not self.done and (until_step is None or self.step_count < until_step):
                limit = (until_step - self.step_count) if until_step is not None else 1 << 62
                k = self._fast_forward_steps(limit)
                if k > 0:
                    self._apply_fast_forward(k)
                else:
                    self._step()
                if progress is not None and self.num_finished != last_report:
                    if self.num_finished - last_report >= 16 or self.done:
                        last_report = self.num_finished
                        progress(self.num_finished, total)
        finally:
            self._wall += time.perf_counter() - t0

    def upper_bound(self) -> list[int]:
        if self._upper is None:
            s = self.settings.engine
            if s.enable_prefix_caching:
                self._upper = upper_bound_hits(self.trace, s.block_size, s.max_cache_hit_length)
            else:
                self._upper = [0] * len(self.trace)
        return self._upper

    def request_result(self, i: int) -> RequestResult:
        """Trace request ``i``'s figures so far."""
        r = self.trace.requests[i]
        return RequestResult(
            r.request_id,
            r.input_length,
            r.output_length,
            r.arrival_ms,
            self.hit_tokens[i],
            self.admitted_step[i],
            self.finished_step[i],
            self.num_preemptions[i],
        )

    def outputs(self) -> dict[str, RequestResult]:
        """Per request taken so far, in the order taken, its figures (a model-free replay
        generates placeholder tokens: its output is what the pool did for the request)."""
        taken = range(self._next) if self.own_arrivals else self._taken
        return {self.trace.requests[i].request_id: self.request_result(i) for i in taken}

    def result(self) -> ReplayResult:
        totals = self.kv_cache_manager.prefix_cache_totals
        trace = self.trace
        per_request = tuple(self.request_result(i) for i in range(len(trace)))
        step, clock, running, waiting, used, queries, hits = self._series
        series = TimeSeries(
            tuple(step),
            tuple(c / 1e6 for c in clock),
            tuple(running),
            tuple(waiting),
            tuple(used),
            tuple(queries),
            tuple(hits),
            self.block_pool.num_gpu_blocks - 1,
        )
        return ReplayResult(
            trace=trace.name,
            format=trace.format,
            settings=self.settings.to_dict(),
            done=self.done,
            requests=len(trace),
            prompt_tokens=trace.prompt_tokens,
            output_tokens=trace.output_tokens,
            queries=totals.queries,
            hit_tokens=totals.hits,
            preempted_requests=totals.preempted_requests,
            preempted_queries=totals.preempted_queries,
            preempted_hits=totals.preempted_hits,
            evictions=self.evictions,
            preemptions=self.preemptions,
            steps=self.step_count,
            fast_forwarded_steps=self.fast_forwarded_steps,
            simulated_s=self._clock_ns / 1e9,
            wall_s=self._wall,
            upper_bound_hit_tokens=sum(self.upper_bound()),
            per_request=per_request,
            series=series,
        )


_DEEP = threading.Lock()
_DEEP_STACK = 1 << 29  # bytes of stack for the pickling thread (reserved, touched as used)


def _dumps_deep(obj: Any, num_blocks: int) -> bytes:
    """``pickle.dumps(obj)`` for a replay: a pool's free blocks are a doubly linked list, which
    pickle walks depth first, some levels per block. It runs in a thread of its own with the
    stack for that, the recursion limit raised meanwhile (one at a time)."""
    out: list[bytes] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            out.append(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
        except BaseException as e:  # handed to the caller's thread
            failed.append(e)

    with _DEEP:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 8 * num_blocks + 10_000))
        try:
            size = threading.stack_size(_DEEP_STACK)
            try:
                t = threading.Thread(target=work, name="replay-checkpoint")
                t.start()
            finally:
                threading.stack_size(size)
            t.join()
        finally:
            sys.setrecursionlimit(limit)
    if failed:
        raise failed[0]
    return out[0]


class Checkpoints:
    """A replay's whole state at some of its steps, so that a later question about step N
    resumes from the last one at or before N instead of replaying from step 0 (the Real
    workloads page's "open the player at this step").

    A checkpoint is taken after a step once the replay has run ``every_s`` seconds of wall time
    since the last one, and at least four times as long as taking that one took, so the run
    spends at most a fifth of its time on them and a resume replays at most about ``every_s``
    worth of steps (fewer: a resumed replay fast-forwards, a recorded run does not). They hold at
    most ``max_bytes`` (compressed): past it every other one goes and ``every_s`` doubles. What a
    resumed replay does next is what the replay it was taken from did (tests/lab/
    test_workloads_frames.py); only the observer and the step hooks are not in it, and its
    block hasher reads and fills the memo of the first replay checkpointed here
    (tokens.SharedBlockHasher.share_memo), so the prompts that arrive while it runs are hashed
    once for all of them.

    Invariant: ``steps`` grows, each checkpoint's ``step_count`` is its entry there."""

    def __init__(self, every_s: float = 0.25, max_bytes: int = 64 << 20) -> None:
        self.every_s = every_s
        self.max_bytes = max_bytes
        self._nbytes = 0
        self.steps: list[int] = []
        self._data: list[bytes] = []
        self._last: Optional[float] = None  # when the last checkpoint (or first call) was
        self._wait = every_s
        self._trace: Optional[Trace] = None
        self._settings: Optional[ReplaySettings] = None
        self._hasher: Optional[SharedBlockHasher] = None  # whose memo the resumed replays share
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def due(self, replay: "Replay") -> None:
        """The replay made a step (a step hook calls this): a checkpoint if one is due."""
        now = time.perf_counter()
        if self._last is None:
            self._last = now
        elif now - self._last >= self._wait and not replay.done:
            self.take(replay)
            took = time.perf_counter() - now
            self._wait = max(self.every_s, 4 * took)
            self._last = now + took

    def take(self, replay: "Replay") -> None:
        """A checkpoint of ``replay`` now (without its observer and step hooks)."""
        if self._trace is None:
            self._trace, self._settings = replay.trace, replay.settings
        if replay.trace is not self._trace or replay.settings != self._settings:
            raise ReplayError("checkpoints hold one replay's steps")
        if self._hasher is None:
            self._hasher = replay.hasher
        if self.steps and replay.step_count <= self.steps[-1]:
            return
        data = self._pack(replay)
        with self._lock:
            self.steps.append(replay.step_count)
            self._data.append(data)
            self._nbytes += len(data)
            while self._nbytes > self.max_bytes and len(self.steps) > 1:
                # every other one goes (the last stays), and they are taken half as often
                keep = [i for i in range(len(self.steps)) if i % 2 or i == len(self.steps) - 1]
                self.steps = [self.steps[i] for i in keep]
                self._data = [self._data[i] for i in keep]
                self._nbytes = sum(len(d) for d in self._data)
                self.every_s *= 2
                self._wait *= 2

    @staticmethod
    def _pack(replay: "Replay") -> bytes:
        """``replay`` pickled and compressed, without its observer, step hooks and trace."""
        pool = replay.block_pool
        observer, hooks, trace = pool.observer, replay._hooks, replay.trace
        pool.observer, replay._hooks, replay.trace = None, [], None
        try:
            return zlib.compress(_dumps_deep(replay, replay.block_pool.num_gpu_blocks), 1)
        finally:
            pool.observer, replay._hooks, replay.trace = observer, hooks, trace

    def fill(
        self,
        trace: Trace,
        settings: ReplaySettings,
        end_step: int,
        every_steps: int = 64,
        stop_point: Callable[[], None] = lambda: None,
    ) -> int:
        """More checkpoints of the same replay, between those taken while it ran: after it, so
        that from step 0 to ``end_step`` no stretch longer than ``every_steps`` has none (a
        window's replay then fast-forwards at most that many steps before it records). Each
        stretch is replayed from the checkpoint that starts it (from step 0 for the first);
        ``stop_point()`` runs between stretches. Stops before the checkpoints would pass
        ``max_bytes`` (the ones taken while the replay ran are kept whole). Returns the bytes
        added."""
        if self._trace is None:
            self._trace, self._settings = trace, settings
        if settings != self._settings or (trace is not self._trace and trace != self._trace):
            raise ReplayError("checkpoints hold one replay's steps")
        added = 0
        bounds = [0, *self.steps, end_step]
        for a, b in zip(bounds, bounds[1:]):
            if b - a <= every_steps:
                continue
            stop_point()
            r = self.resume(trace, settings, a) if a > 0 else None
            if r is None:
                r = Replay(self._trace, settings)
                if self._hasher is None:
                    self._hasher = r.hasher
                elif r.hasher is not None:
                    r.hasher.share_memo(self._hasher)
            while r.step_count + every_steps < b and not r.done:
                r.advance(until_step=r.step_count + every_steps)
                data = self._pack(r)
                with self._lock:
                    if self._nbytes + len(data) > self.max_bytes:
                        return added
                    i = bisect_right(self.steps, r.step_count)
                    if i and self.steps[i - 1] == r.step_count:
                        continue
                    self.steps.insert(i, r.step_count)
                    self._data.insert(i, data)
                    self._nbytes += len(data)
                added += len(data)
                stop_point()
        return added

    def resume(self, trace: Trace, settings: ReplaySettings, until_step: int) -> Optional["Replay"]:
        """A fresh replay of ``trace`` with ``settings`` at the last checkpoint at or before
        ``until_step``; None when there is none, or these are another replay's checkpoints. Its
        wall time counts from 0."""
        if self._trace is None or (trace is not self._trace and trace != self._trace):
            return None
        if settings != self._settings:
            return None
        with self._lock:
            i = bisect_right(self.steps, until_step) - 1
            if i < 0:
                return None
            data = self._data[i]
        r = pickle.loads(zlib.decompress(data))
        r.trace = self._trace
        r._wall = 0.0
        if r.hasher is not None and self._hasher is not None:
            r.hasher.share_memo(self._hasher)
        return r


def replay(
    trace: Trace,
    settings: ReplaySettings,
    progress: Optional[Callable[[int, int], None]] = None,
) -> ReplayResult:
    """The whole trace, replayed; its figures."""
    r = Replay(trace, settings)
    r.advance(progress=progress)
    return r.result()


__all__ = [
    "ARRIVALS",
    "SEQUENTIAL",
    "Checkpoints",
    "TIMESTAMPS",
    "Replay",
    "ReplayError",
    "ReplayResult",
    "ReplaySettings",
    "RequestResult",
    "StepInfo",
    "TimeSeries",
    "replay",
    "replay_settings",
    "upper_bound_hits",
]
