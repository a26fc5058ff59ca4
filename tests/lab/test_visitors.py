"""Visitors first (store/server_cache.py: Visitors, yielding, OwnedLock; store/run_store.py): while
a session draws a page, the work done ahead of visitors waits -- the warm-up thread at its stop
points, the run store's steps computed ahead -- and a page that itself waits for such work does not
hold it back. No browser: the policy itself, with the store's fake engines."""

import os
import threading
import time
from dataclasses import dataclass

import pytest

from paged_kv_lab.run.budget import Limits
from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.store import server_cache
from paged_kv_lab.store.run_store import RunStore
from paged_kv_lab.store.server_cache import (
    VISITORS,
    OwnedLock,
    ServerCache,
    Shared,
    Visitors,
    stop_point,
    yielding,
)
from paged_kv_lab.store.timeline import Timeline


@dataclass(frozen=True)
class Rec:
    step: int
    name: str


class Engine:
    """Steps ``n`` times, ``delay`` s each; ``log`` gets each step's name."""

    def __init__(self, name: str, log: list, n: int = 400, delay: float = 0.005) -> None:
        self.name, self.log, self.n, self.delay, self.done = name, log, n, delay, 0

    def snapshot(self):
        return ("initial", self.name)

    def has_unfinished(self) -> bool:
        return self.done < self.n

    def step(self):
        self.done += 1
        self.log.append(self.name)
        time.sleep(self.delay)
        return Rec(self.done, self.name)

    def outputs(self):
        return {}


@pytest.fixture(autouse=True)
def no_page_drawn():
    """Each test starts with no page drawn in the process (nor just drawn: its grace over)."""
    VISITORS.wait_idle(10.0)
    assert not VISITORS.busy()


def scenario(name: str):
    return load_scenario({"name": name, "requests": [{"id": "r", "prompt_token_ids": [1, 2]}]})


def in_thread(target, *args) -> threading.Thread:
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def test_a_page_counts_while_drawn_once_and_not_while_it_waits():
    v = Visitors(grace_s=0.0)
    assert not v.busy()
    with v.blocked():  # not drawing: nothing to take back
        assert (v.drawing_now, v.blocked_now) == (0, 0)
    with v.drawing():
        assert v.busy()
        with v.drawing():  # a nested draw is the same page
            assert v.drawing_now == 1
        with v.blocked():
            assert not v.busy()
            with v.blocked():
                assert v.blocked_now == 1
        assert v.busy()
    assert (v.drawing_now, v.blocked_now) == (0, 0) and not v.busy()


def test_wait_idle_returns_when_the_page_is_drawn_and_is_bounded():
    v = Visitors(grace_s=0.0)
    assert v.wait_idle(5.0) < 0.1  # nobody draws: no wait
    release = threading.Event()

    def page():
        with v.drawing():
            release.wait(10)

    t = in_thread(page)
    while not v.busy():
        time.sleep(0.005)
    assert 0.2 <= v.wait_idle(0.2) < 2.0  # bounded: gives up after its timeout
    threading.Timer(0.3, release.set).start()
    waited = v.wait_idle(10.0)
    t.join(5)
    assert 0.2 <= waited < 5.0 and not v.busy()


def page_drawn_for(seconds: float) -> threading.Thread:
    """A session drawing a page in another thread for ``seconds`` (the process's VISITORS)."""

    def page():
        with VISITORS.drawing():
            time.sleep(seconds)

    t = in_thread(page)
    while not VISITORS.busy():
        time.sleep(0.002)
    return t


def test_a_yielding_thread_waits_at_its_stop_points_while_a_page_is_drawn():
    page = page_drawn_for(0.6)
    t0 = time.monotonic()
    stop_point()  # an ordinary thread: no wait
    assert time.monotonic() - t0 < 0.3
    with yielding():
        stop_point()
    assert time.monotonic() - t0 >= 0.5, "the warm-up's stop point waited for the page"
    page.join(5)
    VISITORS.wait_idle(10.0)  # and its grace is over
    t0 = time.monotonic()
    with yielding():
        stop_point()  # nobody draws now
    assert time.monotonic() - t0 < 0.3


def test_a_yielding_thread_never_waits_holding_the_engine_lock():
    lock = OwnedLock()
    page = page_drawn_for(0.6)
    t0 = time.monotonic()
    with yielding(), lock:
        assert lock.locked()
        stop_point()  # a page may wait for this lock: no wait here
    assert time.monotonic() - t0 < 0.3 and not lock.locked()
    page.join(5)


def test_a_page_waiting_for_the_engine_lock_does_not_hold_the_warm_up_back():
    lock, seen = OwnedLock(), []
    lock.acquire()

    def page():
        with VISITORS.drawing():
            seen.append(VISITORS.busy())
            with lock:  # blocked here: not drawing meanwhile
                seen.append(VISITORS.busy())

    t = in_thread(page)
    time.sleep(0.2)
    assert not VISITORS.busy(), "a page blocked on the lock does not count"
    lock.release()
    t.join(5)
    assert seen == [True, True]


