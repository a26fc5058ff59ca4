"""A fleet of replicas behind a router (paged_kv_lab/fleet): the replicas are the replay's engine,
the router's index is what the KV events say, each policy routes as its source describes, and
``python -m paged_kv_lab fleet`` keeps its JSON contract. Model-free, on the 40-request test
slice."""

import json

import pytest

from paged_kv_lab.cli.main import main
from paged_kv_lab.fleet.router import (
    ApproxTree,
    DynamoKv,
    FleetRequest,
    ReplicaView,
    RouterError,
    Session,
    policies,
    router_settings,
)
from paged_kv_lab.fleet.trace_fleet import fleet_replay, sub_trace, trace_fleet
from paged_kv_lab.workloads.replay import replay, replay_settings
from paged_kv_lab.workloads.trace_formats import load_trace
from support.paths import FIXTURES, ROOT

SLICE = FIXTURES / "traces" / "mooncake_slice.jsonl"
BAILIAN = FIXTURES / "traces" / "bailian_synthetic.jsonl"
SMALL = {"block_size": 512, "num_gpu_blocks": 140}


@pytest.fixture(scope="module")
def trace():
    return load_trace(SLICE)


@pytest.mark.parametrize("arrival", ["sequential", "timestamps"])
def test_a_fleet_of_one_is_the_replay(trace, arrival):
    settings = replay_settings(trace, SMALL, arrival=arrival)
    one = replay(trace, settings)
    f = fleet_replay(trace, settings, 1, "round_robin")
    assert [p.hit_tokens for p in f.per_request] == [r.hit_tokens for r in one.per_request]
    assert (f.hit_tokens, f.queries, f.evictions) == (one.hit_tokens, one.queries, one.evictions)
    assert f.replicas[0].steps == one.steps


def test_the_index_is_exactly_the_pools_cached_hashes(trace):
    """Built only from the events on the wire, the router's index ends equal to what each
    replica's pool holds in its prefix cache."""
    from kvcore.core.kv_cache_utils import maybe_convert_block_hash
    from kvcore.distributed.kv_events import hash_text

    fleet = trace_fleet(trace, replay_settings(trace, SMALL, arrival="timestamps"), 3, "prefix")
    fleet.run()
    assert fleet.index.events > 0
    for j, r in enumerate(fleet.replicas):
        table = r.block_pool.cached_block_hash_to_block._cache
        truth = {hash_text(maybe_convert_block_hash(key[:-4])) for key in table}
        assert set(fleet.index.blocks(j)) == set(truth)


def test_the_index_takes_each_batch_equal_to_its_encoding_on_the_wire():
    """The index takes each published batch as an object; decoding the bytes a listener got
    gives an equal batch, every time, over the whole shipped trace with a lagging index (so
    routing on the objects is routing on the wire's bytes), and an index built from the bytes
    ends equal."""
    from kvcore.distributed.kv_events import decode_batch
    from paged_kv_lab.fleet.index import GlobalIndex
    from paged_kv_lab.workloads import SHIPPED_TRACE

    whole = load_trace(SHIPPED_TRACE)
    settings = replay_settings(
        whole,
        {"block_size": 512, "num_gpu_blocks": 4000},
        arrival="timestamps",
        step_ms=6,
        token_ms=0.02,
    )
    fleet = trace_fleet(whole, settings, 4, "dynamo", {"kv_event_lag_ms": 50})
    wire, objects = [], []
    fleet.add_listener(lambda j, t, payload: wire.append((j, t, payload)))
    publish = fleet.index.publish
    fleet.index.publish = lambda j, t, batch: (objects.append(batch), publish(j, t, batch))
    fleet.run()
    assert len(wire) == len(objects) > 1000
    assert all(decode_batch(p) == b for (_, _, p), b in zip(wire, objects))
    ref = GlobalIndex(4)
    for j, t, payload in wire:
        ref.publish(j, t, payload)
    ref.deliver(None)
    assert [x.state() for x in ref.replicas] == [x.state() for x in fleet.index.replicas]


