"""store/server_cache.py: a value computed once per key for every session, in the asking thread or
in the
background, with its error kept, the oldest values pushed out past ``keep``, and a stale value
replaced on demand."""

import threading
import time

import pytest

from paged_kv_lab.store.server_cache import Shared


def counter():
    calls = []

    def compute():
        calls.append(threading.current_thread().name)
        return len(calls)

    return calls, compute


def test_many_askers_one_computation():
    shared, calls = Shared("t"), []
    gate = threading.Event()

    def compute():
        calls.append(1)
        gate.wait(10)
        return "value"

    got = []

    def ask():
        got.append(shared.get("k", compute))

    askers = [threading.Thread(target=ask) for _ in range(8)]
    for t in askers:
        t.start()
    time.sleep(0.2)
    assert shared.peek("k") is None and not shared.ready("k"), "under way: nothing to peek yet"
    gate.set()
    for t in askers:
        t.join(10)
    assert got == ["value"] * 8 and calls == [1]


def test_start_computes_in_the_background_and_peek_never_waits():
    shared = Shared("t")
    gate = threading.Event()
    shared.start("k", lambda: gate.wait(10) and "done")
    t0 = time.monotonic()
    assert shared.peek("k") is None and time.monotonic() - t0 < 1.0
    shared.start("k", lambda: pytest.fail("a second start computes nothing"))
    gate.set()
    assert shared.wait("k", 10) == "done"
    assert shared.get("k", lambda: pytest.fail("ready: not computed again")) == "done"


def test_an_error_is_kept_and_raised_to_every_asker():
    shared, calls = Shared("t"), []

    def compute():
        calls.append(1)
        raise ValueError("refused")

    for _ in range(2):
        with pytest.raises(ValueError, match="refused"):
            shared.get("k", compute)
    with pytest.raises(ValueError, match="refused"):
        shared.peek("k")
    assert calls == [1]


def test_keep_pushes_out_the_oldest_and_again_after_replaces_a_stale_value():
    shared = Shared("t", keep=2)
    calls, compute = counter()
    for key in ("a", "b", "c"):
        shared.get(key, compute)
    assert [shared.ready(k) for k in ("a", "b", "c")] == [False, True, True]
    assert shared.get("c", compute, again_after=60.0) == 3, "fresh: kept"
    assert shared.get("c", compute, again_after=0.0) == 4, "stale: measured anew"
    shared.clear()
    assert not shared.ready("c")
