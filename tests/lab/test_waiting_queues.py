"""vLLM 0.34's three waiting queues in the recording (issue 44): a snapshot says which queue each
waiting request is in (``Snapshot.waiting_queues``, beside ``waiting``), only where one is outside
plain ``waiting``, so runs without such a request are recorded, written and encoded as before; the
trace file and the player's payload keep it; and "why was B admitted before A?" checks vLLM's
cache-aware window against the queue vLLM reorders (``waiting`` alone)."""

import dataclasses
import json
import sys

import pytest

from paged_kv_lab.player.payload import WAITING_QUEUES_SOURCE, WIRE, run_payload
from paged_kv_lab.recording.snapshot import Snapshot
from paged_kv_lab.run.engine import Engine, NoModelRunner
from paged_kv_lab.run.scenario import scenario_to_dict
from paged_kv_lab.run.trace_file import TraceError, header_line, read_trace, step_line
from paged_kv_lab.why.explain import RecordedSteps
from paged_kv_lab.why.explain_admission import explain_order
from support.kv import cpu_tier_holding_run
from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import offload_vs_vllm  # noqa: E402

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
    """CPU-tier trace 4 of bench/offload_vs_vllm.py (no failed load) with window 2 and threshold
    0: R3 finds its prefix on the CPU and waits in kv_holding_waiting while it loads; R4 arrives
    the next step and is admitted first. vLLM reorders ``waiting`` alone, so R3 was never in
    its window: the window is no reason for the order ("outside_window"). Read against the
    combined list, as the answer used to be, R3 heads the window and R4 has room behind it."""
    case = offload_vs_vllm.random_case(4)
    case["fail_loads"] = []
    scen = offload_vs_vllm.scenario(case)
    engine = dataclasses.replace(
        scen.engine, cache_aware_admission_window=2, cache_aware_admission_threshold=0.0
    )
    eng = Engine(dataclasses.replace(scen, engine=engine), runner=NoModelRunner())
    initial = eng.snapshot()
    recs = eng.run(max_steps=200)
    assert not eng.has_unfinished()
    run = RecordedSteps(initial, tuple(recs), eng.settings)
    x = explain_order(run, "R3", "R4")
    assert (x.verdict, x.window) == ("outside_window", 2)
    before = run.snapshot_before(x.step)
    assert before.waiting == ("R3",) and before.queue_of("R3") == "kv_holding_waiting"
    # the same records with every waiting request read as in plain waiting (the combined list)
    combined = RecordedSteps(
        initial,
        tuple(
            dataclasses.replace(r, snapshot=dataclasses.replace(r.snapshot, waiting_queues=()))
            for r in recs
        ),
        eng.settings,
    )
    assert explain_order(combined, "R3", "R4").verdict == "other"
    # the priority policy has no window in vLLM (Scheduler.cache_aware_window is 0)
    prio = RecordedSteps(initial, tuple(recs), dataclasses.replace(eng.settings, policy="priority"))
    assert explain_order(prio, "R3", "R4").verdict == "window_off"


def test_the_large_pool_frames_name_the_queues_as_the_snapshots_do():
    """The large-pool view's frames (recording/pool_frames.py) carry the same queues, on the wire
    only where one is outside plain waiting."""
    from paged_kv_lab.player.pool_payload import encode_frames
    from paged_kv_lab.recording.pool_frames import FrameRecorder
    from support.kv import make_engine, spec

    eng, _, recs = cpu_tier_holding_run()
    # the same run again, step by step, with the frame recorder beside the snapshots
    again = make_engine(
        [
            spec(r.id, r.prompt_token_ids, max_tokens=r.max_tokens, arrival_step=r.arrival_step)
            for r in eng.scenario.requests
        ],
        **{k: getattr(eng.settings, k) for k in ("block_size", "num_gpu_blocks", "cpu_offload")},
    )
    fr = FrameRecorder(again.scheduler, keyframe_every=4)
    for rec in recs:
        got = again.step()
        fr.capture(got.step, got.scheduled, got.events)
        assert got.snapshot.waiting_queues == rec.snapshot.waiting_queues
        assert fr.frames[-1].waiting == got.snapshot.waiting
        assert fr.frames[-1].waiting_queues == got.snapshot.waiting_queues
    wire = encode_frames(fr.frames)
    assert [w.get("wq", []) for w in wire] == [list(f.waiting_queues) for f in fr.frames]
    assert any("wq" in w for w in wire) and any("wq" not in w for w in wire)
