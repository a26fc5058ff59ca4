"""Scheduler through the Engine (NoModelRunner, no torch): budget, chunked prefill, admission,
preemption under FCFS and priority, resume with prefix hits, finishing, aborting."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcore.config.scheduler import ADMISSIONS
from kvcore.core.kv_cache_observer import KVCacheObserver
from kvcore.core.sched.request_queue import POLICIES
from kvcore.request import RequestStatus
from kvcore.utils.math_utils import cdiv
from paged_kv_lab.recording import events
from paged_kv_lab.run.engine import NoModelRunner
from support.kv import events_of, make_engine, spec, table


def steps_until(eng, pred, limit=100):
    recs = []
    for _ in range(limit):
        recs.append(eng.step())
        if pred(recs[-1]):
            return recs
    raise AssertionError("condition never met")


# -- chunked prefill, token budget ----------------------------------------------------------------
def test_chunked_prefill_splits_a_long_prompt_across_steps():
    eng = make_engine([spec("a", list(range(20)), max_tokens=2)], max_num_batched_tokens=8)
    r1, r2, r3 = eng.step(), eng.step(), eng.step()
    assert [r.scheduled for r in (r1, r2, r3)] == [{"a": 8}, {"a": 8}, {"a": 4}]
    assert [r.new_tokens for r in (r1, r2)] == [{}, {}]  # no token mid-prompt
    assert list(r3.new_tokens) == ["a"]
    assert [r.snapshot.request("a").block_tables[0] for r in (r1, r2, r3)] == [
        (1, 2),
        (1, 2, 3, 4),
        (1, 2, 3, 4, 5),
    ]
    assert [r.snapshot.request("a").num_computed_tokens for r in (r1, r2, r3)] == [8, 16, 20]
    starts = [e.start for e in events_of([r1, r2, r3], events.SCHEDULED)]
    assert starts == [0, 8, 16]
    r4 = eng.step()
    assert r4.scheduled == {"a": 1}
    assert eng.outputs()["a"]["finish_reason"] == "finished_length"


def test_budget_left_by_running_requests_goes_to_waiting_ones():
    eng = make_engine(
        [spec("a", list(range(20)), max_tokens=2), spec("b", list(range(50, 54)))],
        max_num_batched_tokens=8,
    )
    r1 = eng.step()
    assert r1.scheduled == {"a": 8}
    blocked = events_of(r1, events.BLOCKED, "b")
    assert blocked and blocked[-1].reason == "token_budget"
    r3 = [eng.step(), eng.step()][-1]
    assert r3.scheduled == {"a": 4, "b": 4}  # running first, then waiting


def test_long_prefill_token_threshold_caps_chunks_only_with_more_than_one_request():
    # vLLM: the cap stops one prefill from starving the others; a lone request starves nobody.
    eng = make_engine([spec("a", list(range(10)), max_tokens=1)], long_prefill_token_threshold=3)
    assert eng.step().scheduled == {"a": 10}
    eng = make_engine(
        [spec("a", list(range(10)), max_tokens=1), spec("b", list(range(50, 60)), max_tokens=1)],
        long_prefill_token_threshold=3,
    )
    assert eng.step().scheduled == {"a": 3, "b": 3}
    # Waiting requests count too: a running alone while b waits is still capped.
    eng = make_engine(
        [spec("a", list(range(10)), max_tokens=1), spec("b", list(range(50, 60)), max_tokens=1)],
        long_prefill_token_threshold=3,
        max_num_seqs=1,
    )
    assert [eng.step().scheduled for _ in range(3)] == [{"a": 3}, {"a": 3}, {"a": 3}]
    assert eng.step().scheduled == {"a": 1}
    assert eng.step().scheduled == {"b": 10}  # b is alone now: its whole prompt


# -- admission -------------------------------------------------------------------------------------
def test_admission_blocked_by_max_num_seqs():
    eng = make_engine(
        [spec("a", [1, 2, 3], max_tokens=3), spec("b", [4, 5, 6], max_tokens=1)], max_num_seqs=1
    )
    recs = steps_until(eng, lambda r: "b" in r.scheduled)
    assert [r.scheduled for r in recs] == [{"a": 3}, {"a": 1}, {"a": 1}, {"b": 3}]
    reasons = {e.reason for e in events_of(recs[:3], events.BLOCKED, "b")}
    assert reasons == {"max_num_seqs"}
    assert recs[0].snapshot.waiting == ("b",) and recs[0].snapshot.running == ("a",)


@pytest.mark.parametrize("admission", ADMISSIONS)
def test_admission_blocked_by_free_blocks_full_sequence_vs_first_chunk(admission):
    eng = make_engine(
        [
            spec("a", list(range(8)), max_tokens=8),
            spec("b", list(range(100, 116)), max_tokens=2, arrival_step=1),
        ],
        num_gpu_blocks=6,
        max_num_batched_tokens=8,
        admission=admission,
    )
    eng.step()
    r2 = eng.step()  # a holds 3 blocks, 2 free; b needs 4
    if admission == "full_sequence":
        assert r2.scheduled == {"a": 1}
        (ev,) = events_of(r2, events.BLOCKED, "b")
        assert ev.reason == "no_free_blocks" and ev.num_free_blocks == 2
    else:  # older rule: the 7-token chunk fits in 2 blocks
        assert r2.scheduled == {"a": 1, "b": 7}
        assert table(eng, "b") == [4, 5]
        r3 = eng.step()  # ...and b is preempted when it grows
        assert [e.request_id for e in events_of(r3, events.PREEMPTED)] == ["b"]
    eng.run()
    assert all(o["finish_reason"] == "finished_length" for o in eng.outputs().values())


def test_admission_counts_free_queue_hits_but_not_hits_in_use():
    # a holds the prompt's blocks; an identical b only needs the new tail block.
    eng = make_engine(
        [
            spec("a", list(range(12)), max_tokens=2),
            spec("b", list(range(12)) + [77], max_tokens=2, arrival_step=1),
        ],
        num_gpu_blocks=6,
    )
    eng.step()
    r2 = eng.step()
    assert "b" in r2.scheduled
    assert table(eng, "b") == [1, 2, 3, 5]
    (hit,) = events_of(r2, events.CACHE_HIT, "b")
    assert hit.num_tokens == 12


# -- preemption ------------------------------------------------------------------------------------
def test_fcfs_preempts_the_last_running_request_and_it_rehits_its_own_blocks():
    eng = make_engine(
        [spec("A", list(range(8)), max_tokens=6), spec("B", list(range(20, 28)), max_tokens=6)],
        num_gpu_blocks=6,
    )
    eng.step()
    assert table(eng, "A") == [1, 2] and table(eng, "B") == [3, 4]
    r2 = eng.step()
    (pre,) = events_of(r2, events.PREEMPTED)
    assert pre.request_id == "B" and pre.policy == "fcfs"
    assert pre.needed_by == "B"
    assert r2.scheduled == {"A": 1}
    snap = r2.snapshot
    b = snap.request("B")
    assert b.status == "preempted" and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert b.block_tables == ((),)
    assert snap.waiting == ("B",) and snap.running == ("A",)
    assert snap.free_queue == (4, 3)  # freed in reverse, both cached -> tail
    # No waiting request is admitted in a step that preempted.
    assert events_of(r2, events.BLOCKED, "B")[0].reason == "preempted_this_step"
    recs = steps_until(eng, lambda r: events_of(r, events.RESUMED))
    # While waiting, B (9 tokens: 3 blocks) hits its 2 cached blocks, but they sit in the free
    # queue and so count as needed: 2 hits + 1 new > 2 free blocks.
    r3 = recs[0]
    assert events_of(r3, events.CACHE_HIT, "B")[0].block_ids == (3, 4)
    blocked = events_of(r3, events.BLOCKED, "B")[0]
    assert blocked.reason == "no_free_blocks" and blocked.num_free_blocks == 2
    # A took block 4 (B's tail) first; B's first block survived and is hit again.
    res = events_of(recs[-1], events.RESUMED, "B")[0]
    assert res.num_cached_tokens == 4 and res.num_preemptions == 1
    hit = events_of(recs[-1], events.CACHE_HIT, "B")[0]
    assert hit.block_ids == (3,) and hit.preempted_before is True
    assert recs[-1].snapshot.request("B").num_cached_tokens == 4
    assert table(eng, "B")[0] == 3
    sched = [e for e in events_of(recs[-1], events.SCHEDULED, "B")][0]
    assert sched.phase == "recompute" and sched.start == 4
    eng.run()
    outs = eng.outputs()
    assert len(outs["B"]["token_ids"]) == 6 and outs["B"]["finish_reason"] == "finished_length"


def test_fcfs_preempted_request_goes_back_to_the_front_of_the_waiting_queue():
    eng = make_engine(
        [
            spec("A", list(range(8)), max_tokens=6),
            spec("B", list(range(20, 28)), max_tokens=6),
            spec("C", [9, 9, 9, 9, 9, 9, 9, 9, 9], max_tokens=1, arrival_step=1),
        ],
        num_gpu_blocks=6,
    )
    eng.step()
    r2 = eng.step()
    assert r2.snapshot.waiting == ("B", "C")


@pytest.mark.parametrize("policy", POLICIES)
def test_preemption_victim_under_both_policies(policy):
    # X (priority 5, i.e. least important) is admitted first and so sits first in `running`.
    eng = make_engine(
        [
            spec("X", list(range(6)), max_tokens=6, priority=5),
            spec("Y", list(range(50, 54)), max_tokens=2, arrival_step=1),
        ],
        num_gpu_blocks=4,
        policy=policy,
    )
    eng.step()
    r2 = eng.step()
    assert r2.snapshot.running == ("X", "Y")
    r3 = eng.step()  # X fits; then Y needs a block and none is free
    (pre,) = events_of(r3, events.PREEMPTED)
    if policy == "priority":
        # The largest (priority, arrival) wherever it sits: X, already in this step's batch,
        # whose token is taken back out; Y gets X's freed block.
        assert pre.request_id == "X" and pre.victim_priority == 5
        assert r3.scheduled == {"Y": 1}
        assert not events_of(r3, events.SCHEDULED, "X")
        x = r3.snapshot.request("X")
        assert x.status == "preempted" and x.num_computed_tokens == 0
        assert x.num_output_tokens == r2.snapshot.request("X").num_output_tokens  # nothing sampled
        r4 = eng.step()
        res = events_of(r4, events.RESUMED, "X")
        assert res and res[0].num_cached_tokens == 4
    else:
        assert pre.request_id == "Y"  # the last in `running`: Y preempts itself
        assert r3.scheduled == {"X": 1}
    eng.run()
    assert {o["finish_reason"] for o in eng.outputs().values()} == {"finished_length"}


def test_priority_self_preemption_lets_the_running_requests_after_it_go_on():
    # 4 usable blocks of 4: A (7 tokens, priority 1) runs; B (5 tokens, priority 0) joins and
    # fills the pool. A then needs a third block, is the least important and preempts itself;
    # vLLM goes on with the running requests after it, so B still decodes in that step.
    eng = make_engine(
        [
            spec("A", list(range(7)), max_tokens=8, priority=1),
            spec("B", list(range(50, 55)), max_tokens=8, arrival_step=1),
        ],
        num_gpu_blocks=5,
        policy="priority",
    )
    assert eng.step().scheduled == {"A": 7}
    r2 = eng.step()
    assert r2.scheduled == {"A": 1, "B": 5} and r2.snapshot.num_free_blocks == 0
    r3 = eng.step()
    (pre,) = events_of(r3, events.PREEMPTED)
    assert pre.request_id == "A" and pre.needed_by == "A"
    assert r3.scheduled == {"B": 1}
    assert r3.snapshot.running == ("B",) and r3.snapshot.waiting == ("A",)
    eng.run()
    assert {o["finish_reason"] for o in eng.outputs().values()} == {"finished_length"}


def test_priority_waiting_queue_orders_by_priority_then_arrival():
    reqs = [
        spec("p2", [1], priority=2, max_tokens=1),
        spec("p0-late", [2], priority=0, max_tokens=1),
        spec("p1", [3], priority=1, max_tokens=1),
        spec("p0", [4], priority=0, max_tokens=1),
        spec("hold", [5], priority=-1, max_tokens=3),
    ]
    eng = make_engine(reqs, policy="priority", max_num_seqs=1)
    r1 = eng.step()
    assert r1.scheduled == {"hold": 1}
    # (priority, arrival): p0-late arrived second, p0 fourth.
    assert r1.snapshot.waiting == ("p0-late", "p0", "p1", "p2")
    order = []
    for rec in eng.run():
        order += [e.request_id for e in events_of(rec, events.ADMITTED)]
    assert order == ["p0-late", "p0", "p1", "p2"]


# -- finishing -------------------------------------------------------------------------------------
def test_last_sampled_token_never_gets_a_kv_slot():
    eng = make_engine([spec("a", [1, 2, 3], max_tokens=2), spec("b", [1, 2, 3, 4], max_tokens=1)])
    recs = eng.run()
    allocated = {
        rid: [b for e in events_of(recs, events.ALLOCATED, rid) for b in e.block_ids]
        for rid in ("a", "b")
    }
    assert allocated == {"a": [1], "b": [2]}
    assert len(eng.outputs()["a"]["token_ids"]) == 2


def test_finish_on_eos_frees_blocks():
    # NoModelRunner's first token for request "e" after 4 prompt tokens is 470.
    eng = make_engine(
        [spec("e", [1, 2, 3, 4], max_tokens=10, ignore_eos=False)],
        runner=NoModelRunner(eos_token_id=470),
    )
    recs = eng.run()
    out = eng.outputs()["e"]
    assert out["token_ids"] == [470] and out["finish_reason"] == "finished_stopped"
    fin = events_of(recs, events.FINISHED, "e")[0]
    assert fin.reason == "eos"
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 15
    # ignore_eos keeps going to max_tokens.
    eng = make_engine(
        [spec("e", [1, 2, 3, 4], max_tokens=3, ignore_eos=True)],
        runner=NoModelRunner(eos_token_id=470),
    )
    eng.run()
    assert eng.outputs()["e"]["finish_reason"] == "finished_length"


def test_abort_running_and_waiting_requests():
    eng = make_engine(
        [spec("a", list(range(6)), max_tokens=5), spec("b", [1, 2], max_tokens=5)], max_num_seqs=1
    )
    eng.step()
    eng.scheduler.abort_request("a")
    eng.scheduler.abort_request("b")
    eng.scheduler.abort_request("b")  # twice: no-op
    rec = eng.step()
    assert {e.request_id for e in events_of(rec, events.FINISHED)} == {"a", "b"}
    assert all(e.reason == "aborted" for e in events_of(rec, events.FINISHED))
    assert not eng.has_unfinished()
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 15
    assert eng.outputs()["a"]["finish_reason"] == "finished_aborted"


def test_free_order_at_the_end_of_a_request_v033_vs_legacy():
    for order, expect in (("v0.33", (3, 4, 5, 6, 7, 2, 1)), ("legacy", (4, 5, 6, 7, 3, 2, 1))):
        eng = make_engine(
            [spec("a", list(range(10)), max_tokens=1)], num_gpu_blocks=8, free_order=order
        )
        eng.run()
        assert eng.snapshot().free_queue == expect, order


# -- things that can never fit ---------------------------------------------------------------------
def test_prompt_larger_than_the_pool_is_rejected_with_a_clear_message():
    with pytest.raises(
        ValueError,
        match=r"request 'big': its prompt of 9 tokens needs 3 blocks of 4 "
        r"tokens but the pool has only 2 usable blocks",
    ):
        make_engine([spec("big", list(range(9)), arrival_step=3)], num_gpu_blocks=3)
    eng = make_engine([], num_gpu_blocks=3)
    with pytest.raises(ValueError, match="null block"):
        eng.add_request(spec("big", list(range(9))))
    assert not eng.has_unfinished() and eng.scheduler.requests == {}


def test_a_request_that_can_never_fit_is_aborted_with_a_clear_event():
    # The prompt fits (2 blocks) but its first decode token needs a third, and the pool has 2.
    eng = make_engine([spec("grow", list(range(8)), max_tokens=5)], num_gpu_blocks=3)
    recs = eng.run(max_steps=20)
    assert len(recs) < 5 and not eng.has_unfinished()
    blocked = [e for e in events_of(recs, events.BLOCKED, "grow") if e.reason == "never_fits"]
    assert len(blocked) == 1 and blocked[0].usable_blocks == 2
    assert eng.outputs()["grow"]["finish_reason"] == "finished_aborted"
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 2


def test_two_identical_prompts_computed_side_by_side_give_two_blocks_one_hash():
    """b arrives while a is still prefilling in chunks: b hits what a has cached so far, then
    both compute the rest of the same prompt into their own blocks. (z is there so that a is
    not alone in step 1: the prefill cap only applies to more than one request.)"""
    eng = make_engine(
        [
            spec("a", list(range(16)), max_tokens=2),
            spec("z", [500], max_tokens=1),
            spec("b", list(range(16)), max_tokens=2, arrival_step=1),
        ],
        long_prefill_token_threshold=4,
    )
    eng.step()
    r2 = eng.step()
    assert events_of(r2, events.CACHE_HIT, "b")[0].block_ids == (1, 2)
    r3 = eng.step()
    assert table(eng, "a") == [1, 2, 4] and table(eng, "b") == [1, 2, 3, 5]
    snap = r3.snapshot
    dup = {k: v for k, v in snap.hash_map.items() if len(v) > 1}
    assert sorted(dup.values()) == [(3, 4)]  # b stored it first, then a
    blk = {v.block_id: v for v in snap.blocks}
    assert blk[3].block_hash == blk[4].block_hash and blk[3].token_ids == (8, 9, 10, 11)
    eng.run()
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 15


def test_pools_without_a_usable_block_are_rejected():
    for n in (0, 1):
        with pytest.raises(ValueError, match="num_gpu_blocks"):
            make_engine([], num_gpu_blocks=n)


def test_block_size_one_end_to_end():
    eng = make_engine(
        [spec("a", [5, 6, 7], max_tokens=3), spec("b", [5, 6, 7], max_tokens=2, arrival_step=1)],
        block_size=1,
        num_gpu_blocks=12,
    )
    recs = eng.run()
    (hit,) = events_of(recs, events.CACHE_HIT, "b")
    assert hit.num_tokens == 2 and hit.block_ids == (1, 2)
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 11


def test_reset_prefix_cache_through_the_engine():
    eng = make_engine([spec("a", list(range(9)), max_tokens=2)])
    eng.step()
    assert eng.reset_prefix_cache() is False
    eng.run()
    assert eng.reset_prefix_cache() is True
    assert eng.snapshot().hash_map == {}
    assert [type(e).__name__ for e in eng.take_kv_events()][-1] == "AllBlocksCleared"


def test_scheduler_config_is_validated():
    with pytest.raises(ValueError, match="admission"):
        make_engine([], admission="eager")
    with pytest.raises(ValueError, match="policy"):
        make_engine([], policy="lifo")


def test_snapshot_prefix_cache_stats_count_resumed_requests_apart():
    # The preemption story above: B is preempted and resumed with a 4-token hit.
    eng = make_engine(
        [spec("A", list(range(8)), max_tokens=6), spec("B", list(range(20, 28)), max_tokens=6)],
        num_gpu_blocks=6,
    )
    eng.run()
    pc = eng.snapshot().prefix_cache
    assert (pc["requests"], pc["queries"], pc["hits"]) == (2, 16, 0)
    assert pc["preempted_requests"] == 1 and pc["preempted_hits"] == 4
    assert pc["recent_requests"] == 2 and pc["recent_hit_rate"] == 0.0


def test_scheduler_output_has_vllms_fields_and_finished_ids_are_handed_out_once():
    from kvcore.outputs import ModelRunnerOutput

    eng = make_engine(
        [spec("a", list(range(6)), max_tokens=1), spec("b", list(range(50, 53)), max_tokens=3)]
    )
    for s in eng.scenario.requests:
        eng.add_request(s)
    sched = eng.scheduler
    out = sched.schedule()
    assert [d.req_id for d in out.scheduled_new_reqs] == ["a", "b"]
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    assert out.scheduled_new_reqs[0].block_ids == ([1, 2],) and out.scheduled_new_reqs[
        1
    ].prompt_token_ids == [50, 51, 52]
    assert out.scheduled_new_reqs[1].prefill_token_ids == [50, 51, 52]
    assert out.scheduled_cached_reqs.req_ids == [] and out.total_num_scheduled_tokens == 9
    assert out.num_scheduled_tokens == {"a": 6, "b": 3} and out.finished_req_ids == set()
    assert out.preempted_req_ids == set() and not hasattr(out, "num_common_prefix_blocks")
    finished = sched.update_from_output(
        out, ModelRunnerOutput.from_sampled(["a", "b"], {"a": 7, "b": 8})
    )
    assert finished == ["a"]
    out2 = sched.schedule()
    assert out2.finished_req_ids == {"a"}  # handed out once...
    c = out2.scheduled_cached_reqs
    assert c.req_ids == ["b"] and c.new_token_ids == [] and c.num_computed_tokens == [3]
    assert c.num_output_tokens == [1] and not hasattr(c, "resumed_req_ids")
    assert not hasattr(c, "all_token_ids")  # 0.33.0's fields, gone in 0.34.0
    assert c.new_block_ids == [None]  # its one block still has room
    assert sched.finished_req_ids == set()  # ...then forgotten: no unbounded growth
    done = sched.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in done] == ["b"]  # a was already finished
    assert sched.finish_requests("nope", RequestStatus.FINISHED_ABORTED) == []
    assert sched.schedule().finished_req_ids == {"b"}
    with pytest.raises(ValueError, match="not a finished status"):
        sched.finish_requests("b", RequestStatus.RUNNING)


def test_a_resumed_request_travels_as_new_data_with_its_whole_table_and_tokens():
    """vLLM 0.34: a request resumed after preemption is sent in full among the new requests
    (its table, and the prompt and outputs to prefill), never among the cached ones."""
    eng = make_engine(
        [spec("A", list(range(8)), max_tokens=6), spec("B", list(range(20, 28)), max_tokens=6)],
        num_gpu_blocks=6,
    )
    outs = []
    schedule = eng.scheduler.schedule
    eng.scheduler.schedule = lambda: outs.append(schedule()) or outs[-1]
    eng.run()
    pre = next(o for o in outs if o.preempted_req_ids)
    assert pre.preempted_req_ids == {"B"}
    after = outs[outs.index(pre) + 1 :]
    res = next(o for o in after if any(d.req_id == "B" for d in o.scheduled_new_reqs))
    assert "B" not in res.scheduled_cached_reqs.req_ids
    (b,) = [d for d in res.scheduled_new_reqs if d.req_id == "B"]
    (table,) = b.block_ids
    # the hit, then the rest
    assert table[0] == 3 and len(table) == cdiv(len(b.prefill_token_ids), 4)
    assert b.prefill_token_ids[:8] == list(range(20, 28)) and len(b.prefill_token_ids) > 8
    assert b.prompt_token_ids == list(range(20, 28)) and b.num_computed_tokens == 4


def test_a_finished_request_leaves_the_scheduler_and_its_id_can_be_used_again():
    """As vLLM 0.33 (Scheduler._free_blocks): a finished request is deleted from
    ``Scheduler.requests``, so memory does not grow with every request a run has seen and the
    id is free again; the recording layer (Engine) still shows and outputs it."""
    from kvcore.request import Request

    eng = make_engine([spec("A", [1, 2, 3, 4], max_tokens=2)], block_size=4, num_gpu_blocks=8)
    eng.run()
    assert "A" not in eng.scheduler.requests and not eng.scheduler.has_unfinished_requests()
    assert eng.outputs()["A"]["finish_reason"] == "finished_length"
    assert [r.request_id for r in eng.snapshot().requests] == ["A"]
    eng.scheduler.add_request(Request("A", [5, 6, 7], 1))  # the id is free again
    assert eng.scheduler.requests["A"].prompt_token_ids == [5, 6, 7]


def test_request_takes_an_empty_prompt_as_vllm_and_the_engine_refuses_it_by_name():
    from kvcore.request import Request

    r = Request("empty", [], 4)  # vLLM's lookahead tests build one
    assert r.num_tokens == 0 and r.block_hashes == []
    eng = make_engine([], block_size=4, num_gpu_blocks=8)
    with pytest.raises(ValueError, match="'e': the prompt is empty"):
        eng.add_request(spec("e", []))


def test_a_new_requests_data_carries_its_multimodal_items_as_vllms():
    """vLLM's NewRequestData has mm_features: a KV connector's build_connector_meta keys stored
    K/V by their identifiers (vLLM's ExampleConnector reads new_req.mm_features)."""
    from kvcore.config.scheduler import SchedulerConfig
    from kvcore.core.kv_cache_utils import get_request_block_hasher
    from kvcore.core.sched.scheduler import Scheduler
    from kvcore.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from kvcore.request import Request
    from kvcore.utils.hashing import get_hash_fn_by_name
    from support.kv import make_manager

    sched = Scheduler(SchedulerConfig(), make_manager(16, 4))
    hasher = get_request_block_hasher(4, get_hash_fn_by_name("sha256"))
    items = [MultiModalFeatureSpec("cat", PlaceholderRange(2, 3))]
    sched.add_request(Request("img", list(range(8)), 2, block_hasher=hasher, mm_features=items))
    sched.add_request(Request("text", list(range(20, 28)), 2, block_hasher=hasher))
    out = sched.schedule()
    assert [(d.req_id, d.mm_features) for d in out.scheduled_new_reqs] == [
        ("img", items),
        ("text", []),
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_waiting_queue_iterates_in_scheduling_order_as_vllms(policy):
    """vLLM's request queues are iterable (its tests and connectors read them that way)."""
    from kvcore.core.sched.request_queue import create_request_queue
    from kvcore.request import Request

    queue = create_request_queue(policy)
    for rid, priority in (("a", 2), ("b", 0), ("c", 1)):
        queue.add_request(Request(rid, [1], 1, arrival_time=0, priority=priority))
    order = [r.request_id for r in queue]
    assert order == [r.request_id for r in queue.ordered()]
    assert order == (["a", "b", "c"] if policy == "fcfs" else ["b", "c", "a"])


# -- vLLM 0.34's cache-aware admission ------------------------------------------------------------
PREFIX = list(range(100, 108))  # two full blocks of 4


def admission_order(**engine) -> list[str]:
    """The order the requests are first scheduled in: "long" keeps 6 of the 11 usable blocks
    (usage above one half), "warm0" caches PREFIX and leaves; at step 3 a cold request and a warm
    one (PREFIX and more) arrive in that order, with one running slot free for them."""
    eng = make_engine(
        [
            spec("long", list(range(24)), max_tokens=30),
            spec("warm0", PREFIX + [1, 2], max_tokens=1),
            spec("cold", list(range(200, 210)), max_tokens=2, arrival_step=3),
            spec("warm", PREFIX + [7, 8], max_tokens=2, arrival_step=3),
        ],
        num_gpu_blocks=12,
        max_num_seqs=2,
        **engine,
    )
    first = []
    for rec in eng.run():
        first += [rid for rid in rec.scheduled if rid not in first]
    return first


def test_window_0_admits_in_arrival_order():
    assert admission_order() == ["long", "warm0", "cold", "warm"]


def test_window_admits_the_warm_request_before_the_cold_one():
    assert admission_order(cache_aware_admission_window=2) == ["long", "warm0", "warm", "cold"]


def test_below_the_threshold_the_window_moves_nothing():
    # usage is 6/11 and a little more as "long" grows: under 0.75, so arrival order
    assert admission_order(cache_aware_admission_window=2, cache_aware_admission_threshold=0.75)[
        2:
    ] == ["cold", "warm"]
    assert admission_order(cache_aware_admission_window=2, cache_aware_admission_threshold=0.0)[
        2:
    ] == ["warm", "cold"]


def test_a_window_of_one_or_the_priority_policy_moves_nothing():
    assert admission_order(cache_aware_admission_window=1)[2:] == ["cold", "warm"]
    assert admission_order(cache_aware_admission_window=2, policy="priority")[2:] == [
        "cold",
        "warm",
    ]


def test_reorder_keeps_preempted_and_partly_computed_requests_in_their_slots():
    """vLLM's _reorder_waiting_by_cached_prefix: only plainly waiting requests trade slots,
    deepest cached prefix first, arrival order breaking ties; the queue past the window stays."""
    eng = make_engine(
        [spec("warm0", PREFIX + [1, 2], max_tokens=1)],
        cache_aware_admission_window=4,
        cache_aware_admission_threshold=0.0,
    )
    eng.run()
    sched = eng.scheduler
    for rid, toks in [
        ("cold1", [300, 301, 302, 303, 304]),
        ("pre", [400, 401, 402, 403, 404]),
        ("one", PREFIX[:4] + [9, 9]),
        ("two", PREFIX + [5]),
        ("past", PREFIX + [6]),
    ]:
        eng.add_request(spec(rid, toks, max_tokens=2))
    reqs = eng.requests
    reqs["pre"].status = RequestStatus.PREEMPTED
    assert sched.kv_cache_manager.get_num_cached_tokens(reqs["two"]) == 8
    sched._reorder_waiting_by_cached_prefix()
    assert [r.request_id for r in sched.waiting] == ["two", "pre", "one", "cold1", "past"]


class _Decisions(KVCacheObserver):
    """Keeps the decisions kvcore reports (the block hooks stay no-ops)."""

    def __init__(self):
        self.decisions = []

    def on_decision(self, kind, request_id, **fields):
        self.decisions.append((kind, request_id, fields))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shared=st.lists(st.integers(0, 2), min_size=0, max_size=6),
    held=st.lists(st.booleans(), min_size=6, max_size=6),
    window=st.integers(0, 7),
    threshold=st.sampled_from([0.0, 0.0, 0.99]),
)
def test_cache_aware_reorder_is_reported_exactly_when_the_order_changes(
    shared, held, window, threshold
):
    """The observer hears "cache_aware_reorder" once for a reorder that changed the waiting
    queue and never otherwise (a window under 2, usage under the threshold, every request
    already in place), and what it hears is the change: the window's order before and after,
    who went ahead of whom, the probed prefixes, the window, the threshold and the usage."""
    eng = make_engine(
        [spec("warm0", PREFIX + [1, 2], max_tokens=1)],
        cache_aware_admission_window=window,
        cache_aware_admission_threshold=threshold,
    )
    eng.run()
    sched = eng.scheduler
    for k, blocks in enumerate(shared):  # 0, 1 or 2 of PREFIX's blocks, then its own tokens
        eng.add_request(spec(f"r{k}", PREFIX[: 4 * blocks] + [500 + k] * 5, max_tokens=2))
        if held[k]:  # a preempted request keeps its slot
            eng.requests[f"r{k}"].status = RequestStatus.PREEMPTED
    before = [r.request_id for r in sched.waiting]
    log = _Decisions()
    sched.kv_cache_manager.block_pool.observer = log
    sched._reorder_waiting_by_cached_prefix()
    after = [r.request_id for r in sched.waiting]
    told = [(rid, f) for kind, rid, f in log.decisions if kind == "cache_aware_reorder"]
    assert len(told) == (before != after)
    if before == after:
        return
    ((rid, f),) = told
    n = len(f["order_before"])
    assert rid is None and n == min(sched.cache_aware_window, len(before)) >= 2
    assert list(f["order_before"]) == before[:n] and list(f["order_after"]) == after[:n]
    assert after[n:] == before[n:]  # the queue past the window is untouched
    assert f["window"] == window and f["threshold"] == threshold
    assert f["usage"] == sched.kv_cache_manager.usage >= threshold
    for mover, passed in f["moved_ahead"].items():
        assert passed and all(
            before.index(p) < before.index(mover) and after.index(mover) < after.index(p)
            for p in passed
        )
    moved = {(m, p) for m, ps in f["moved_ahead"].items() for p in ps}
    # the pairs that changed order, the one now ahead a plainly waiting request
    assert moved == {
        (a, b)
        for a in after[:n]
        for b in after[:n]
        if not held[int(a[1:])]
        and before.index(b) < before.index(a)
        and after.index(a) < after.index(b)
    }
    for r in before[:n]:  # a preempted request keeps its slot
        assert not held[int(r[1:])] or before.index(r) == after.index(r)
    probe = sched.kv_cache_manager.get_num_cached_tokens
    assert f["num_cached_tokens"] == {
        r: probe(eng.requests[r]) for r in before[:n] if not held[int(r[1:])]
    }
