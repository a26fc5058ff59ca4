"""Two CPU-tier traces that once never finished on our side (issue 36): trace seeds 468023023 and
536961063 of ``bench/offload_vs_vllm.py`` (``--traces 1 --seed S``). In 468023023 R2's
asynchronous load (2 of the 4 blocks it needs) and then R3's (4 of its 5) were both admitted in
step 9 of an 8-block pool; from step 10 R2, its load done, led the waiting requests needing two
more blocks while R3, its load done too, held the blocks behind it: one free block, nothing
running, nothing to preempt. vLLM 0.33's Scheduler never admits R3 there: an asynchronous load
passes ``reserved_blocks`` = ``_inflight_prefill_reserved_blocks()`` (the blocks the requests in
``_inflight_prefills`` still need; R2, loading, needs 2) to ``allocate_slots``, which refuses
4 blocks out of 5 free less 2 reserved. Replaying our old schedule on vLLM's side stopped there
with "vLLM refused R3 where ours admitted it". kvcore now keeps ``_inflight_prefills`` and the
reservation as vLLM does; these run our side alone (no vLLM needed), with what vLLM decided
written in; tests/differential/test_offload_vs_vllm.py replays both traces on vLLM's side."""

import sys

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import offload_vs_vllm  # noqa: E402


def refused(step: dict) -> list[str]:
    return [rid for act, rid, n in step["actions"] if act == "admit" and n is None]


def loading(step: dict) -> list[str]:
    return [rid for act, rid, n in step["actions"] if act == "admit" and n == 0]


@pytest.mark.parametrize(
    "seed, step, loads, held_back",
    [
        # R2's load is in flight (it needs 2 more blocks): R3 (4 blocks now, 5 in all) waits
        (468023023, 9, ["R2"], "R3"),
        # R5's load is in flight: R6's load waits until R5 has run
        (536961063, 12, ["R5"], "R6"),
    ],
)
def test_an_asynchronous_load_leaves_free_the_blocks_a_load_in_flight_still_needs(
    seed, step, loads, held_back
):
    case = offload_vs_vllm.random_case(seed)
    assert case["num_gpu_blocks"] == 8 and case["max_num_seqs"] == 2
    script, seen = offload_vs_vllm.our_run(case)  # asserts that the trace finishes
    s = script[step - 1]
    assert loading(s) == loads and held_back in refused(s)
    # it was looked up and found on the CPU: only the reservation keeps it out
    assert any(rid == held_back and ext > 0 for rid, _, ext in seen[step - 1]["lookups"])
    # the next step the load that went ahead runs, and the held-back request loads later
    assert any(
        act in ("resume", "continue") and rid == loads[0] for act, rid, _ in script[step]["actions"]
    )
    assert any(held_back in loading(x) for x in script[step:])
    assert sorted(sum((x["finished"] for x in script), [])) == sorted(
        r["id"] for r in case["requests"]
    )


def test_the_refusal_names_the_reserved_blocks():
    from paged_kv_lab.recording import events
    from paged_kv_lab.run.engine import Engine, NoModelRunner

    # up to step 9 the trace reports no synchronous failure: the scenario alone replays it
    eng = Engine(
        offload_vs_vllm.scenario(offload_vs_vllm.random_case(468023023)),
        runner=NoModelRunner(),
        debug=True,
    )
    recs = [eng.step() for _ in range(9)]
    blocked = [e for e in recs[8].events if e.kind == events.BLOCKED and e.request_id == "R3"]
    assert [e.reason for e in blocked] == ["reserved_blocks"]
    # R2 holds 2 of the 4 blocks its 7 tokens need; 5 are free, R3 asks for 4 of them
    assert blocked[0].num_reserved_blocks == 2 and blocked[0].num_free_blocks == 5


def test_a_retried_load_reserves_its_own_blocks_as_in_vllm():
    """vLLM 0.33 keeps a request whose asynchronous load failed in ``_inflight_prefills``
    (``_update_waiting_for_remote_kv`` frees its blocks under "recompute" but leaves the set
    alone), so when it is looked up again and loads again, the blocks it reserves include its
    own whole sequence. C (18 tokens: 5 blocks) loses its whole hit in a 7-block pool; its retry
    needs its 4 load blocks with 5 more kept free, never there: vLLM would leave it waiting, the
    lab's idle engine aborts it as never fitting."""
    from paged_kv_lab.run.scenario import CPUOffloadConfig
    from support.kv import events_of, make_engine, spec

    p = [17, 254, 1033, 88, 4012, 7, 391, 2290, 56, 1777, 640, 12, 9001, 345, 78, 2048, 31, 4444]
    eng = make_engine(
        [
            spec("A", p[:17], max_tokens=4),
            spec("B", p[::-1][:17], max_tokens=4, arrival_step=6),
            spec("C", p[:16] + [5, 6], max_tokens=4, arrival_step=12),
        ],
        block_size=4,
        num_gpu_blocks=7,
        cpu_offload=CPUOffloadConfig(
            num_cpu_blocks=12, fail_loads=("C",), kv_load_failure_policy="recompute"
        ),
    )
    recs = eng.run()
    (failed,) = events_of(recs, "kv_load_failed", "C")
    assert failed.num_computed_tokens == 0  # nothing kept: C is looked up again
    retry = [e for e in events_of(recs, "blocked", "C") if e.reason == "reserved_blocks"]
    assert retry and retry[0].num_reserved_blocks == 5  # C's own 18 tokens, no one else's
    assert [e.reason for e in events_of(recs, "finished", "C")] == ["aborted"]


def test_a_request_whose_load_failed_whole_stays_in_the_holding_queue_and_the_run_stalls():
    """Trace 19 (``kv_load_failure_policy`` "recompute"): R3's second load fails with no valid
    block, so it gives its blocks back while it sits in ``kv_holding_waiting``, ahead of R5,
    whose load lands. R3 stays at the holding queue's head, as in vLLM 0.34.0; its new load is
    refused by the parked reservations (its own among them), which ends every step's scan before
    R5 is looked at. vLLM 0.34.0's own Scheduler stalls there too, in the same state
    (tests/differential/test_offload_vs_vllm.py, ``bench/offload_vs_vllm.py --scheduler``):
    the harness stops after ``STALL_STEPS`` steps without progress and names the requests."""
    case = offload_vs_vllm.random_case(19)
    assert case["kv_load_failure_policy"] == "recompute" and "R3" in case["fail_loads"]
    run = offload_vs_vllm.our_scheduler_run(case)
    stalled = run["stalled"]
    assert stalled is not None
    assert stalled["queues"]["kv_holding_waiting"] == ["R3", "R5"]
    assert stalled["waiting_for_remote_kvs"] == ["R5"]  # its K/V is there, never looked at
    last = run["steps"][-1]
    r3_status, r3_computed, r3_blocks = last["requests"]["R3"]
    assert (r3_status, r3_computed, r3_blocks) == ("WAITING", 0, [])  # it holds nothing now
    assert last["requests"]["R5"][2]  # R5 holds the blocks its load filled
    # the replay harness stops at the same state instead of running to its step limit
    script, _ = offload_vs_vllm.our_run(case)
    assert script[-1]["stalled"]["queues"] == stalled["queues"]
