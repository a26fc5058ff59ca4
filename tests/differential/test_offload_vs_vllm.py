"""The CPU tier against vLLM 0.34.0's own SimpleCPUOffloadScheduler (bench/offload_vs_vllm.py): a
few random traces replayed on vLLM's KVCacheManager and offloading manager with a fake worker, as
vLLM's own tests drive it; per step both sides agree on the lookups (GPU and CPU hit tokens), the
blocks stored and loaded, the block tables and both free queues, and after a failed load on the
requests cut back and the blocks given to ``evict_blocks`` (vLLM's own
``Scheduler._handle_invalid_blocks`` deciding on its side). Needs the scratch environment with
the real vllm==0.34.0 (``bash scripts/vllm_env.sh``; ``VLLM_VENV``, default /tmp/vllm034-venv); the
figures over 200 traces are in docs/cpu-offload.md."""

import os
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import offload_vs_vllm  # noqa: E402

VENV = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_random_traces_store_find_and_load_the_blocks_vllm_does():
    # 9 and 11: lazy mode; 0: synchronous failures evicted under "fail"; 4, 5: asynchronous ones
    # failing their requests; 8, 19: asynchronous ones recomputed
    res = offload_vs_vllm.differential(VENV, [*range(6), 8, 9, 11, 19])
    assert not res["failures"], res["failures"]
    for aspect, t in res["aspects"].items():
        assert t["steps"] > 100 and t["differ"] == 0, aspect
    ex = res["exercised"]
    # the traces really store, find and load (else agreeing would prove little)
    assert ex["blocks_stored"] > 50 and ex["blocks_loaded"] > 5 and ex["cpu_hit_tokens"] > 0
    assert ex["lazy_traces"] > 0
    assert ex["evict_blocks_calls"] > 0 and ex["requests_failed"] > 0
    assert ex["requests_rolled_back"] - ex["requests_failed"] > 3  # recomputed


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_an_asynchronous_load_is_held_back_where_vllm_holds_it_back():
    # the two traces that once never finished here
    # (tests/kvcore/test_offload_inflight_reservation.py):
    # vLLM's side computes its own reserved_blocks and refuses or admits each load by itself
    res = offload_vs_vllm.differential(VENV, [468023023, 536961063])
    assert not res["failures"], res["failures"]
    for aspect, t in res["aspects"].items():
        assert t["steps"] >= 30 and t["differ"] == 0, aspect
    assert res["exercised"]["blocks_loaded"] > 0


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_a_request_no_pool_can_finish_is_aborted_and_the_rest_run_as_vllm():
    # in each, a 12-token prompt with 4 answer tokens needs 8 blocks of 2 and the pool has 7: once
    # preempted it is refused at every step while the lazy tier keeps storing; the engine aborts
    # it as never fitting (both traces once waited past the harness's 500 steps), and vLLM's
    # side, told of the abort, agrees at every step
    res = offload_vs_vllm.differential(VENV, [316581130, 14539304])
    assert not res["failures"], res["failures"]
    for aspect, t in res["aspects"].items():
        assert 30 <= t["steps"] < 100 and t["differ"] == 0, aspect


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_vllms_own_scheduler_decides_as_kvcore_and_stalls_where_it_stalls():
    """vLLM 0.34.0's own ``Scheduler.schedule()`` and ``update_from_output()`` (its
    SimpleCPUOffloadConnector, scheduler role) against kvcore's Engine on the same traces, each
    deciding by itself: per step the three waiting queues in order, the admissions, the tokens
    scheduled, every request's status, computed tokens and block table, and who finished.
    Trace 19: a request whose load failed with no valid block stays in kv_holding_waiting, its
    new load refused, ahead of a request whose load landed; vLLM 0.34.0 stalls there too, and
    both sides name the same no-progress state (never an endless loop: the harness stops after
    ``STALL_STEPS`` quiet steps)."""
    # 19: the stall; 8: an asynchronous load recomputed; 4, 5: loads failing their requests;
    # 9, 11: lazy mode; 468023023, 536961063: loads held back by the reservations
    seeds = [19, 8, 4, 5, 9, 11, 468023023, 536961063]
    res = offload_vs_vllm.scheduler_differential(VENV, seeds)
    assert not res["failures"], res["failures"]
    by_seed = {t["seed"]: t for t in res["traces"]}
    stalled = by_seed[19]["stalled"]
    assert stalled is not None, "vLLM's Scheduler finished trace 19"
    assert stalled["queues"]["kv_holding_waiting"] == ["R3", "R5"]
    assert stalled["waiting_for_remote_kvs"] == ["R5"]
    assert [s for s, t in by_seed.items() if t["stalled"]] == [19]
    assert res["steps"] > 150
