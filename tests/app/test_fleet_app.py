"""AppTest: the fleet lesson on the tiny model (three engines, one model, a router reading their
KV events), and the model fleet's own promises."""

import json

from streamlit.testing.v1 import AppTest

from paged_kv_lab.app.fleet_page import LESSON_FILE


def _page():
    from paged_kv_lab.app.fleet_page import render_fleet_page

    render_fleet_page()


def test_the_model_fleet_routes_on_events_and_prefix_beats_round_robin(tiny_model):
    from paged_kv_lab.fleet.model_fleet import ModelFleet
    from paged_kv_lab.record.scenario import load_scenario

    d = json.loads(LESSON_FILE.read_text(encoding="utf-8"))
    model = tiny_model
    # the first five requests (both conversations' second turns hit), one token each: cheap
    reqs = [{**r, "max_tokens": 1} for r in d["scenario"]["requests"][:5]]
    scenario = load_scenario(
        {**d["scenario"], "requests": reqs, "model": "tiny-random", "device": "cpu"}
    )
    rr = ModelFleet(scenario, 3, "round_robin", model, d["sessions"])
    pre = ModelFleet(scenario, 3, "prefix", model, d["sessions"])
    rr.run()
    pre.run()
    assert all(r.engine.model is model for r in pre.replicas)  # one copy of the weights
    assert [m.decision.replica for m in rr.moments] == [i % 3 for i in range(len(rr.moments))]
    assert pre.hit_rate() > rr.hit_rate() > 0
    for m in pre.moments[1:]:
        # the prefix router's pick holds the longest run of the prompt's blocks in its index
        assert m.decision.overlap_blocks[m.decision.replica] == max(m.decision.overlap_blocks)
    last = pre.moments[-1]
    cached = {b.block_hash for snap in last.snapshots for b in snap.blocks if b.block_hash}
    assert len(last.holders) == len(cached)  # the index knows exactly the cached blocks


def test_fleet_page_steps_and_says_why():
    at = AppTest.from_function(_page, default_timeout=240)
    at.session_state["model_name"] = "tiny-random"
    at.session_state["device"] = "cpu"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Why replica" in m.value for m in at.markdown)
    at.slider(key="fleet:k").set_value(4).run()
    assert not at.exception
    assert any("went to replica" in h.value for h in at.subheader)
    assert len(at.dataframe) >= 3


def test_real_workloads_fleet_mode_draws_per_replica_figures():
    def page():
        from pathlib import Path

        from paged_kv_lab.app.fleet_workloads import render_fleet_mode
        from paged_kv_lab.app.workloads_data import Settings
        from paged_kv_lab.workload.trace import load_trace

        root = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
        path = Path("tests/fixtures/traces/mooncake_slice.jsonl")
        trace = load_trace(path if path.exists() else root / path).slice(0, 12)
        render_fleet_mode(trace, "slice12", Settings(block_size=512, num_gpu_blocks=140), "en")

    at = AppTest.from_function(page, default_timeout=120)
    at.session_state["fleet:wl_open"] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == 4
    assert any("hit rate" in m.value for m in at.markdown)
    assert len(at.button) == 2  # and one to open a replica's requests as the trace
