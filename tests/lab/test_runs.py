"""The run store: sharing, fair background computing, eviction by bytes, error isolation,
release."""

import gc
import threading
import time
from dataclasses import dataclass

import pytest

from paged_kv_lab.run.budget import BudgetError, Limits
from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.store.recorded_run import RecordedRun, estimate_nbytes, run_key
from paged_kv_lab.store.run_store import RunStore
from paged_kv_lab.store.timeline import LabRun, RunStopped, Timeline
from paged_kv_lab.store.token_text import Decoder
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
    ],
}


@dataclass(frozen=True)
class Rec:
    step: int
    payload: tuple


class FakeEngine:
    """Steps ``n`` times; each record carries ``size`` ints; step ``fail_at`` raises."""

    def __init__(self, n=5, size=10, fail_at=None, delay=0.0, log=None, name=""):
        self.n, self.size, self.fail_at, self.delay, self.log, self.name = (
            n,
            size,
            fail_at,
            delay,
            log,
            name,
        )
        self.step_count = 0
        self.kv_events = []

    def snapshot(self):
        return ("initial", self.name)

    def has_unfinished(self):
        return self.step_count < self.n

    def step(self):
        self.step_count += 1
        if self.log is not None:
            self.log.append((self.name, threading.get_ident()))
        if self.delay:
            time.sleep(self.delay)
        if self.step_count == self.fail_at:
            raise RuntimeError(f"{self.name} broke")
        self.kv_events.append("stored")
        return Rec(self.step_count, tuple(range(10_000, 10_000 + self.size)))

    def take_kv_events(self):
        taken, self.kv_events = self.kv_events, []
        return taken

    def outputs(self):
        return {"A": {"token_ids": [1], "text": "", "finish_reason": "length"}}


def sc(name="s", n_req=1):
    return load_scenario(
        {
            "name": name,
            "requests": [{"id": f"r{i}", "prompt_token_ids": [1, 2]} for i in range(n_req)],
        }
    )


@pytest.fixture
def store():
    s = RunStore(max_bytes=10**9, max_steps=400, limits=Limits())
    yield s
    s.close()


def test_identical_scenarios_share_one_run_and_the_key_is_stable(store):
    made = []

    def factory(s):
        made.append(s)
        return FakeEngine()

    a = store.run(sc("x"), factory, model_key=("m", "cpu", "float32"))
    b = store.run(
        load_scenario({"name": "x", "requests": [{"id": "r0", "prompt_token_ids": [1, 2]}]}),
        factory,
        model_key=("m", "cpu", "float32"),
    )
    assert a is b and len(made) == 1 and len(store) == 1
    assert run_key(("m", "cpu", "float32"), sc("x")) == a.key
    c = store.run(sc("x"), factory, model_key=("m", "cuda", "float32"))
    assert c is not a, "another device is another run"


def test_a_cursor_reads_steps_the_worker_computed(store):
    run = store.run(sc(), lambda s: FakeEngine(n=5), model_key="k")
    t = Timeline(run)
    assert run.wait(5, timeout=5) and run.done and run.error is None
    assert [r.step for r in run.records] == [1, 2, 3, 4, 5] and run.outputs()["A"][
        "finish_reason"
    ] == "length"
    assert t.forward().step == 1 and t.cursor == 1
    t.goto(10_000)
    assert t.cursor == 5 and t.finished and t.forward() is None, (
        "a step beyond the end shows the last step"
    )
    t.back()
    assert t.cursor == 4 and t.can_forward()


def test_the_kv_event_queue_is_taken_every_step(store):
    engines = []

    def factory(s):
        engines.append(FakeEngine(n=4))
        return engines[-1]

    run = store.run(sc(), factory, model_key="k")
    t = Timeline(run)
    assert run.wait(4, 5) and t
    assert engines[0].kv_events == []


def test_runs_interleave_round_robin(store):
    log = []
    runs = [
        store.run(
            sc(f"r{i}"),
            lambda s, i=i: FakeEngine(n=6, delay=0.002, log=log, name=f"r{i}"),
            model_key=f"k{i}",
        )
        for i in range(3)
    ]
    with store.lock:  # hold the engine: all three are wanted before the worker starts
        cursors = [Timeline(r) for r in runs]
    deadline = time.time() + 10
    while not all(r.done for r in runs) and time.time() < deadline:
        time.sleep(0.01)  # (no wait(): a waited-for run would go first)
    names = [n for n, _ in log]
    assert len(names) == 18
    for i in range(0, 18, 3):
        assert sorted(names[i : i + 3]) == ["r0", "r1", "r2"], f"one step each in turn, got {names}"
    assert len({tid for _, tid in log}) == 1, "one worker thread computes every step"
    assert cursors


