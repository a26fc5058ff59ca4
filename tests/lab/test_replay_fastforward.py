"""Fast-forward is exact: every figure, series point and block-level decision of a replay is the
same as stepping it one engine step at a time."""

from dataclasses import replace

import pytest

from kvcore.core.kv_cache_observer import KVCacheObserver
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.workloads.replay import Replay, replay_settings
from paged_kv_lab.workloads.trace_formats import load_trace
from support.paths import FIXTURES

SLICE = FIXTURES / "traces" / "mooncake_slice.jsonl"
TIGHT = {"max_num_seqs": 8, "admission": "first_chunk", "max_num_batched_tokens": 2048}
CASES = {
    "sequential, block 16": ({"block_size": 16, "num_gpu_blocks": 4500}, "sequential"),
    "timestamps, block 16, preempting": (
        {"block_size": 16, "num_gpu_blocks": 4200, **TIGHT},
        "timestamps",
    ),
    "timestamps, block 512, waiting for blocks": (
        {"block_size": 512, "num_gpu_blocks": 140, "max_num_seqs": 8},
        "timestamps",
    ),
}


class OpLog(KVCacheObserver):
    """Hears every block-level decision (which skipped steps cannot have) and every decision
    about a request except the per-step ones a decode stretch repeats: "scheduled" (one decode
    token each) and a waiting request's refusal ("blocked", and the lookup that preceded it)."""

    allows_fast_forward = True

    def __init__(self, run: Replay) -> None:
        self.run = run
        self.log = []
        self.lookup = None

    def _at(self, *what):
        if self.lookup is not None:
            self.log.append(self.lookup)
            self.lookup = None
        self.log.append((self.run.step_count, *what))

    def on_blocks_allocated(self, blocks):
        self._at("alloc", tuple(b.block_id for b in blocks))

    def on_block_evicted(self, block):
        self._at("evict", block.block_id)

    def on_blocks_touched(self, blocks):
        self._at("touch", tuple(b.block_id for b in blocks))

    def on_blocks_freed(self, ordered, to_head, to_tail):
        self._at("free", tuple(b.block_id for b in ordered), len(to_head))

    def on_blocks_cached(self, request, blocks, block_size):
        self._at("cache", request.request_id, tuple(b.block_id for b in blocks))

    def on_prefix_cache_reset(self, ok, num_used):
        self._at("reset", ok)

    def on_decision(self, kind, request_id, **fields):
        if kind == "blocked":
            if self.lookup is not None and self.lookup[2] == request_id:
                self.lookup = None
        elif kind in ("cache_hit", "cache_miss"):
            self._at()
            self.log.pop()
            self.lookup = (self.run.step_count, kind, request_id, tuple(sorted(fields.items())))
        elif kind != "scheduled":
            self._at(kind, request_id, tuple(sorted(fields.items())))


def _run(settings):
    run = Replay(load_trace(SLICE), settings)
    ops = OpLog(run)
    run.block_pool.observer = ops
    run.advance()
    ops._at()
    return run.result(), ops.log


@pytest.mark.parametrize("case", list(CASES))
def test_fast_forward_changes_nothing(case):
    overrides, arrival = CASES[case]
    settings = replay_settings(load_trace(SLICE), overrides, arrival=arrival)
    fast, fast_ops = _run(settings)
    slow, slow_ops = _run(replace(settings, fast_forward=False))
    assert fast.fast_forwarded_steps > fast.steps // 4  # it did skip a good part
    assert slow.fast_forwarded_steps == 0
    assert fast_ops == slow_ops
    d_fast, d_slow = fast.to_dict(series_points=None), slow.to_dict(series_points=None)
    for d in (d_fast, d_slow):
        del d["wall_s"], d["fast_forwarded_steps"], d["settings"]["fast_forward"]
    assert d_fast == d_slow


def test_advance_stops_exactly_where_asked_and_matches_stepping():
    trace = load_trace(SLICE)
    settings = replay_settings(
        trace, CASES["timestamps, block 16, preempting"][0], arrival="timestamps"
    )
    a, b = Replay(trace, settings), Replay(trace, replace(settings, fast_forward=False))
    for target in (37, 120, 121, 400):
        a.advance(until_step=target)
        while b.step_count < target:
            b.step()
        assert a.step_count == b.step_count == target
        assert a.clock_ms == b.clock_ms
        state = [
            {
                rid: (r.num_computed_tokens, r.num_tokens, list(r.block_hashes))
                for rid, r in run.requests.items()
            }
            for run in (a, b)
        ]
        assert state[0] == state[1]
        assert [b.block_id for b in a.block_pool.free_block_queue.get_all_free_blocks()] == [
            b.block_id for b in b.block_pool.free_block_queue.get_all_free_blocks()
        ]


def test_a_recorder_turns_fast_forward_off():
    trace = load_trace(SLICE).slice(0, 6)
    run = Replay(trace, replay_settings(trace, {"block_size": 512, "num_gpu_blocks": 400}))
    run.advance(until_step=50)
    skipped = run.fast_forwarded_steps
    assert skipped > 0
    recorder = run.attach(Recorder())
    info = run.step()
    assert info.num_steps == 1 and recorder.events  # every step is recorded now
    run.advance(until_step=200)
    assert run.fast_forwarded_steps == skipped
