"""kvcore's one observer interface (kvcore/core/kv_cache_observer.py): who calls which hook,
when, with what; and that recording replaces no method of the objects it observes."""

from __future__ import annotations

import inspect

import pytest

from kvcore.core.kv_cache_observer import (
    FREE_ABORTED,
    FREE_FINISHED,
    FREE_LOAD_FAILED,
    FREE_PREEMPTED,
    KVCacheObserver,
    free_reason,
)
from kvcore.request import RequestStatus
from paged_kv_lab.run.scenario import CPUOffloadConfig
from support.kv import admit, make_engine, make_manager, make_request, spec
from support.paths import FIXTURES


class CallLog(KVCacheObserver):
    """Writes down every call it hears, blocks as their ids."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_request_begin(self, request_id, group, reason=None):
        self.calls.append(("begin", request_id, group, reason))

    def on_request_end(self):
        self.calls.append(("end",))

    def on_blocks_allocated(self, blocks):
        self.calls.append(("allocated", [b.block_id for b in blocks]))

    def on_block_evicted(self, block):
        self.calls.append(("evicted", block.block_id, block.block_hash is not None))

    def on_blocks_touched(self, blocks):
        self.calls.append(("touched", [b.block_id for b in blocks], [b.ref_cnt for b in blocks]))

    def on_blocks_freed(self, blocks, to_head, to_tail):
        self.calls.append(
            (
                "freed",
                [b.block_id for b in blocks],
                [b.block_id for b in to_head],
                [b.block_id for b in to_tail],
            )
        )

    def on_blocks_cached(self, request, blocks, block_size):
        self.calls.append(("cached", request.request_id, [b.block_id for b in blocks], block_size))

    def on_prefix_cache_reset(self, ok, blocks_in_use):
        self.calls.append(("reset", ok, blocks_in_use))

    def on_decision(self, kind, request_id, **fields):
        self.calls.append(("decision", kind, request_id))


def test_the_default_hooks_do_nothing_and_kvcore_runs_the_same_with_them():
    """A bare KVCacheObserver (every hook the no-op default) on both attachment points changes
    no block decision: the same tables and the same free queue as with none."""

    def run(observe: bool):
        kvm = make_manager(6, 2)
        if observe:
            kvm.block_pool.observer = KVCacheObserver()
            kvm.block_pool.metrics_collector = KVCacheObserver()
        a = make_request("A", range(6), 2)
        admit(kvm, a)
        kvm.cache_blocks(a, 6)
        a.status = RequestStatus.FINISHED_STOPPED
        kvm.free(a)
        b = make_request("B", [0, 1, 2, 3, 9, 9, 9, 9], 2)
        admit(kvm, b)
        pool = kvm.block_pool
        return kvm.get_block_ids("B"), [
            x.block_id for x in pool.free_block_queue.get_all_free_blocks()
        ]

    assert run(True) == run(False)


def _a_then_b(observe):
    """A (6 tokens) runs and finishes, then B hits A's first two blocks and takes three new
    ones, the last of them A's third block, evicted (a pool of 5 usable blocks of 2 tokens)."""
    kvm = make_manager(6, 2)
    log = CallLog()
    observe(kvm.block_pool, log)
    a = make_request("A", range(6), 2)
    admit(kvm, a)
    kvm.cache_blocks(a, 6)
    a.status = RequestStatus.FINISHED_STOPPED
    kvm.free(a)
    at_b = len(log.calls)
    b = make_request("B", [0, 1, 2, 3, 7, 7, 7, 7, 7], 2)
    admit(kvm, b)
    return kvm, b, log.calls[:at_b], log.calls[at_b:], log


def test_the_observer_hears_each_pool_call_inside_the_scope_of_the_request_it_serves():
    """Each pool hook comes once per pool call, inside a scope naming request and group; a
    free's scope carries the reason the request's status gives; a hit is reported before the
    touch (ref_cnt still 0) and an eviction before the allocation that caused it, while the
    block still carries its hash."""
    _, _, for_a, for_b, _ = _a_then_b(lambda pool, log: setattr(pool, "observer", log))
    assert for_a == [
        ("decision", "cache_miss", "A"),
        ("begin", "A", 0, None),
        ("allocated", [1, 2, 3]),
        ("end",),
        ("cached", "A", [1, 2, 3], 2),
        ("begin", "A", None, FREE_FINISHED),
        ("begin", "A", 0, None),
        ("freed", [3, 2, 1], [], [3, 2, 1]),
        ("end",),
        ("end",),
    ]
    assert for_b == [
        ("decision", "cache_hit", "B"),
        ("begin", "B", 0, None),
        ("touched", [1, 2], [0, 0]),
        ("end",),
        ("begin", "B", 0, None),
        ("evicted", 3, True),
        ("allocated", [4, 5, 3]),
        ("end",),
        ("cached", "B", [4, 5], 2),  # allocate_slots caches what is full (vLLM does)
    ]