@pytest.mark.parametrize("policy", policies())
def test_every_policy_routes_each_request_once_and_repeats_itself(trace, policy):
    t = trace.slice(0, 12)
    settings = replay_settings(t, SMALL, arrival="timestamps")
    a = fleet_replay(t, settings, 3, policy).to_dict()
    if policy in ("random", "dynamo", "approx"):  # seeded or stateful: the same choices again
        b = fleet_replay(t, settings, 3, policy).to_dict()
        assert [p["replica"] for p in a["per_request"]] == [p["replica"] for p in b["per_request"]]
    assert sum(r["requests"] for r in a["replicas"]) == 12
    assert a["hit_tokens"] == sum(p["hit_tokens"] for p in a["per_request"])
    for p in a["per_request"]:
        assert len(p["router"]["overlap_blocks"]) == 3 and len(p["router"]["load"]) == 3


def test_prefix_routing_beats_round_robin_and_a_stale_index_costs_hits(trace):
    settings = replay_settings(trace, SMALL, arrival="timestamps")
    rr = fleet_replay(trace, settings, 3, "round_robin")
    pre = fleet_replay(trace, settings, 3, "prefix")
    stale = fleet_replay(trace, settings, 3, "prefix", {"kv_event_lag_ms": 1e9})
    assert pre.hit_rate > 2 * rr.hit_rate
    assert stale.hit_rate < pre.hit_rate
    # A lag longer than the trace: the index is empty at every decision.
    assert all(sum(p.decision.overlap_blocks) == 0 for p in stale.per_request)
    # prefix: the chosen replica has the longest overlap
    for p in pre.per_request:
        assert p.decision.overlap_blocks[p.replica] == max(p.decision.overlap_blocks)


def test_session_affinity_keeps_a_conversation_and_moves_few_on_growth():
    t = load_trace(BAILIAN)
    f = fleet_replay(t, replay_settings(t, {"block_size": 16}), 3, "session")
    by_chat = {}
    for p, r in zip(f.per_request, t.requests):
        root = p.decision.detail["session"]
        by_chat.setdefault(root, set()).add(p.replica)
    assert all(len(v) == 1 for v in by_chat.values())
    s = Session(router_settings())
    keys = [f"chat-{i}" for i in range(2000)]
    before = [s.owner(k, 4) for k in keys]
    after = [s.owner(k, 5) for k in keys]
    moved = sum(a != b for a, b in zip(before, after))
    assert all(b == a for a, b in zip(before, after) if b != 4)  # only to the new replica
    assert 0.1 < moved / len(keys) < 0.3  # about 1/5


def _views(*rows):
    return [ReplicaView(i, *row) for i, row in enumerate(rows)]


def test_dynamo_cost_trades_overlap_against_load():
    router = DynamoKv(router_settings())
    req = FleetRequest("r", 160, "s", tuple("abcdefghij"), 16)  # 10 blocks
    # fields: overlap, running, waiting, used, usable, prefill tokens, cached, active, incoming
    # replica 0: 8 blocks cached, 32 prompt tokens still to prefill, 30 distinct active blocks of
    # which 8 are this prompt's; replica 1: nothing cached, idle.
    busy = (8, 2, 0, 30, 100, 32, 8, 30, 2)
    idle = (0, 0, 0, 0, 100, 0, 0, 0, 10)
    costs = router.costs(req, _views(busy, idle))
    assert costs == [(32 / 16 + 10 - 8) + 30 + 2, 10 + 0 + 10]
    assert router.choose(req, _views(busy, idle)).replica == 1
    light = (8, 0, 0, 5, 100, 0, 8, 5, 2)
    assert router.choose(req, _views(light, idle)).replica == 0  # 2 + 7 < 20
    d = router.choose(req, _views(light, idle)).to_dict()
    assert d["cost"] == [9.0, 20.0] and d["overlap_blocks"] == [8, 0]


def test_approx_follows_sglang_thresholds():
    router = ApproxTree(router_settings({"balance_abs_threshold": 2}))
    a = FleetRequest("a", 64, "s", ("x", "y", "z", "w"), 16)
    idle = _views((0, 0, 0, 0, 10, 0), (0, 0, 0, 0, 10, 0))
    first = router.choose(a, idle)
    assert first.rule == "approx_smallest_tree"
    again = router.choose(a, idle)
    assert again.rule == "approx_cache_hit" and again.replica == first.replica
    busy = list(idle)
    busy[first.replica] = ReplicaView(first.replica, 0, 9, 0, 0, 10, 0)
    assert router.choose(a, busy).rule == "approx_imbalanced"


