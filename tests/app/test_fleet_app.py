"""AppTest: the fleet lesson on the tiny model (three engines, one model, a router reading their
KV events), and the model fleet's own promises."""

import json

from streamlit.testing.v1 import AppTest

from paged_kv_lab.ui.fleet_page import LESSON_FILE


def _page():
    from paged_kv_lab.ui.fleet_page import render_fleet_page

    render_fleet_page()


def test_the_model_fleet_routes_on_events_and_prefix_beats_round_robin(tiny_model):
    from paged_kv_lab.fleet.model_fleet import run_model_fleet
    from paged_kv_lab.run.scenario import load_scenario

    d = json.loads(LESSON_FILE.read_text(encoding="utf-8"))
    model = tiny_model
    # the first five requests (both conversations' second turns hit), one token each: cheap
    reqs = [{**r, "max_tokens": 1} for r in d["scenario"]["requests"][:5]]
    scenario = load_scenario(
        {**d["scenario"], "requests": reqs, "model": "tiny-random", "device": "cpu"}
    )
    rr = run_model_fleet(scenario, 3, "round_robin", model, d["sessions"])
    pre = run_model_fleet(scenario, 3, "prefix", model, d["sessions"])
    assert all(e.model is model for e in pre.fleet.replicas)  # one copy of the weights
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


def _workloads_page():
    from pathlib import Path

    from paged_kv_lab.ui.fleet_workloads import render_fleet_mode
    from paged_kv_lab.workloads.page_data import Settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    root = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
    path = Path("tests/fixtures/traces/mooncake_slice.jsonl")
    trace = load_trace(path if path.exists() else root / path).slice(0, 12)
    render_fleet_mode(trace, "slice12", Settings(block_size=512, num_gpu_blocks=140), "en")


def _lesson_app() -> AppTest:
    at = AppTest.from_function(_page, default_timeout=240)
    at.session_state["model_name"] = "tiny-random"
    at.session_state["device"] = "cpu"
    return at


def test_the_fleet_page_says_why_for_every_router():
    """Each registered policy is on the lesson's list, and each decision it makes comes with its
    own sentence (fleet.why.<policy>), its fields filled."""
    from paged_kv_lab.fleet.router import policies

    at = _lesson_app()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    for policy in policies():
        at.radio(key="fleet:policy").set_value(policy).run()
        assert not at.exception, (policy, [e.value for e in at.exception])
        whys = [m.value for m in at.markdown if m.value.startswith("**Why replica")]
        assert len(whys) == 1, policy
        sentence = whys[0].split("** ", 1)[1]
        assert len(sentence) > 40 and "{" not in sentence and "fleet." not in sentence, sentence


def test_a_router_registered_here_is_on_both_fleet_pages_lists():
    """One class, registered at test time: the lesson and the real workloads' fleet mode offer
    it, with no other edit (its catalogue keys missing, its name shows as the key)."""
    from paged_kv_lab.fleet.router import ROUTERS, RoundRobin, router

    router("turn_taker")(type("TurnTaker", (RoundRobin,), {}))
    try:
        at = AppTest.from_function(_workloads_page, default_timeout=120)
        at.session_state["fleet:wl_open"] = True
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert "fleet.router.turn_taker" in at.selectbox[0].options
        at = _lesson_app()
        at.run()
        assert "fleet.router.turn_taker" in at.radio(key="fleet:policy").options
        at.radio(key="fleet:policy").set_value("turn_taker").run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("went to replica" in h.value for h in at.subheader)
    finally:
        ROUTERS.pop("turn_taker")


def test_real_workloads_fleet_mode_draws_per_replica_figures():
    at = AppTest.from_function(_workloads_page, default_timeout=120)
    at.session_state["fleet:wl_open"] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.button[0].click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.dataframe) == 1 and len(at.dataframe[0].value) == 4
    assert any("hit rate" in m.value for m in at.markdown)
    assert len(at.button) == 2  # and one to open a replica's requests as the trace
