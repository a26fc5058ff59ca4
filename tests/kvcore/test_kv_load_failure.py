"""A KV connector's failed load (vLLM 0.33's ``KVConnectorOutput.invalid_block_ids``): the scheduler
cuts the requests holding the failed blocks back to their valid prefix (``_handle_invalid_blocks``),
then recomputes or fails them by ``kv_load_failure_policy``; a synchronous load's blocks, already
cached, leave the prefix cache through ``evict_blocks`` under "fail". The CPU tier's loads are
asynchronous, so its failures never evict; a failed load is made on purpose with
``engine.cpu_offload.fail_loads``."""

from __future__ import annotations

import pytest

from kvcore.config.scheduler import SchedulerConfig
from kvcore.core.sched.scheduler import Scheduler
from kvcore.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from kvcore.outputs import KVConnectorOutput, ModelRunnerOutput
from kvcore.request import RequestStatus
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import (
    CPUOffloadConfig,
    EngineSettings,
    RequestSpec,
    Scenario,
    ScenarioError,
    load_scenario,
)
from support.kv import events_of, make_engine, make_manager, make_request, spec
from support.models import TIER_P, eos_of, reference_tokens


def evict_then_return(policy: str, fail_loads=("C",)):
    """A's blocks are stored to the CPU, B evicts them from a 7-block GPU pool, C asks for A's
    prompt again: a 4-token GPU hit, then 8 tokens loaded from the CPU."""
    return make_engine(
        [
            spec("A", range(16), max_tokens=3),
            spec("B", range(100, 116), max_tokens=3, arrival_step=4),
            spec("C", range(16), max_tokens=3, arrival_step=8),
        ],
        block_size=4,
        num_gpu_blocks=7,
        cpu_offload=CPUOffloadConfig(
            num_cpu_blocks=12, fail_loads=tuple(fail_loads), kv_load_failure_policy=policy
        ),
    )


def step_of(records, event) -> int:
    return next(r.step for r in records if any(e is event for e in r.events))


def test_a_failed_cpu_load_cuts_the_request_back_and_it_recomputes():
    good = evict_then_return("recompute", fail_loads=())
    good_recs = good.run()
    eng = evict_then_return("recompute")
    recs = eng.run()
    (load,) = events_of(recs, "cpu_load", "C")
    (failed,) = events_of(recs, "kv_load_failed", "C")
    # the worker reported the load's GPU blocks invalid in the step it issued the copy
    assert step_of(recs, failed) == step_of(recs, load)
    assert failed.block_ids == load.block_ids and failed.asynchronous
    assert (failed.num_computed_tokens, failed.num_lost_tokens, failed.policy) == (
        4,
        8,
        "recompute",
    )
    (loaded,) = events_of(recs, "cpu_loaded", "C")
    assert loaded.load_failed and loaded.num_computed_tokens == 4
    # nothing was copied, and an asynchronous load's blocks are never evicted by id
    assert eng.engine_core.kv_connector.worker_handler.num_blocks_loaded == 0
    assert not [e for e in events_of(recs, "evicted") if e.reason == "evict_blocks"]
    # C computes the 12 tokens after its GPU hit itself, then decodes as in the run without failure
    (sched, *_) = events_of(recs, "scheduled", "C")
    assert (sched.start, sched.num_tokens) == (4, 12)
    (good_sched, *_) = events_of(good_recs, "scheduled", "C")
    assert (good_sched.start, good_sched.num_tokens) == (12, 4)
    assert eng.outputs()["C"]["token_ids"] == good.outputs()["C"]["token_ids"]
    assert eng.outputs()["C"]["finish_reason"] == "finished_length"


def test_under_fail_the_request_ends_with_an_error_and_its_blocks_go_back():
    eng = evict_then_return("fail")
    recs = eng.run()
    (failed,) = events_of(recs, "kv_load_failed", "C")
    (finished,) = events_of(recs, "finished", "C")
    assert finished.reason == "error" and step_of(recs, finished) == step_of(recs, failed)
    assert eng.outputs()["C"] == {"token_ids": [], "text": "", "finish_reason": "finished_error"}
    assert not [e for e in events_of(recs, "evicted") if e.reason == "evict_blocks"]
    pool = eng.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1  # all back but the null block