def test_scopes_nest_and_every_begin_is_ended():
    """Over an engine run with the CPU tier (its own scopes for the blocks it pins), the
    scopes opened on the pool's observer are all closed again by the end of every step."""

    class Depth(KVCacheObserver):
        def __init__(self):
            self.open = self.deepest = 0

        def on_request_begin(self, request_id, group, reason=None):
            self.open += 1
            self.deepest = max(self.deepest, self.open)

        def on_request_end(self):
            self.open -= 1
            assert self.open >= 0

    eng = make_engine(
        [
            spec("A", range(16), max_tokens=3),
            spec("C", [*range(16), 99], max_tokens=2, arrival_step=6),
        ],
        block_size=4,
        num_gpu_blocks=7,
        cpu_offload=CPUOffloadConfig(num_cpu_blocks=7),
        debug=False,
    )
    d = Depth()
    eng.kv_cache_manager.block_pool.observer = d
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
        assert d.open == 0, steps
    assert steps > 3 and d.deepest == 2  # KVCacheManager.free's scope around a group's


def test_the_metrics_collector_hears_only_the_pools_own_hooks():
    """The collector (vLLM's place for counters) hears allocation, touch, eviction and reset,
    never a scope, a decision, a free or a caching: a counter there costs the managers and the
    scheduler nothing (the pool's observer stays None)."""
    kvm, b, for_a, for_b, log = _a_then_b(lambda pool, log: setattr(pool, "metrics_collector", log))
    assert kvm.block_pool.observer is None
    assert for_a == [("allocated", [1, 2, 3])]
    assert for_b == [("touched", [1, 2], [0, 0]), ("evicted", 3, True), ("allocated", [4, 5, 3])]
    b.status = RequestStatus.FINISHED_ABORTED
    kvm.free(b)
    assert kvm.reset_prefix_cache()
    assert log.calls[-1] == ("reset", True, 0)


@pytest.mark.parametrize(
    "status, reason",
    [
        (RequestStatus.RUNNING, FREE_PREEMPTED),
        (RequestStatus.FINISHED_STOPPED, FREE_FINISHED),
        (RequestStatus.FINISHED_LENGTH_CAPPED, FREE_FINISHED),
        (RequestStatus.FINISHED_ABORTED, FREE_ABORTED),
        (RequestStatus.FINISHED_ERROR, FREE_ABORTED),
        (RequestStatus.WAITING_FOR_REMOTE_KVS, FREE_LOAD_FAILED),
        (RequestStatus.WAITING, FREE_FINISHED),
    ],
)
def test_a_frees_reason_is_read_from_the_requests_status_at_the_call(status, reason):
    req = make_request("A", range(4), 2)
    req.status = status
    assert free_reason(req) == reason


def test_recording_replaces_no_method_of_what_it_observes():
    """After whole recorded runs (the engine's Recorder, the CPU tier's connector), every method
    of the pool, the managers, the coordinator, the KV cache manager, the scheduler and the
    connector is still the class's own function: nothing was wrapped on an instance."""
    eng = make_engine(
        [
            spec("A", range(16), max_tokens=3),
            spec("C", [*range(16), 99], max_tokens=2, arrival_step=6),
        ],
        block_size=4,
        num_gpu_blocks=7,
        cpu_offload=CPUOffloadConfig(num_cpu_blocks=7),
    )
    eng.run()
    kvm = eng.kv_cache_manager
    manager = eng.kv_connector.scheduler_manager
    observed = [
        kvm,
        kvm.block_pool,
        kvm.coordinator,
        *kvm.coordinator.single_type_managers,
        eng.scheduler,
        manager,
        manager.cpu_block_pool,
        *manager.cpu_coordinator.single_type_managers,
    ]
    assert kvm.block_pool.observer is eng.recorder
    checked = 0
    for obj in observed:
        for name, fn in inspect.getmembers(type(obj), inspect.isfunction):
            assert name not in vars(obj), (type(obj).__name__, name)
            bound = getattr(obj, name)  # a static method comes back as the function itself
            assert getattr(bound, "__func__", bound) is fn, (type(obj).__name__, name)
            checked += 1
    assert checked > 50


def test_the_replays_eviction_count_is_a_metrics_collector_beside_any_observer():
    """The replay counts evictions in the pool's metrics collector, patching no pool method, so
    an observer set on the pool (as the workloads page sets its CacheLog) leaves the count whole:
    it equals the evictions that observer heard."""

    from paged_kv_lab.workloads.replay import EvictionCounter, Replay, replay_settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    trace = load_trace(FIXTURES / "traces" / "mooncake_slice.jsonl")
    run = Replay(trace, replay_settings(trace, {"block_size": 16, "num_gpu_blocks": 4500}))

    class Evictions(KVCacheObserver):
        allows_fast_forward = True
        heard = 0

        def on_block_evicted(self, block):
            self.heard += 1

    seen = Evictions()
    run.block_pool.observer = seen
    run.advance()
    assert isinstance(run.block_pool.metrics_collector, EvictionCounter)
    assert "_maybe_evict_cached_block" not in vars(run.block_pool)
    assert run.evictions == seen.heard > 0
    assert run.result().evictions == run.evictions
