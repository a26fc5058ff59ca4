"""LabRun (a cursor over a recorded run), quiz predictions and the myths, on the engine without a
model."""

from paged_kv_lab.content.myths import free_runs, internal_waste, lru_contrast, myth_sections, myths
from paged_kv_lab.content.quiz import make_prediction
from paged_kv_lab.run.engine import Engine, NoModelRunner
from paged_kv_lab.run.scenario import RequestSpec, load_scenario
from paged_kv_lab.store.timeline import LabRun
from support.words import FULL_RUN_S

SCENARIO = {
    "engine": {"block_size": 4, "num_gpu_blocks": 12, "max_num_seqs": 3},
    "requests": [
        {"id": "A", "prompt_token_ids": list(range(1, 14)), "max_tokens": 4, "ignore_eos": True},
        {
            "id": "B",
            "prompt_token_ids": list(range(100, 128)),
            "max_tokens": 6,
            "arrival_step": 4,
            "ignore_eos": True,
        },
        {
            "id": "C",
            "prompt_token_ids": list(range(1, 14)),
            "max_tokens": 4,
            "arrival_step": 10,
            "ignore_eos": True,
        },
    ],
}


def new_run(d=SCENARIO):
    return LabRun(load_scenario(d), lambda s: Engine(s, runner=NoModelRunner(), debug=True))


def test_step_back_goto_give_the_same_records():
    run = new_run()
    assert run.cursor == 0 and run.snapshot.step == 0 and run.record is None
    r1 = run.forward()
    r2 = run.forward()
    assert (r1.step, r2.step, run.cursor) == (1, 2, 2)
    run.back()
    assert run.snapshot is r1.snapshot
    assert run.forward() is r2, "stepping again after Back shows the very same record"
    run.goto(7)
    assert run.cursor == 7 and run.snapshot.step == 7
    run.goto(1)
    assert run.snapshot is r1.snapshot and len(run.records) >= 7
    run.run_to_end(timeout=FULL_RUN_S)
    assert run.finished and not run.can_forward()
    again = new_run()
    again.run_to_end(timeout=FULL_RUN_S)
    assert [r.to_dict() for r in again.records] == [r.to_dict() for r in run.records]


def test_run_until_and_reset():
    run = new_run()
    rec = run.run_until("evicted")
    assert rec is not None and any(e.kind == "evicted" for e in rec.events)
    assert run.cursor == rec.step
    assert run.run_until("preempted") is None and run.finished
    n = len(run.records)
    run.reset()
    assert run.cursor == 0 and len(run.records) == n, (
        "reset moves the cursor; nothing is recomputed"
    )


def test_add_request_replays_then_arrives_next_step():
    run = new_run()
    run.goto(3)
    before = [r.to_dict() for r in run.records[:3]]
    run.add_request(RequestSpec("D", prompt_token_ids=(1, 2, 3, 4, 5), max_tokens=2))
    assert run.cursor == 3 and [r.to_dict() for r in run.records[:3]] == before
    rec = run.forward()
    assert any(e.kind == "arrived" and e.request_id == "D" for e in rec.events)


def test_settings_rebuild():
    run = new_run()
    run.goto(5)
    run.replace_scenario(run.with_settings(num_gpu_blocks=30))
    assert run.cursor == 5 and run.snapshot.num_gpu_blocks == 30


def test_quiz_answers_are_what_the_engine_did():
    run = new_run()
    asked = set()
    while run.can_forward():
        snap = run.snapshot
        rec = run.peek_next()
        for lang, prefer in (("en", ()), ("zh", ()), ("en", ("allocated",))):
            p = make_prediction(snap, rec, lang, prefer)
            if p is None:
                continue
            asked.add(p.kind)
            assert 0 <= p.answer < len(p.options) and p.explain
            if p.kind == "alloc":
                alloc = next(e for e in rec.events if e.kind == "allocated")
                assert p.options[p.answer].endswith(str(alloc.block_ids[0]))
            if p.kind == "hit":
                assert (p.answer == 0) == any(e.kind == "cache_hit" for e in rec.events)
            if p.kind == "evict":
                ev = next(e for e in rec.events if e.kind == "evicted")
                assert p.options[p.answer].endswith(str(ev.block_ids[0]))
            if p.kind == "free":
                assert p.options[p.answer] == str(rec.snapshot.num_free_blocks)
        run.forward()
    assert {"alloc", "hit", "evict"} <= asked


def test_quiz_victim():
    d = {
        "engine": {"block_size": 2, "num_gpu_blocks": 8, "max_num_seqs": 3},
        "requests": [
            {"id": r, "prompt_token_ids": [i + 1, i + 2], "max_tokens": 8, "ignore_eos": True}
            for i, r in enumerate("ABC")
        ],
    }
    run = new_run(d)
    rec = None
    while run.can_forward():
        snap, rec = run.snapshot, run.peek_next()
        if any(e.kind == "preempted" for e in rec.events):
            break
        run.forward()
    p = make_prediction(snap, rec, "en", ("preempted",))
    victim = next(e.request_id for e in rec.events if e.kind == "preempted")
    assert p.kind == "victim" and p.options[p.answer] == victim == snap.running[-1]