def test_a_load_that_leaves_no_valid_block_frees_them_and_looks_up_again():
    """D's whole prefix is on the CPU: cut back to 0, its blocks go back, and the retry finds the
    copies on the CPU again and loads them (only the first load of a listed request fails)."""
    eng = make_engine(
        [
            spec("A", range(16), max_tokens=3),
            spec("B", range(100, 128), max_tokens=3, arrival_step=4),
            spec("D", range(16), max_tokens=3, arrival_step=9),
        ],
        block_size=4,
        num_gpu_blocks=9,
        cpu_offload=CPUOffloadConfig(
            num_cpu_blocks=16, fail_loads=("D",), kv_load_failure_policy="recompute"
        ),
    )
    recs = eng.run()
    (failed,) = events_of(recs, "kv_load_failed", "D")
    assert failed.num_computed_tokens == 0 and failed.num_lost_tokens == 12
    freed = [e for e in events_of(recs, "freed", "D") if e.reason == "load failed"]
    assert freed and set(freed[0].block_ids) == set(failed.block_ids)
    loads = events_of(recs, "cpu_load", "D")
    assert len(loads) == 2 and [e.load_failed for e in events_of(recs, "cpu_loaded", "D")] == [
        True,
        False,
    ]
    assert eng.engine_core.kv_connector.worker_handler.num_blocks_loaded == len(loads[1].block_ids)


class SyncConnector(KVConnectorBase_V1):
    """A connector whose loads are synchronous (as vLLM's example connectors are): it offers the
    8 tokens after the GPU hit of a request's first lookup, loaded while the request runs."""

    def __init__(self) -> None:
        super().__init__(KVConnectorRole.SCHEDULER)
        self.offered: set[str] = set()

    def bind_gpu_block_pool(self, pool) -> None:
        pass

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if request.request_id in self.offered:
            return 0, False
        self.offered.add(request.request_id)
        return 8, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens) -> None:
        pass

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished_all_groups(self, request, block_ids):
        return False, None

    def has_pending_push_work(self) -> bool:
        return False

    def start_load_kv(self, forward_context=None, **kwargs) -> None:
        pass

    def wait_for_save(self) -> None:
        pass


def sync_load(policy: str):
    """S (16 tokens, blocks of 4) is admitted with 8 external tokens, its blocks cached at once;
    the worker then reports S's second block invalid."""
    rec = Recorder()
    kvm = make_manager(10, 4, recorder=rec)
    sched = Scheduler(SchedulerConfig(), kvm, SyncConnector(), kv_load_failure_policy=policy)
    req = make_request("S", range(16), 4, max_tokens=3)
    sched.add_request(req)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"S": 8}  # the other 8 come from the connector
    table = list(kvm.get_block_ids("S")[0])
    pool = kvm.block_pool
    assert all(pool.blocks[b].block_hash is not None for b in table)
    rec.events.clear()
    runner_out = ModelRunnerOutput(
        ["S"], {"S": 0}, [[7]], KVConnectorOutput(invalid_block_ids={table[1]})
    )
    finished = sched.update_from_output(out, runner_out)
    return sched, req, table, pool, rec.events, finished


def test_a_failed_synchronous_load_evicts_the_blocks_from_the_first_failed_one_under_fail():
    sched, req, table, pool, evs, finished = sync_load("fail")
    evicted = [e for e in evs if e.kind == "evicted"]
    assert {e.block_ids[0] for e in evicted} == set(table[1:])
    assert {e.reason for e in evicted} == {"evict_blocks"}
    assert pool.blocks[table[0]].block_hash is not None  # the block before it stays cached
    (failed,) = [e for e in evs if e.kind == "kv_load_failed"]
    assert not failed.asynchronous and failed.num_computed_tokens == 4
    assert finished == ["S"] and req.status == RequestStatus.FINISHED_ERROR
    assert req.output_token_ids == []  # the step's token came from bad K/V: dropped


