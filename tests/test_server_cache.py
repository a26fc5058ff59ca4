"""runs/server_cache.py: the one cache every session of a server shares, bounded by bytes:
entries of known size go least recently used first, a key is computed once however many ask at
once, entries in use stay below the hard limit, and everything sessions share goes through it."""

import threading
import time

import pytest

from paged_kv_lab.runs.server_cache import ServerCache, Shared, estimate_nbytes

JOIN_S = 10.0


def sized(cache, nbytes=100, **kw):
    """A kind whose every value weighs ``nbytes``."""
    return Shared("t", size=lambda _: nbytes, cache=cache, **kw)


def test_entries_of_known_size_go_least_recently_used_first_past_the_bytes():
    cache = ServerCache(max_bytes=300, hard_bytes=10**6)
    kind = sized(cache)
    for key in "abc":
        kind.get(key, lambda key=key: key.upper())
    assert cache.total_bytes == 300 and all(kind.ready(k) for k in "abc")
    assert kind.peek("a") == "A"  # used: now the most recent
    kind.get("d", lambda: "D")
    assert [kind.ready(k) for k in "abcd"] == [True, False, True, True], "b was the oldest"
    assert cache.total_bytes == 300
    big = sized(cache, nbytes=250)
    big.get("e", lambda: "E")
    assert big.ready("e"), "the entry just stored stays, even alone past the budget"
    assert [kind.ready(k) for k in "acd"] == [False, False, False]
    assert cache.total_bytes == 250 and cache.kinds() == {"t": (1, 250)}


def test_one_budget_across_kinds():
    cache = ServerCache(max_bytes=200, hard_bytes=10**6)
    studies, replays = sized(cache), sized(cache)
    studies.get("s", lambda: 1)
    replays.get("r", lambda: 2)
    studies.get("s2", lambda: 3)
    assert not studies.ready("s") and replays.ready("r") and studies.ready("s2")
    replays.clear()
    assert cache.total_bytes == 100 and not replays.ready("r")


def test_in_use_entries_stay_until_the_hard_limit_and_their_kind_is_told():
    cache = ServerCache(max_bytes=100, hard_bytes=250)
    held, told = {"a"}, []
    kind = sized(cache, in_use=lambda v: v in held, on_evict=lambda v, hard: told.append((v, hard)))
    kind.get("a", lambda: "a")
    kind.get("b", lambda: "b")
    assert kind.ready("a") and kind.ready("b"), "a is in use, b was just stored"
    kind.get("c", lambda: "c")
    assert kind.ready("a") and not kind.ready("b") and told == [("b", None)]
    pinned = sized(cache, nbytes=200, pinned=True)
    pinned.get("p", lambda: "p")
    # 100 (a) + 100 (c) + 200 (p): c goes first (not in use), and at 300 > 250 a goes too
    assert pinned.ready("p") and not kind.ready("a") and not kind.ready("c")
    assert told == [("b", None), ("c", None), ("a", 300)] and cache.total_bytes == 200


def test_a_key_is_computed_once_however_many_ask_at_once():
    cache = ServerCache(max_bytes=10**6)
    kind = Shared("t", cache=cache)
    calls, gate, got = [], threading.Event(), []

    def compute():
        calls.append(threading.current_thread().name)
        gate.wait(JOIN_S)
        return "value"

    start = threading.Barrier(16)

    def ask():
        start.wait(JOIN_S)
        got.append(kind.get("k", compute))

    askers = [threading.Thread(target=ask) for _ in range(16)]
    for t in askers:
        t.start()
    time.sleep(0.2)
    assert not kind.ready("k") and kind.peek("k") is None
    gate.set()
    for t in askers:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in askers)
    assert got == ["value"] * 16 and len(calls) == 1
    assert cache.total_bytes == estimate_nbytes("value")


def test_an_entry_being_computed_is_never_evicted():
    cache = ServerCache(max_bytes=100, hard_bytes=100)
    slow, quick = sized(cache), sized(cache)
    gate, calls = threading.Event(), []

    def compute():
        calls.append(1)
        gate.wait(JOIN_S)
        return "slow"

    slow.start("k", compute)
    for i in range(5):  # fill the cache past both limits meanwhile
        quick.get(i, lambda i=i: i)
    slow.start("k", lambda: pytest.fail("under way: not computed again"))
    gate.set()
    assert slow.wait("k", JOIN_S) == "slow" and calls == [1]


def test_errors_are_kept_unless_the_kind_says_not():
    cache = ServerCache(max_bytes=10**6)
    calls = []

    def fail():
        calls.append(1)
        raise ValueError("refused")

    kept, retried = Shared("kept", cache=cache), Shared("again", keep_errors=False, cache=cache)
    for kind in (kept, retried):
        for _ in range(2):
            with pytest.raises(ValueError, match="refused"):
                kind.get("k", fail)
    assert calls == [1, 1, 1], "a kept error is raised again; the other kind computes again"
    assert kept.ready("k") and not retried.ready("k")
