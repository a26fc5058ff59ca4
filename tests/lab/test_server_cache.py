"""runs/server_cache.py: the one cache every session of a server shares, bounded by bytes:
entries of known size go least recently used first, a key is computed once however many ask at
once, entries in use stay below the hard limit, and everything sessions share goes through it."""

import ast
import threading
import time

import pytest

from paged_kv_lab.store.server_cache import ServerCache, Shared, default_cache, estimate_nbytes
from support.paths import ROOT

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


def test_a_value_long_to_walk_is_measured_once_stored():
    cache = ServerCache(max_bytes=10**6)
    gate = threading.Event()

    def size(value):
        gate.wait(JOIN_S)
        return 1234

    kind = Shared("t", size=size, measure_later=True, cache=cache)
    assert kind.get("k", lambda: "v") == "v", "its asker does not wait for the walk"
    assert kind.nbytes("k") == 0 and cache.total_bytes == 0
    gate.set()
    deadline = time.monotonic() + JOIN_S
    while kind.nbytes("k") != 1234 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kind.nbytes("k") == 1234 and cache.total_bytes == 1234


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


# -- everything sessions share goes through it ---------------------------------------------
def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_streamlit_caches_only_the_model():
    """``st.cache_resource`` / ``st.cache_data`` hold no shared value but the loaded model (and
    its tokenizer, which rides with it): everything else is in the one cache."""
    found = []
    for path in sorted((ROOT / "paged_kv_lab").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        decorating = {}  # id of a decorator's node -> the function it decorates
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for dec in node.decorator_list:
                    for sub in ast.walk(dec):
                        decorating[id(sub)] = node.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("cache_resource", "cache_data"):
                where = decorating.get(id(node), f"line {node.lineno}")
                found.append(f"{path.relative_to(ROOT).as_posix()}:{where}")
    assert found == ["paged_kv_lab/ui/modelstate.py:_load"]


def test_every_kind_sessions_share_is_in_the_process_cache():
    """Runs (a fleet lesson's and case's among them), topic studies, memory profiles, the shipped
    trace, replays, their filled checkpoints, moments' windows, sweeps, Real workloads' fleets,
    fleet cases' bounds and the warm-up's mark: each a ``Shared`` of the process's one cache."""
    from paged_kv_lab.store.run_store import default_store
    from paged_kv_lab.ui import (
        casebook_page,
        fleet_workloads,
        how_many_blocks,
        topic_pages,
        warm_up,
        workloads_page,
    )
    from paged_kv_lab.workloads import page_data as workloads_data

    kinds = {
        "runs": default_store()._kind,
        "topics": topic_pages.STUDIES,
        "memory profiles": how_many_blocks.PROFILES,
        "shipped traces": workloads_data.SHIPPED,
        "workloads": workloads_page.RUNS,
        "filled checkpoints": workloads_page.FILLED,
        "moment windows": workloads_page.WINDOWS,
        "sweeps": workloads_page.SWEEPS,
        "fleet case bounds": casebook_page.BOUNDS,
        "fleet workloads": fleet_workloads.FLEETS,
        "warm-up": warm_up.WARM_UPS,
    }
    for name, kind in kinds.items():
        assert isinstance(kind, Shared) and kind.name == name and kind.cache is default_cache()
    # and no other Shared is made in the lab with a cache of its own
    for path in sorted((ROOT / "paged_kv_lab").rglob("*.py")):
        for call in _calls(ast.parse(path.read_text(encoding="utf-8"))):
            if _dotted(call.func) == "Shared" and any(k.arg == "cache" for k in call.keywords):
                assert path.name == "run_store.py", f"{path}: a Shared outside the process's cache"


def _measured(kind: Shared, key) -> int:
    deadline = time.monotonic() + 60
    while not kind.nbytes(key) and time.monotonic() < deadline:
        time.sleep(0.02)
    return kind.nbytes(key)


def test_runs_replays_and_fleets_are_stored_in_the_process_cache_with_their_sizes():
    """A recorded run, a replay, a sweep and a fleet of Real workloads, each computed through the
    page's own function, is an entry of the process's cache, sized as documented
    (docs/class-server.md): a run its ``nbytes``, the others measured over what they hold."""
    from paged_kv_lab.run.budget import Limits
    from paged_kv_lab.run.engine import Engine, NoModelRunner
    from paged_kv_lab.run.scenario import load_scenario
    from paged_kv_lab.store.run_store import default_store
    from paged_kv_lab.ui import fleet_workloads, workloads_page
    from paged_kv_lab.workloads.page_data import Settings
    from paged_kv_lab.workloads.trace_formats import load_trace
    from paged_kv_lab.workloads.trace_limits import page_trace_limits

    store = default_store()
    scenario = load_scenario(
        {"requests": [{"id": "A", "prompt_token_ids": [1, 2, 3], "max_tokens": 2}]}
    )
    run = store.run(
        scenario,
        lambda s: Engine(s, runner=NoModelRunner()),
        model_key="no-model:test_server_cache",
        limits=Limits(),
    )
    assert store._kind.nbytes(run.key) == run.nbytes > 0

    limits = page_trace_limits()
    trace = load_trace(ROOT / "tests" / "fixtures" / "mooncake_shared_slice.jsonl").slice(0, 4)
    settings = Settings(num_gpu_blocks=min(10_000, limits.max_num_gpu_blocks))
    replay = workloads_page.shared_run("test:server_cache", trace, settings, limits)
    key = ("test:server_cache", settings)
    assert _measured(workloads_page.RUNS, key) == estimate_nbytes(replay)

    fleet = fleet_workloads.fleet_result("test:server_cache", trace, settings, 2, "prefix")
    key = ("test:server_cache", settings, 2, "prefix")
    assert fleet_workloads.FLEETS.nbytes(key) == estimate_nbytes(fleet)
    assert {"runs", "workloads", "fleet workloads"} <= set(default_cache().kinds())


def test_the_collector_pauses_until_the_last_thread_leaves():
    """``collector_paused``: the cyclic collector is off while any thread is inside such a block,
    on again when the last one leaves (two threads overlapping), and stays off if it was off."""
    import gc

    from paged_kv_lab.store.server_cache import collector_paused

    assert gc.isenabled()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    with collector_paused():
        assert not gc.isenabled()
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread is still inside
    leave.set()
    t.join(10)
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # off before: off after
    finally:
        gc.enable()
