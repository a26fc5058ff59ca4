"""One way to drive the engine (paged_kv_lab/run/driver.py): every source of steps is a Driver,
and one loop (add the requests, step to the end, read the records, the KV events, the outputs)
drives each to the results its own way of running gives."""

import pytest

from paged_kv_lab.designs.side_by_side import SideBySide, follow
from paged_kv_lab.designs.sim import NanoRun, SGLangRun
from paged_kv_lab.designs.three_designs import trace_requests
from paged_kv_lab.run.driver import Driver, run_to_end
from paged_kv_lab.workloads.replay import Replay, ReplayError, replay, replay_settings
from paged_kv_lab.workloads.trace_formats import load_trace
from support.kv import make_engine, settings, spec
from support.paths import FIXTURES

SLICE = FIXTURES / "traces" / "mooncake_slice.jsonl"
SMALL = {"block_size": 512, "num_gpu_blocks": 140}
P = list(range(100, 116))


def drive(driver, requests) -> list:
    """The one loop: take every request, step until nothing is left; every step's KV events are
    what its record says (where the record carries them)."""
    assert isinstance(driver, Driver)
    for r in requests:
        driver.add_request(r)
    records = []
    while driver.has_unfinished():
        rec = driver.step()
        events = driver.kv_events()
        assert isinstance(events, tuple)
        if hasattr(rec, "kv_events"):
            assert events == tuple(rec.kv_events)
        records.append(rec)
    assert not driver.has_unfinished()
    return records


def test_the_model_engine_driven_as_a_driver_runs_as_its_scenario():
    reqs = [spec("A", P + [1, 2], max_tokens=3), spec("B", P + [3], max_tokens=2)]
    ran = make_engine(reqs)
    ran.run()
    driven = make_engine()
    records = drive(driven, reqs)
    assert [r.step for r in records] == list(range(1, len(records) + 1))
    assert driven.outputs() == ran.outputs()
    assert list(driven.outputs()) == ["A", "B"]
    assert any(driven.kv_cache_manager.block_pool.cached_block_hash_to_block._cache)
    assert any(rec.kv_events for rec in records)  # the pool's BlockStored, step by step


def test_the_replay_takes_requests_and_publishes_its_events():
    trace = load_trace(SLICE).slice(0, 8)
    settings = replay_settings(trace, SMALL)
    alone = replay(trace, settings)
    fed = Replay(trace, settings, own_arrivals=False)
    for tr in trace.requests:  # one at a time, each to its end: the sequential rule
        drive(fed, [fed.make_request(tr)])
    assert [r.hit_tokens for r in fed.outputs().values()] == [
        r.hit_tokens for r in alone.per_request
    ]
    assert list(fed.outputs()) == [tr.request_id for tr in trace.requests]
    assert fed.evictions == alone.evictions and fed.step_count == alone.steps
    own = Replay(trace, settings)
    with pytest.raises(ReplayError, match="own_arrivals"):
        own.add_request(own.make_request(trace.requests[0]))
    assert own.kv_events() == ()
    run_to_end(own)
    assert [r.hit_tokens for r in own.outputs().values()] == [
        r.hit_tokens for r in alone.per_request
    ]


def test_a_replay_publishes_its_pools_events_step_by_step():
    trace = load_trace(SLICE).slice(0, 4)
    r = Replay(trace, replay_settings(trace, SMALL), own_arrivals=False, kv_events=True)
    stored = []
    for tr in trace.requests:
        r.add_request(r.make_request(tr))
    while r.has_unfinished():
        r.step()
        stored += [e for e in r.kv_events() if type(e).__name__ == "BlockStored"]
    assert stored


def test_the_designs_driven_one_request_a_step_give_their_runs():
    trace = load_trace(SLICE).slice(0, 10)
    reqs = trace_requests(trace)
    for make in (lambda: SGLangRun(size=140 * 512, page_size=512), lambda: NanoRun(140, 512)):
        by_run, driven = make(), make()
        for req in reqs:
            by_run.run(req)
        records = drive(driven, reqs)
        assert records == by_run.results == list(driven.outputs().values())
        assert driven.steps == by_run.steps
    with pytest.raises(ValueError, match="no request"):
        NanoRun(4, 2).step()
    assert NanoRun(4, 2).outputs() == {} and not NanoRun(4, 2).has_unfinished()


def test_side_by_side_takes_a_recorded_runs_steps():
    eng = make_engine(
        [spec("A", P + [1, 2], max_tokens=3), spec("B", P + [3], max_tokens=2, arrival_step=2)],
        num_gpu_blocks=12,
    )
    snapshots = [rec.snapshot for rec in eng.run()]
    followed = follow(snapshots, 12, 4)
    driven = SideBySide(12, 4)
    steps = drive(driven, snapshots)
    assert steps == followed.steps
    out = driven.outputs()
    assert set(out) == {"A", "B"}
    assert out["B"].sglang == followed.sglang_hits["B"] and out["B"].nano == followed.nano_hits["B"]


def test_the_pd_pair_is_a_driver(tiny_model):
    """PDRun: one record a step; PDEngine: one tick a step (its records, both replicas')."""
    from paged_kv_lab.disagg.pd import PDEngine, PDRun
    from paged_kv_lab.run.scenario import Scenario

    reqs = [spec("A", P + [1, 2], max_tokens=3), spec("B", P + [3], max_tokens=2)]
    scen = Scenario(
        model=tiny_model.name,
        device=tiny_model.device.type,
        engine=settings(block_size=8, num_gpu_blocks=40, kv_transfer="pd"),
    )
    pair = PDRun(PDEngine(scen, model=tiny_model))
    records = drive(pair, reqs)
    assert {r.replica for r in records} == {"prefill", "decode"}
    assert [r.step for r in records] == list(range(1, len(records) + 1))
    assert list(pair.outputs()) == ["A", "B"]
    whole = PDEngine(scen, model=tiny_model)
    ticks = drive(whole, reqs)
    assert [r for tick in ticks for r in tick] == records
    assert whole.outputs() == pair.outputs()