def test_a_failed_synchronous_load_under_recompute_keeps_the_hashes_and_rewrites_in_place():
    sched, req, table, pool, evs, finished = sync_load("recompute")
    assert not [e for e in evs if e.kind == "evicted"]
    assert all(pool.blocks[b].block_hash is not None for b in table)
    assert finished == [] and req.status == RequestStatus.RUNNING
    assert req.num_computed_tokens == 4 and req.output_token_ids == []
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"S": 12}
    assert list(sched.kv_cache_manager.get_block_ids("S")[0]) == table  # the same blocks


def test_invalid_blocks_no_request_holds_change_nothing():
    sched, req, table, pool, evs, finished = sync_load("fail")
    spare = next(b.block_id for b in pool.blocks if b.block_id and b.block_id not in table)
    out = sched.schedule()
    assert (
        sched.update_from_output(
            out, ModelRunnerOutput([], {}, [], KVConnectorOutput(invalid_block_ids={spare}))
        )
        == []
    )


def test_the_policy_and_the_failing_requests_are_checked_by_name():
    base = {
        "engine": {"block_size": 4, "cpu_offload": {"num_cpu_blocks": 8}},
        "requests": [{"id": "A", "prompt_token_ids": [1, 2, 3], "max_tokens": 1}],
    }
    for offload, words in (
        (
            {"fail_loads": ["Z"]},
            "engine.cpu_offload.fail_loads[0]: no request runs with the id 'Z'",
        ),
        ({"kv_load_failure_policy": "retry"}, "engine.cpu_offload.kv_load_failure_policy"),
        ({"fail_loads": "A"}, "engine.cpu_offload.fail_loads"),
    ):
        d = {**base, "engine": {**base["engine"], "cpu_offload": {"num_cpu_blocks": 8, **offload}}}
        with pytest.raises(ScenarioError) as err:
            load_scenario(d)
        assert words in str(err.value), str(err.value)
    with pytest.raises(ValueError, match="kv_load_failure_policy"):
        Scheduler(SchedulerConfig(), make_manager(4, 4), kv_load_failure_policy="retry")


@pytest.mark.usefixtures("one_torch_thread")
def test_outputs_equal_transformers_after_a_failed_load_is_recomputed(loaded):
    """C's copy from the CPU fails: its GPU blocks keep whatever K/V they held before, so only
    recomputing them (not reading them) can give transformers' tokens. Eight GPU blocks, so C
    keeps a valid prefix (its GPU hit): with seven it keeps none, looks itself up again and, as
    in vLLM 0.33, its retried load must leave its own whole sequence free too, which seven blocks
    cannot (tests/kvcore/test_offload_inflight_reservation.py)."""
    P = TIER_P
    reqs = [
        RequestSpec(id="A", prompt_token_ids=tuple(P[:17]), max_tokens=4),
        RequestSpec(id="B", prompt_token_ids=tuple(P[::-1][:17]), max_tokens=4, arrival_step=6),
        RequestSpec(id="C", prompt_token_ids=tuple(P[:16] + [5, 6]), max_tokens=4, arrival_step=12),
    ]
    tier = CPUOffloadConfig(
        num_cpu_blocks=12, fail_loads=("C",), kv_load_failure_policy="recompute"
    )
    sc = Scenario(
        model=loaded.name,
        device=loaded.device.type,
        engine=EngineSettings(block_size=4, num_gpu_blocks=8, cpu_offload=tier),
        requests=tuple(reqs),
    )
    eng = Engine(sc, model=loaded, debug=True)
    recs = eng.run()
    (failed,) = events_of(recs, "kv_load_failed", "C")
    assert failed.num_lost_tokens >= 8
    outs = eng.outputs()
    for r in reqs:
        want = reference_tokens(
            loaded.model, list(r.prompt_token_ids), r.max_tokens, eos_of(loaded)
        )
        assert outs[r.id]["token_ids"] == want, f"request {r.id} differs from transformers"
