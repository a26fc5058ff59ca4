"""Events and Snapshots: plain frozen data, JSON round trip, and what they say about the engine."""
import dataclasses
import json

import pytest

from kvcore import trace
from kvcore.trace import Event, Snapshot, StepRecord

from _kv_helpers import events_of, make_engine, spec, vllm_chain

SHARED = list(range(10))


def shared_prefix_engine(**kw):
    return make_engine([spec("a", SHARED, max_tokens=3), spec("b", SHARED + [42], max_tokens=2, arrival_step=1,
                                                                 priority=1, cache_salt=None)], **kw)


def test_snapshot_json_round_trip():
    eng = shared_prefix_engine(sliding_window=4, layer_types=("full_attention", "sliding_attention"),
                               block_size=2, num_gpu_blocks=24)
    for rec in eng.run():
        text = json.dumps(rec.snapshot.to_dict())
        back = Snapshot.from_dict(json.loads(text))
        assert back == rec.snapshot
        assert json.dumps(back.to_dict()) == text


def test_step_record_and_event_json_round_trip():
    eng = shared_prefix_engine()
    for rec in eng.run():
        d = json.loads(json.dumps(rec.to_dict()))
        back = StepRecord.from_dict(d)
        assert back == rec
    ev = Event(trace.EVICTED, "r", (3, 4), 1, {"hash": "ab", "n": [1, 2]})
    assert Event.from_dict(json.loads(json.dumps(ev.to_dict()))) == ev


def test_snapshots_are_frozen_and_do_not_follow_the_engine():
    eng = shared_prefix_engine()
    first = eng.step().snapshot
    frozen = json.dumps(first.to_dict())
    eng.run()
    assert json.dumps(first.to_dict()) == frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.step = 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.blocks[0].ref_cnt = 3


def test_snapshot_describes_blocks_queue_hash_map_and_requests():
    eng = shared_prefix_engine()
    eng.step()
    snap = eng.step().snapshot                         # a decoding, b admitted with a 2-block hit
    assert snap.step == 2 and snap.block_size == 4 and snap.num_gpu_blocks == 16
    assert snap.running == ("a", "b") and snap.waiting == ()
    a, b = snap.request("a"), snap.request("b")
    assert a.block_tables == ((1, 2, 3),) and b.block_tables == ((1, 2, 4),)
    assert b.num_cached_tokens == 8 and b.priority == 1 and b.arrival == 2
    assert a.status == "running" and a.num_prompt_tokens == 10 and a.num_output_tokens == 2
    with pytest.raises(KeyError):
        snap.request("zz")
    blk = {v.block_id: v for v in snap.blocks}
    assert blk[0].is_null and blk[0].ref_cnt == 0 and blk[0].queue_pos is None
    h = vllm_chain(SHARED, 4)
    assert blk[1].ref_cnt == 2 and blk[1].owners == ("a", "b")
    assert blk[1].block_hash == h[0].hex() and blk[1].parent_hash is None and blk[1].group == 0
    assert blk[2].parent_hash == h[0].hex() and blk[2].token_ids == (4, 5, 6, 7)
    assert blk[3].block_hash is None and blk[3].owners == ("a",)
    # A partial block shows the tokens written so far (a's first output was computed in step 2).
    assert blk[3].token_ids == (8, 9, a.output_token_ids[0])
    assert blk[5].queue_pos == 0 and blk[5].owners == () and blk[5].token_ids == ()
    assert snap.free_queue[:3] == (5, 6, 7) and len(snap.free_queue) == snap.num_free_blocks == 11
    assert all(blk[bid].queue_pos == i for i, bid in enumerate(snap.free_queue))
    assert snap.hash_map[f"{h[0].hex()}@0"] == (1,)
    assert snap.usage == pytest.approx(4 / 15)
    assert snap.prefix_cache["requests"] == 2 and snap.prefix_cache["hits"] == 8
    assert snap.groups == ({"kind": "full", "sliding_window": None},)


def test_sliding_window_null_slots_show_in_the_snapshot():
    eng = make_engine([spec("a", list(range(9)), max_tokens=4)], block_size=2, num_gpu_blocks=12,
                      sliding_window=4)
    recs = eng.run()
    tables = [r.snapshot.request("a").block_tables[0] for r in recs if r.snapshot.request("a").block_tables[0]]
    assert tables[-1][:3] == (0, 0, 0)
    skipped = events_of(recs, trace.WINDOW_SKIPPED, "a")
    assert skipped and all(e.data["slots"] for e in skipped)
    assert recs[0].snapshot.groups == ({"kind": "sliding", "sliding_window": 4},)


def test_events_carry_their_reasons_as_plain_data():
    eng = make_engine([spec("A", list(range(8)), max_tokens=6), spec("B", list(range(20, 28)), max_tokens=6)],
                      num_gpu_blocks=6)
    recs = eng.run()
    for rec in recs:
        json.dumps([e.to_dict() for e in rec.events])
        assert all(e.kind in trace.EVENT_KINDS for e in rec.events)
    pre = events_of(recs, trace.PREEMPTED)[0]
    assert pre.request_id == "B" and "needed blocks" in pre.data["reason"]
    ev = events_of(recs, trace.EVICTED)[0]
    assert ev.data["reason"] == "reused from queue head" and len(ev.data["hash"]) == 64
    fin = events_of(recs, trace.FINISHED)
    assert {e.request_id: e.data["reason"] for e in fin} == {"A": "length", "B": "length"}
    freed = events_of(recs, trace.FREED, "B")[0]
    assert freed.data["reason"] == "preempted" and freed.block_ids == (4, 3)
    arrived = events_of(recs, trace.ARRIVED)
    assert [e.request_id for e in arrived] == ["A", "B"]
    sampled = events_of(recs, trace.SAMPLED)
    assert sampled and sampled[0].request_id is None and set(sampled[0].data["tokens"]) == {"A", "B"}


def test_recorder_collects_and_drains():
    rec = trace.Recorder()
    rec.at("r1", group=1).emit(trace.ALLOCATED, [3], why="x")
    rec.emit(trace.FREED, [3], request_id="r2", group=0)
    out = rec.drain()
    assert out == [Event(trace.ALLOCATED, "r1", (3,), 1, {"why": "x"}),
                   Event(trace.FREED, "r2", (3,), 0, {})]
    assert rec.drain() == []


def test_same_scenario_same_trace():
    def run():
        eng = make_engine([spec("A", list(range(8)), max_tokens=6), spec("B", list(range(20, 28)), max_tokens=6),
                           spec("C", list(range(8)), max_tokens=3, arrival_step=2, cache_salt="s")],
                          num_gpu_blocks=7, hash_algo="xxhash")
        return json.dumps([r.to_dict() for r in eng.run()]), eng.outputs()
    assert run() == run()


def test_snapshot_with_caching_off():
    eng = make_engine([spec("a", SHARED, max_tokens=2), spec("b", SHARED, max_tokens=2)],
                      enable_prefix_caching=False)
    recs = eng.run()
    assert not events_of(recs, trace.CACHE_HIT) and not events_of(recs, trace.CACHED)
    assert all(b.block_hash is None for r in recs for b in r.snapshot.blocks)
    assert recs[0].snapshot.hash_map == {}
