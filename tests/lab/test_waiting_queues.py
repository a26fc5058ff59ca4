"""vLLM 0.34's three waiting queues in the recording (issue 44): a snapshot says which queue each
waiting request is in (``Snapshot.waiting_queues``, beside ``waiting``), only where one is outside
plain ``waiting``, so runs without such a request are recorded, written and encoded as before; the
trace file and the player's payload keep it; and "why was B admitted before A?" checks vLLM's
cache-aware window against the queue vLLM reorders (``waiting`` alone)."""

import dataclasses
import json

import pytest

from paged_kv_lab.player.payload import WAITING_QUEUES_SOURCE, WIRE, run_payload
from paged_kv_lab.recording.snapshot import Snapshot
from paged_kv_lab.run.scenario import scenario_to_dict
from paged_kv_lab.run.trace_file import TraceError, header_line, read_trace, step_line
from paged_kv_lab.why.explain import RecordedSteps
from paged_kv_lab.why.explain_admission import explain_order
from support.kv import cpu_tier_holding_run, make_engine, spec

P = [17, 254, 1033, 88, 4012, 7, 391, 2290, 56, 1777, 640, 12, 9001, 345, 78, 2048, 31, 4444]


def test_a_request_holding_blocks_is_recorded_in_kv_holding_waiting_and_kept_on_the_way():
    eng, initial, recs = cpu_tier_holding_run()
    marked = [r for r in recs if r.snapshot.waiting_queues]
    assert marked, "no step left a request outside plain waiting"
    for rec in marked:
        snap = rec.snapshot
        assert len(snap.waiting_queues) == len(snap.waiting)
        assert snap.queue_of("C") == "kv_holding_waiting"
        # it is the request whose K/V is being loaded
        assert snap.request("C").status == "waiting_for_remote_kvs"
    # the other snapshots carry nothing: written as before the field existed
    plain = [r for r in recs if not r.snapshot.waiting_queues]
    assert plain and all("waiting_queues" not in r.snapshot.to_dict() for r in plain)
    assert all(r.snapshot.queue_of(w) == "waiting" for r in plain for w in r.snapshot.waiting)
    # the snapshot, the trace file and the payload keep it
    rec = marked[0]
    assert Snapshot.from_dict(json.loads(json.dumps(rec.snapshot.to_dict()))) == rec.snapshot
    text = "\n".join(
        [header_line(scenario_to_dict(eng.scenario), initial)] + [step_line(r) for r in recs]
    )
    trace = read_trace(text)
    assert [r.snapshot.waiting_queues for r in trace.records] == [
        r.snapshot.waiting_queues for r in recs
    ]
    steps = run_payload(initial, recs)["steps"]
    wq = WIRE["step"]["waiting_queues"]
    for rec, st in zip(recs, steps):
        if rec.snapshot.waiting_queues:
            assert st[wq]["queues"] == dict(zip(rec.snapshot.waiting, rec.snapshot.waiting_queues))
            assert st[wq]["source"] == WAITING_QUEUES_SOURCE
            assert WAITING_QUEUES_SOURCE.endswith("/vllm/v1/core/sched/scheduler.py")
        else:
            assert wq not in st


def test_a_trace_naming_an_unknown_queue_or_the_wrong_count_is_refused():
    eng, initial, recs = cpu_tier_holding_run()
    rec = next(r for r in recs if r.snapshot.waiting_queues)
    head = header_line(scenario_to_dict(eng.scenario), initial)
    for bad in (("running",), ("waiting", "waiting")):
        snap = dataclasses.replace(rec.snapshot, waiting_queues=bad)
        line = step_line(dataclasses.replace(rec, snapshot=snap))
        with pytest.raises(TraceError):
            read_trace(head + "\n" + line)


def test_the_admission_window_covers_the_queue_vllm_reorders_not_the_holding_queue():
    """Priority scheduling: Y (priority 1) is admitted before X (priority 2), which arrived
    first; no reorder put it there. With window 2, whether both were in vLLM's window decides the
    answer's verdict. A request H holding blocks at the head of kv_holding_waiting is not in the
    window (vLLM reorders ``waiting`` alone): X and Y are, so the window is no reason ("other").
    Were H in plain ``waiting``, the window would have been [H, Y] and X outside it."""
    eng = make_engine(
        [
            spec("Z", P[:5], max_tokens=3),
            spec("X", P[5:10], max_tokens=1, priority=2, arrival_step=1),
            spec("Y", P[10:15], max_tokens=1, priority=1, arrival_step=1),
        ],
        block_size=4,
        num_gpu_blocks=16,
        max_num_seqs=1,
        policy="priority",
        cache_aware_admission_window=2,
        cache_aware_admission_threshold=0.0,
    )
    initial = eng.snapshot()
    recs = eng.run()
    run = RecordedSteps(initial, tuple(recs), eng.settings)
    x = explain_order(run, "X", "Y")
    assert x.verdict == "other" and x.window == 2
    before = run.snapshot_before(x.step)
    assert before.waiting == ("Y", "X") and not before.waiting_queues

    def with_h(queue: str) -> RecordedSteps:
        snap = dataclasses.replace(
            before,
            waiting=("H", *before.waiting),
            waiting_queues=(queue, "waiting", "waiting") if queue != "waiting" else (),
        )
        i = x.step - 2  # the record whose snapshot is the state before Y's step
        records = list(recs)
        records[i] = dataclasses.replace(records[i], snapshot=snap)
        return RecordedSteps(initial, tuple(records), eng.settings)

    assert explain_order(with_h("kv_holding_waiting"), "X", "Y").verdict == "other"
    assert explain_order(with_h("async_kv_waiting"), "X", "Y").verdict == "other"
    # the combined list's answer, which the explanation used to give
    assert explain_order(with_h("waiting"), "X", "Y").verdict == "outside_window"