def test_a_step_a_session_waits_for_goes_before_background_steps(store):
    log = []
    runs = [
        store.run(
            sc(f"r{i}"),
            lambda s, i=i: FakeEngine(n=50, delay=0.002, log=log, name=f"r{i}"),
            model_key=f"k{i}",
        )
        for i in range(3)
    ]
    with store.lock:
        cursors = [Timeline(r) for r in runs]
        waiter = threading.Thread(target=lambda: [cursors[2].forward() for _ in range(10)])
        waiter.start()
        time.sleep(0.05)
    waiter.join(10)
    first = [n for n, _ in log[:15]]
    assert first.count("r2") >= 9 and cursors[2].cursor == 10, first


def test_clicks_do_not_queue_behind_work_ahead_which_is_slowed_but_not_starved():
    """A session clicking Step at its frontier back to back gets its steps without waiting behind
    other runs' work ahead (the idle gap after each step is its window); the work ahead still gets a
    step each ``background_max_wait`` seconds."""
    store = RunStore(
        max_bytes=10**9,
        max_steps=400,
        limits=Limits(),
        background_pause=1.0,
        background_max_wait=0.25,
    )
    try:
        log = []
        ahead = store.run(
            sc("ahead"),
            lambda s: FakeEngine(n=300, delay=0.04, log=log, name="ahead"),
            model_key="ahead",
        )
        clicker = store.run(
            sc("click"),
            lambda s: FakeEngine(n=300, delay=0.04, log=log, name="click"),
            model_key="click",
        )
        ta, tc = Timeline(ahead), Timeline(clicker, ahead=False)
        assert ahead.wait(2, 5)
        log.clear()
        for _ in range(30):
            assert tc.forward() is not None
        names = [n for n, _ in log]
        behind = sum(1 for a, b in zip(names, names[1:]) if a == "ahead" and b == "click")
        assert names.count("click") == 30
        assert behind <= 10, f"{behind} of 30 clicks queued behind a step computed ahead: {names}"
        assert names.count("ahead") >= 1, "work ahead starved while another session clicked"
        assert ta
    finally:
        store.close()


def test_a_long_wait_is_not_urgent(store):
    """Run to end / a far step wait without priority: the other runs keep their turns."""
    log = []
    runs = [
        store.run(
            sc(f"r{i}"),
            lambda s, i=i: FakeEngine(n=30, delay=0.002, log=log, name=f"r{i}"),
            model_key=f"k{i}",
        )
        for i in range(2)
    ]
    with store.lock:
        cursors = [Timeline(r) for r in runs]
        waiter = threading.Thread(target=cursors[0].run_to_end, kwargs={"timeout": 10.0})
        waiter.start()
        time.sleep(0.05)
    waiter.join(10)
    first = [n for n, _ in log[:20]]
    assert 8 <= first.count("r0") <= 12, first


def test_one_failing_run_never_stops_the_others(store):
    bad = store.run(sc("bad"), lambda s: FakeEngine(n=6, fail_at=3, name="bad"), model_key="bad")
    good = store.run(sc("good"), lambda s: FakeEngine(n=6, name="good"), model_key="good")
    tb, tg = Timeline(bad), Timeline(good)
    assert good.wait(6, 5) and good.error is None
    assert bad.wait(6, 5) is False and bad.done and len(bad.records) == 2
    assert "step 3 failed: RuntimeError: bad broke" in bad.error
    tb.goto(2)
    with pytest.raises(RunStopped, match="bad broke"):
        tb.forward()
    assert tg.forward().step == 1


def test_a_run_nobody_holds_stops_being_computed(store):
    gate = threading.Event()

    class Slow(FakeEngine):
        def step(self):
            gate.wait(5)
            return super().step()

    run = store.run(sc(), lambda s: Slow(n=300, delay=0.01), model_key="k")
    t = Timeline(run)
    gate.set()
    assert run.wait(3, 5)
    del t
    gc.collect()
    time.sleep(0.2)
    n = len(run.records)
    time.sleep(0.3)
    assert len(run.records) <= n + 1 and not run.done, "the worker left the run nobody plays"
    t2 = Timeline(run)  # a new session picks it up where it stopped
    assert run.wait(n + 5, 5) and t2


def test_eviction_by_bytes_keeps_held_runs(store):
    small = RunStore(max_bytes=1, hard_bytes=10**9, limits=Limits())
    try:
        a = small.run(sc("a"), lambda s: FakeEngine(n=3, size=1000), model_key="a")
        ta = Timeline(a)
        assert a.wait(3, 5)
        b = small.run(sc("b"), lambda s: FakeEngine(n=3, size=1000), model_key="b")
        assert a.key in small and b.key in small, "a held run is not evicted"
        del ta
        gc.collect()
        c = small.run(sc("c"), lambda s: FakeEngine(n=3, size=1000), model_key="c")
        assert a.key not in small and b.key not in small and c.key in small, (
            "unheld runs go, oldest first"
        )
        assert small.total_bytes == c.nbytes
        assert a.records and a.done, "a forgotten run stays readable to whoever still has it"
    finally:
        small.close()


