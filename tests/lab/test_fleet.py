"""A fleet of replicas behind a router (paged_kv_lab/fleet): the replicas are the replay's engine,
the router's index is what the KV events say, each policy routes as its source describes, and
``python -m kvcore fleet`` keeps its JSON contract. Model-free, on the 40-request test slice."""

import json

import pytest

from paged_kv_lab.cli.main import main
from paged_kv_lab.fleet.fleet import Fleet, fleet_replay
from paged_kv_lab.fleet.router import (
    POLICIES,
    ApproxTree,
    DynamoKv,
    FleetRequest,
    ReplicaView,
    RouterError,
    Session,
    router_settings,
)
from paged_kv_lab.workload.replay import replay, replay_settings
from paged_kv_lab.workload.trace import load_trace
from support.paths import FIXTURES

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
    from kvcore.distributed.kv_events import hash_text, maybe_convert_block_hash

    fleet = Fleet(trace, replay_settings(trace, SMALL, arrival="timestamps"), 3, "prefix")
    fleet.run()
    assert fleet.index.events > 0
    for r in fleet.replicas:
        table = r.block_pool.cached_block_hash_to_block._cache
        truth = {hash_text(maybe_convert_block_hash(key[:-4])) for key in table}
        assert set(fleet.index.blocks(r.index)) == set(truth)


@pytest.mark.parametrize("policy", POLICIES)
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
    fleet = Fleet(trace, settings, 3, "prefix")
    fleet.run()
    for r in fleet.replicas:
        sub = fleet.sub_trace(r.index)
        alone = replay(sub, replay_settings(sub, SMALL, arrival=arrival))
        assert [x.hit_tokens for x in alone.per_request] == [r.hit_tokens[i] for i in r.routed]
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