def test_bad_router_settings_are_named():
    with pytest.raises(RouterError, match="unknown router setting"):
        router_settings({"nope": 1})
    with pytest.raises(RouterError, match="load_metric"):
        router_settings({"load_metric": "x"})
    assert main(["fleet", str(SLICE), "--set", "kv_event_lag_ms=5"]) == 2  # needs timestamps


def test_cli_json_contract_and_sweep(tmp_path, capsys):
    out = tmp_path / "f.json"
    args = ["fleet", str(SLICE), "--replicas", "3", "--router", "dynamo", "--requests", "12"]
    assert (
        main([*args, "--set", "block_size=512", "--set", "num_gpu_blocks=140", "--json", str(out)])
        == 0
    )
    d = json.loads(out.read_text())
    for key in ("requests", "prompt_tokens", "hit_tokens", "hit_rate", "evictions", "preemptions"):
        assert key in d
    assert len(d["replicas"]) == 3 and len(d["per_request"]) == 12
    assert [p["request_id"] for p in d["per_request"]] == [str(i) for i in range(12)]
    assert {"replica", "hit_tokens"} <= set(d["per_request"][0])
    assert "cost" in d["per_request"][0]["router"]
    capsys.readouterr()
    assert (
        main(
            [
                "fleet",
                str(SLICE),
                "--requests",
                "12",
                "--set",
                "block_size=512",
                "--sweep",
                "replicas=1,2",
                "--workers",
                "1",
                "--json",
            ]
        )
        == 0
    )
    s = json.loads(capsys.readouterr().out)
    assert [p["value"] for p in s["points"]] == [1, 2]
    assert [len(p["result"]["replicas"]) for p in s["points"]] == [1, 2]


@pytest.mark.parametrize("arrival", ["sequential", "timestamps"])
def test_each_replica_runs_exactly_the_replay_of_its_sub_trace(trace, arrival):
    settings = replay_settings(trace, SMALL, arrival=arrival)
    fleet = trace_fleet(trace, settings, 3, "prefix")
    fleet.run()
    for j, r in enumerate(fleet.replicas):
        sub = sub_trace(fleet, j)
        alone = replay(sub, replay_settings(sub, SMALL, arrival=arrival))
        assert [x.hit_tokens for x in alone.per_request] == [
            r.hit_tokens[i] for i in fleet.routed[j]
        ]
        assert alone.evictions == r.evictions and alone.preemptions == r.preemptions


def test_fast_forward_changes_nothing_in_a_fleet(trace):
    runs = []
    for ff in (True, False):
        settings = replay_settings(trace, SMALL, arrival="timestamps", fast_forward=ff)
        d = fleet_replay(trace, settings, 3, "dynamo").to_dict()
        runs.append(([p["replica"] for p in d["per_request"]], d["per_request"], d["replicas"]))
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    strip = [[{k: v for k, v in r.items() if k != "simulated_s"} for r in x[2]] for x in runs]
    assert strip[0] == strip[1]


# -- the router registry -----------------------------------------------------------------------


def test_every_router_has_its_sentences_in_every_language():
    """A registered policy names itself, its source and its why (``fleet.why.<name>``) in every
    language; a policy whose decisions take several branches has a sentence per branch
    (``fleet.rule.<rule>``)."""
    from paged_kv_lab.fleet.router import ROUTERS
    from paged_kv_lab.text.i18n import LANGS, catalogue

    cat = catalogue()
    for name, cls in ROUTERS.items():
        keys = [f"fleet.router.{name}", f"fleet.router.{name}.source", f"fleet.why.{name}"]
        if len(cls.rules) > 1:
            keys += [f"fleet.rule.{r}" for r in cls.rules]
        for key in keys:
            assert key in cat, key
            assert set(LANGS) <= set(cat[key]), (key, sorted(cat[key]))


def _why_texts(decision, settings) -> list[str]:
    from paged_kv_lab.fleet.router import router_class
    from paged_kv_lab.text.i18n import LANGS, tr

    texts = [tr(router_class(decision.policy).why(decision, settings), lang) for lang in LANGS]
    for text in texts:
        assert "{" not in text and "fleet." not in text, text
        assert str(decision.replica) in text, text
    return texts


@pytest.mark.parametrize("policy", policies())
def test_every_decision_of_every_router_says_why_in_its_own_numbers(trace, policy):
    t = trace.slice(0, 12)
    f = fleet_replay(t, replay_settings(t, SMALL, arrival="timestamps"), 3, policy)
    for p in f.per_request:
        en = _why_texts(p.decision, f.router_settings)[0]
        if p.decision.score is not None and p.decision.score_name == "cost":
            assert f"{p.decision.score[p.replica]:g}" in en
        if p.decision.policy == "session":
            assert p.decision.detail["session"] in en