def test_hard_limit_stops_held_runs_with_a_reason():
    hard = RunStore(max_bytes=1, hard_bytes=200_000, limits=Limits())
    try:
        a = hard.run(sc("a"), lambda s: FakeEngine(n=400, size=2000), model_key="a")
        ta = Timeline(a)
        assert a.wait(400, 5) is False and a.done
        assert "PAGED_KV_LAB_RUN_STORE_HARD_BYTES" in a.error and ta
        kind, fields = a.error_key  # what a page says, in its own language
        from paged_kv_lab.text.i18n import tr

        for lang in ("en", "zh"):
            said = tr("run_store_full", lang, **fields)
            assert kind == "store_full" and "PAGED_KV_LAB_RUN_STORE_HARD_BYTES=200,000" in said
        assert hard.total_bytes <= 200_000 + estimate_nbytes(a.records[-1]) * 2
    finally:
        hard.close()


def test_step_cap_ends_the_run_with_its_knob():
    capped = RunStore(max_steps=7, limits=Limits())
    try:
        run = capped.run(sc(), lambda s: FakeEngine(n=100), model_key="k")
        t = Timeline(run)
        t.run_to_end(timeout=FULL_RUN_S)
        assert run.done and len(run.records) == 7 and t.cursor == 7
        assert "PAGED_KV_LAB_MAX_RUN_STEPS" in run.error and run.outputs() is not None
    finally:
        capped.close()


def test_budget_is_checked_before_the_engine_is_built(store):
    built = []
    big = load_scenario({"engine": {"num_gpu_blocks": 100_000}, "requests": []})
    with pytest.raises(BudgetError, match="PAGED_KV_LAB_MAX_BLOCKS"):
        store.run(big, lambda s: built.append(s), model_key="k")
    assert built == [] and len(store) == 0


def test_decoder_is_bounded_and_shared_across_threads():
    calls = []
    d = Decoder(lambda ids: calls.append(ids) or ",".join(map(str, ids)), max_entries=50)
    threads = [
        threading.Thread(target=lambda k=k: [d([k, i % 80]) for i in range(400)]) for k in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(d) <= 50 and d([1, 2]) == "1,2"


# -- on the real engine (no model) ----------------------------------------------------------------
def engine_factory(s):
    from paged_kv_lab.run.engine import Engine, NoModelRunner

    return Engine(s, runner=NoModelRunner(), debug=True)


def test_a_shared_run_equals_a_fresh_engine_step_by_step(store):
    from paged_kv_lab.run.engine import Engine, NoModelRunner

    scenario = load_scenario(SCENARIO)
    one = Timeline(store.run(scenario, engine_factory, model_key="no-model"))
    two = Timeline(store.run(load_scenario(SCENARIO), engine_factory, model_key="no-model"))
    assert one.run is two.run
    one.run_to_end(timeout=10)
    fresh = Engine(scenario, runner=NoModelRunner())
    assert fresh.snapshot() == one.initial
    expected = fresh.run()
    assert [r.to_dict() for r in one.records] == [r.to_dict() for r in expected]
    two.goto(3)
    assert two.snapshot == expected[2].snapshot and one.cursor == len(expected), (
        "each session its own cursor"
    )


def test_lab_run_add_request_is_a_new_run_with_the_cursor_kept(store):
    from paged_kv_lab.run.scenario import RequestSpec

    run = LabRun(load_scenario(SCENARIO), engine_factory, store)
    run.goto(3)
    before = [r.to_dict() for r in run.records[:3]]
    old = run.run
    run.add_request(RequestSpec("D", prompt_token_ids=(1, 2, 3, 4, 5), max_tokens=2))
    assert run.run is not old and run.cursor == 3
    assert [r.to_dict() for r in run.records[:3]] == before
    assert any(e.kind == "arrived" and e.request_id == "D" for e in run.forward().events)


def test_a_trace_file_is_a_finished_run(store):
    from paged_kv_lab.run.scenario import scenario_to_dict
    from paged_kv_lab.run.trace_file import Trace, read_trace

    live = Timeline(store.run(load_scenario(SCENARIO), engine_factory, model_key="no-model"))
    live.run_to_end(timeout=10)
    trace = read_trace(
        Trace(
            scenario_to_dict(live.scenario), live.initial, tuple(live.records), live.outputs()
        ).to_jsonl()
    )
    run = store.trace_run(trace)
    assert (
        isinstance(run, RecordedRun)
        and run.done
        and run.error is None
        and run is store.trace_run(trace)
    )
    assert [r.to_dict() for r in run.records] == [r.to_dict() for r in live.records]