def test_myths_on_the_live_pool():
    run = new_run()
    run.goto(12)
    snaps = run.snapshots()
    c = lru_contrast(snaps)
    assert c.vllm_order == run.snapshot.free_queue and sorted(c.timestamp_order) == sorted(
        c.vllm_order
    )
    runs = free_runs(run.snapshot)
    assert sum(b - a + 1 for a, b in runs) == len(run.snapshot.free_queue)
    waste, held = internal_waste(run.snapshot)
    assert 0 <= waste <= held
    for lang in ("en", "zh"):
        secs = myth_sections(snaps, lang, run.shown_records())
        assert len(secs) == len(myths()) and all(all(part for part in s) for s in secs)
        # the page shows each live text inside a markdown directive: no bracket may close it early
        assert not any(c in live for _, _, live in secs for c in "[]"), secs


def test_myths_are_computed_once_per_run_step_and_language():
    from paged_kv_lab.content.myths import myth_sections_at

    run = new_run()
    run.goto(12)
    calls = []

    def snaps():
        calls.append(1)
        return run.snapshots()

    first = myth_sections_at("run-x", 12, snaps, "en")
    assert myth_sections_at("run-x", 12, snaps, "en") is first and len(calls) == 1
    assert first == myth_sections(run.snapshots(), "en")
    run.goto(5)
    assert (
        myth_sections_at("run-x", 5, snaps, "en") == myth_sections(run.snapshots(), "en")
        and len(calls) == 2
    )


def test_a_failing_step_stops_the_run_with_its_reason():
    import pytest

    from paged_kv_lab.store.timeline import RunStopped

    calls = {"n": 0}

    class Flaky(NoModelRunner):
        def execute(self, items):
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("boom")
            return super().execute(items)

    run = LabRun(load_scenario(SCENARIO), lambda s: Engine(s, runner=Flaky()))
    run.forward()
    run.forward()
    with pytest.raises(RunStopped, match="step 3 failed: RuntimeError: boom"):
        run.forward()
    assert run.cursor == 2 and len(run.records) == 2 and run.error and run.finished
    run.back()
    assert run.forward().step == 2, "the recorded steps stay readable"


def test_check_requests_refuses_what_never_fits():
    import pytest

    from paged_kv_lab.store.timeline import check_requests

    d = {
        "engine": {"block_size": 2, "num_gpu_blocks": 4},
        "requests": [{"id": "X", "prompt_token_ids": list(range(1, 20)), "max_tokens": 2}],
    }
    with pytest.raises(ValueError, match="usable blocks"):
        check_requests(load_scenario(d), lambda s: Engine(s, runner=NoModelRunner()))


def lab_trace(run: LabRun, header: bool = True, outputs: bool = True):
    from paged_kv_lab.run.scenario import scenario_to_dict
    from paged_kv_lab.run.trace_file import Trace, read_trace

    run.run_to_end(timeout=FULL_RUN_S)
    t = Trace(
        scenario_to_dict(run.scenario) if header else None,
        run.initial if header else None,
        tuple(run.records),
        run.outputs() if outputs else None,
    )
    return read_trace(t.to_jsonl())


def test_trace_run_moves_like_a_lab_run_over_fixed_records():
    from paged_kv_lab.store.timeline import TraceRun

    live = new_run()
    tr = TraceRun(lab_trace(live))
    assert (
        tr.scenario == live.scenario
        and tr.cursor == 0
        and tr.snapshot == live.initial
        and tr.record is None
    )
    assert tr.forward() == live.records[0] and tr.cursor == 1
    tr.goto(7)
    assert tr.snapshot == live.records[6].snapshot and tr.snapshots() == live.snapshots(7)
    rec = tr.run_until("evicted")
    assert (
        rec is not None and rec.step == tr.cursor and any(e.kind == "evicted" for e in rec.events)
    )
    tr.goto(10_000)
    assert (
        tr.cursor == len(live.records) and tr.at_frontier and tr.finished and not tr.can_forward()
    )
    assert tr.forward() is None and tr.peek_next() is None and tr.cursor == len(live.records)
    assert tr.run_until("preempted") is None
    tr.back()
    assert tr.cursor == len(live.records) - 1 and tr.can_forward()
    tr.reset()
    assert tr.cursor == 0


def test_trace_run_without_header_starts_at_step_one():
    from paged_kv_lab.store.timeline import TraceRun

    live = new_run()
    tr = TraceRun(lab_trace(live, header=False, outputs=False))
    assert tr.scenario is None and tr.first == 1 and tr.cursor == 1 and tr.record == live.records[0]
    tr.back()
    tr.goto(0)
    assert tr.cursor == 1, "the state before step 1 is unknown: the cursor stays at step 1"
    assert tr.snapshots() == [live.records[0].snapshot]
    tr.run_to_end()
    tr.reset()
    assert tr.cursor == 1 and len(tr.snapshots()) == 1