def test_a_page_waiting_for_a_value_the_warm_up_computes_gets_it_without_a_stall():
    """The warm-up computes a value with stop points inside (a replay's slices); a page that waits
    for that value is not drawing meanwhile, so the warm-up does not wait for it: no deadlock until
    the yield's bound (YIELD_MAX_S)."""
    kind = Shared("test visitors value", cache=ServerCache(10**9))
    started = threading.Event()

    def compute():
        started.set()
        for _ in range(20):
            stop_point()
            time.sleep(0.01)
        return "done"

    def warm():
        with yielding():
            kind.get("k", compute)

    t = in_thread(warm)
    started.wait(5)
    t0 = time.monotonic()
    with VISITORS.drawing():
        assert kind.get("k", lambda: "again") == "done"
    assert time.monotonic() - t0 < server_cache.YIELD_MAX_S / 2
    t.join(5)


def test_the_warm_up_runs_yielding(monkeypatch):
    """The warm-up's body (ui/warm_up.py) runs in a yielding thread: its stop points wait for a
    page being drawn."""
    from paged_kv_lab.ui import warm_up

    waited = []

    def body(ms):
        t0 = time.monotonic()
        stop_point()
        waited.append(time.monotonic() - t0)

    monkeypatch.setattr(warm_up, "_warm_up", body)
    page = page_drawn_for(0.5)
    warm_up.warm_up(None)
    page.join(5)
    assert waited and waited[0] >= 0.4


def test_work_ahead_waits_a_grace_after_a_page_is_drawn():
    """The page's browser draws what it was sent (and asks for the steps after) just after its
    script run: work ahead waits ``grace_s`` more."""
    v = Visitors(grace_s=0.4)
    with v.drawing():
        pass
    assert v.busy()
    waited = v.wait_idle(5.0)
    assert 0.2 <= waited < 2.0 and not v.busy()


def test_the_run_stores_steps_ahead_wait_a_shorter_grace_than_the_warm_up():
    """The warm-up waits ``PAGE_GRACE_S`` after a page (a new tab's browser loads the app's
    scripts meanwhile); the run store's steps ahead only ``AHEAD_GRACE_S``, as they are what that
    page's player asks for next and a session's far step waits for them."""
    from paged_kv_lab.store.server_cache import AHEAD_GRACE_S, PAGE_GRACE_S

    assert AHEAD_GRACE_S < PAGE_GRACE_S
    assert Visitors().ahead_grace_s == AHEAD_GRACE_S and Visitors(grace_s=0.0).ahead_grace_s == 0
    v = Visitors(grace_s=5.0, ahead_grace_s=0.2)
    with v.drawing():
        pass
    assert v.busy() and v.busy(ahead=True)
    time.sleep(0.3)
    assert v.busy() and not v.busy(ahead=True)


@pytest.fixture
def store():
    visitors = Visitors(grace_s=0.0)
    s = RunStore(
        max_bytes=10**9,
        max_steps=1000,
        limits=Limits(),
        background_pause=0.0,
        background_max_wait=0.5,
        visitors=visitors,
    )
    yield s, visitors
    s.close()


def test_steps_ahead_pause_while_a_page_is_drawn_and_clicks_do_not(store):
    s, visitors = store
    log: list[str] = []
    ahead = s.run(scenario("ahead"), lambda sc: Engine("ahead", log), model_key="ahead")
    click = s.run(scenario("click"), lambda sc: Engine("click", log), model_key="click")
    held = Timeline(ahead)  # computed ahead, to its end
    assert ahead.wait(3, 5, urgent=False)
    clicker = Timeline(click, ahead=False)
    with visitors.drawing():
        for _ in range(5):  # a session's clicks are still served at once
            assert clicker.forward() is not None
        time.sleep(0.05)  # a step under way ends
        before = len(ahead.records)
        time.sleep(1.2)
        during = len(ahead.records) - before
    assert during <= 4, f"{during} steps ahead while a page was drawn (at most one per 0.5 s)"
    assert clicker.cursor == 5
    t0 = len(ahead.records)
    time.sleep(0.3)
    assert len(ahead.records) - t0 >= 10, "steps ahead go on once the page is drawn"
    assert held


def test_a_page_waiting_for_steps_does_not_hold_them_back(store):
    s, visitors = store
    log: list[str] = []
    run = s.run(scenario("far"), lambda sc: Engine("far", log, n=50), model_key="far")
    tl = Timeline(run)
    with visitors.drawing():
        t0 = time.monotonic()
        assert run.wait(40, 5.0, urgent=False), "a far step the page waits for is computed"
        assert time.monotonic() - t0 < 4.0
    assert tl


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="no per-thread OS priority here")
def test_a_stored_values_size_is_walked_at_the_lowest_os_priority_and_the_warm_up_keeps_its_own(
    monkeypatch,
):
    """Shared(measure_later=True): the walk of a stored value's size runs in a thread of its own at
    the lowest OS priority (a browser on the same machine has the cores first); the warm-up's
    thread keeps the normal priority (its studies hold the engine lock); so does the caller."""
    from paged_kv_lab.ui import warm_up

    seen = {}

    def size(value, stop_every=0):
        seen["walk"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return 10

    monkeypatch.setattr(server_cache, "estimate_nbytes", size)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    kind = Shared("priority test", measure_later=True, size=size, cache=ServerCache(10**6))
    assert kind.get("k", lambda: [1, 2, 3]) == [1, 2, 3]
    deadline = time.monotonic() + 10
    while "walk" not in seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert seen["walk"] == server_cache.AHEAD_NICE == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine

    def body(ms):
        seen["warm_up"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    monkeypatch.setattr(warm_up, "_warm_up", body)
    t = threading.Thread(target=warm_up.warm_up, args=(None,))
    t.start()
    t.join(10)
    assert seen["warm_up"] == mine