def test_every_branch_of_a_router_has_a_sentence_that_names_what_it_compared():
    settings = router_settings({"balance_abs_threshold": 2})
    a = FleetRequest("a", 64, "s", ("x", "y", "z", "w"), 16)
    idle = _views((0, 0, 0, 0, 10, 0), (0, 0, 0, 0, 10, 0))
    router = ApproxTree(settings)
    first = router.choose(a, idle)
    again = router.choose(a, idle)
    busy = list(idle)
    busy[first.replica] = ReplicaView(first.replica, 0, 9, 0, 0, 10, 0)
    imbalanced = router.choose(a, busy)
    seen = {}
    for d in (first, again, imbalanced):
        seen[d.rule] = _why_texts(d, settings)[0]
    assert set(seen) == set(ApproxTree.rules)
    assert "threshold" in seen["approx_smallest_tree"] and "100.0%" in seen["approx_cache_hit"]
    assert "9, 0" in seen["approx_imbalanced"] or "0, 9" in seen["approx_imbalanced"]
    from paged_kv_lab.fleet.router import LeastLoaded, PrefixAware

    load = _views((0, 2, 0, 50, 100, 0), (3, 1, 0, 10, 100, 0))
    for metric, rule, shown in (
        ("requests", "least_requests", "2, 1"),
        ("kv_usage", "least_kv_usage", "50.0%, 10.0%"),
    ):
        s = router_settings({"load_metric": metric})
        d = LeastLoaded(s).choose(a, load)
        assert d.rule == rule and d.replica == 1 and shown in _why_texts(d, s)[0]
    s = router_settings()
    hit = PrefixAware(s).choose(a, load)
    cold = PrefixAware(s).choose(a, _views((0, 2, 0, 0, 100, 0), (0, 1, 0, 0, 100, 0)))
    assert (hit.rule, hit.replica, cold.rule, cold.replica) == (
        "prefix_longest",
        1,
        "prefix_none_least_loaded",
        1,
    )
    assert "0, 3" in _why_texts(hit, s)[0] and "2, 1" in _why_texts(cold, s)[0]


def test_the_docs_list_every_router():
    from paged_kv_lab.fleet.router import ROUTERS

    page = (ROOT / "docs" / "fleet.md").read_text(encoding="utf-8")
    for name in ROUTERS:
        assert f"| `{name}` |" in page, name


@pytest.fixture
def first_router():
    """A router registered here, with a setting of its own: replica ``first_pick`` always."""
    from paged_kv_lab.fleet.router import ROUTERS, Decision, Router, router

    @router("always_first")
    class AlwaysFirst(Router):
        defaults = {"first_pick": 0}

        @classmethod
        def check(cls, settings):
            if settings["first_pick"] < 0:
                raise RouterError("first_pick: must be >= 0")

        def choose(self, request, views):
            i = min(self.settings["first_pick"], len(views) - 1)
            over = tuple(v.overlap_blocks for v in views)
            return Decision(i, self.name, "always_first", over, tuple(v.requests for v in views))

    try:
        yield "always_first"
    finally:
        ROUTERS.pop("always_first")


def test_a_router_registered_here_is_a_cli_choice_with_its_own_setting(first_router, tmp_path):
    from paged_kv_lab.fleet.router import router_defaults

    assert first_router in policies() and router_defaults()["first_pick"] == 0
    out = tmp_path / "f.json"
    args = ["fleet", str(SLICE), "--requests", "6", "--replicas", "3", "--router", first_router]
    args += ["--set", "block_size=512", "--set", "first_pick=2", "--json", str(out)]
    assert main(args) == 0
    d = json.loads(out.read_text())
    assert d["router"] == first_router and d["router_settings"]["first_pick"] == 2
    assert [p["replica"] for p in d["per_request"]] == [2] * 6
    assert main([*args[:-2], "--set", "first_pick=-1"]) == 2
    with pytest.raises(SystemExit):
        main(["fleet", str(SLICE), "--router", "never_registered"])
    with pytest.raises(ValueError, match="registered already"):
        from paged_kv_lab.fleet.router import Router, router

        router(first_router)(type("Again", (Router,), {}))
