"""A fleet as a kind of run (fleet/model_fleet.py: FleetRun; a scenario's ``engine.fleet``), on
the fleet lesson's scenario and the tiny model (SmolLM2's tokenizer, so the same token ids, block
decisions and routing as on SmolLM2): its records, each policy's placement with arrivals that
overlap, and the router's own block size and hash seed."""

import pytest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.fleet.model_fleet import fleet_figures
from paged_kv_lab.fleet.router import policies
from paged_kv_lab.store.timeline import lesson_run

pytestmark = pytest.mark.xdist_group("fleet-run")
RUN_WAIT = 300.0


def fleet_run(tiny_model, **overrides):
    run = lesson_run(BY_ID["fleet"], tiny_model, overrides)
    run.run_to_end(timeout=RUN_WAIT)
    assert run.finished and not run.error, run.error
    return run


def placement(run) -> dict[str, int]:
    return {r.request_id: r.replica for rec in run.records for r in rec.routed}


def test_the_switch_offers_every_registered_router():
    (switch,) = BY_ID["fleet"].toggles
    assert switch.setting == "router" and set(switch.options) == set(policies())
    assert all(o.router == o.value for o in switch.choices)


def test_a_fleet_run_is_numbered_and_routes_each_request_once_to_its_next_step(tiny_model):
    run = fleet_run(tiny_model)
    scenario = run.scenario
    conf = scenario.engine.fleet
    records = run.records
    assert [r.step for r in records] == list(range(1, len(records) + 1))
    assert all(r.snapshot.step == r.step for r in records)
    assert {r.replica for r in records} == set(range(conf.replicas))
    routed = [(rec, r) for rec in records for r in rec.routed]
    assert sorted(r.request_id for _, r in routed) == sorted(x.id for x in scenario.requests)
    for rec, r in routed:
        # the replica the router chose takes the request in the step that carries the decision
        assert rec.replica == r.replica and r.request_id in rec.scheduled
        assert r.decision.policy == conf.router
    # arrival order: a request is routed no earlier than one that arrived before it
    arrival = {x.id: x.arrival_step for x in scenario.requests}
    order = [r.request_id for _, r in routed]
    assert [arrival[i] for i in order] == sorted(arrival[i] for i in order)
    # each request's output comes from the replica that served it, in full
    outputs = run.run.outputs()
    assert all(len(outputs[x.id]["token_ids"]) == x.max_tokens for x in scenario.requests)


def test_prefix_piles_up_round_robin_scatters_dynamo_trades(tiny_model):
    n = BY_ID["fleet"].scenario["engine"]["fleet"]["replicas"]
    prefix = placement(fleet_run(tiny_model, router="prefix"))
    assert len(set(prefix.values())) == 1, prefix  # one replica gets everything
    rr_run = fleet_run(tiny_model, router="round_robin")
    rr = [r.replica for rec in rr_run.records for r in rec.routed]
    assert len(rr) == len(rr_run.scenario.requests)
    by_arrival = sorted(rr_run.scenario.requests, key=lambda x: x.arrival_step)
    assert [placement(rr_run)[x.id] for x in by_arrival] == [i % n for i in range(len(by_arrival))]
    session = fleet_run(tiny_model, router="session")
    sessions = session.scenario.engine.fleet.sessions
    where = {}
    for rid, j in placement(session).items():
        where.setdefault(sessions[rid], set()).add(j)
    assert all(len(js) == 1 for js in where.values()), where  # a conversation stays together
    dyn = fleet_run(tiny_model, router="dynamo")
    assert len(set(placement(dyn).values())) > 1
    away = [
        r.decision
        for rec in dyn.records
        for r in rec.routed
        if r.decision.overlap_blocks[r.replica] < max(r.decision.overlap_blocks)
    ]
    assert away, "Dynamo's cost sends some request away from its longest cached prefix"
    # ... because that replica cost as much (a seeded draw among equal costs) or more: its load
    # outweighed the overlap
    best = [d.overlap_blocks.index(max(d.overlap_blocks)) for d in away]
    assert all(d.score[d.replica] <= d.score[b] for d, b in zip(away, best))
    assert any(d.score[d.replica] < d.score[b] for d, b in zip(away, best))
    # side by side: the pile-up hits the most here, the scattering least
    pile = fleet_figures(fleet_run(tiny_model, router="prefix").records, n)
    scatter = fleet_figures(rr_run.records, n)
    assert pile.engine_hit_rate > scatter.engine_hit_rate > 0
    assert max(r.routed for r in pile.replicas) == len(rr) > max(r.routed for r in scatter.replicas)


def test_a_router_hashing_with_another_block_size_or_seed_sees_no_overlap(tiny_model):
    """The router hashes prompts itself: with another block size or another NONE_HASH seed than
    the engines', no hash it computes is one the engines published."""
    base = BY_ID["fleet"].scenario["engine"]["fleet"]
    for wrong in ({"kv_cache_block_size": 32}, {"none_hash_seed": "0"}):
        fleet = {**base, "router": "prefix", "router_settings": wrong}
        run = fleet_run(tiny_model, fleet=fleet)
        decisions = [r.decision for rec in run.records for r in rec.routed]
        assert all(max(d.overlap_blocks) == 0 for d in decisions), wrong
    right = fleet_run(tiny_model, router="prefix")
    assert any(max(r.decision.overlap_blocks) for rec in right.records for r in rec.routed)


def test_a_trace_fleet_refuses_router_hash_settings_it_cannot_honour():
    """A trace fleet's router reads the replicas' own hashes: it refuses another block size or
    seed for them rather than ignore it."""
    from paged_kv_lab.fleet.trace_fleet import trace_fleet
    from paged_kv_lab.workloads.replay import ReplayError, replay_settings
    from paged_kv_lab.workloads.trace_formats import load_trace
    from support.paths import ROOT

    trace = load_trace(ROOT / "tests/fixtures/traces/mooncake_slice.jsonl").slice(0, 4)
    settings = replay_settings(trace, {"block_size": 512})
    for wrong in ({"kv_cache_block_size": 32}, {"none_hash_seed": "0"}):
        with pytest.raises(ReplayError, match="kv_cache_block_size, none_hash_seed"):
            trace_fleet(trace, settings, 2, "prefix", wrong)
    assert trace_fleet(trace, settings, 2, "prefix").run()
