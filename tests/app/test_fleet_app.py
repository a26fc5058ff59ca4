"""AppTest: the fleet lesson on the tiny model, in the step player every lesson uses (three
engines, one model, a router reading only their KV events; arrivals that overlap), and Real
workloads' fleet mode."""

import pytest
from streamlit.testing.v1 import AppTest

from paged_kv_lab.fleet.router import policies, router_class, router_settings
from paged_kv_lab.text.i18n import tr
from support.app import Browser, app

WAIT = 300  # seconds for a fleet's run on a busy machine
# a fleet is three engines' steps: on a shared two-core machine a run of the lesson takes minutes
FLEET_TIMEOUT = pytest.mark.timeout(900)


def _tables(at) -> list[list[dict]]:
    """The panel's Markdown tables under the player, in order (decision, replicas, routers),
    each as rows of column -> cell (unescaped)."""
    out = []
    for m in at.markdown:
        lines = [x for x in m.value.splitlines() if x.startswith("|")]
        if len(lines) < 2 or not set(lines[1]) <= set("|-"):
            continue
        cell = lambda x: [c.strip().replace("\\", "") for c in x.strip("|").split(" | ")]  # noqa: E731
        cols = cell(lines[0])
        out.append([dict(zip(cols, cell(x))) for x in lines[2:]])
    return out


@FLEET_TIMEOUT
def test_the_fleet_lesson_plays_in_the_player_and_says_why_replica_n():
    at = app("fleet")
    b = Browser(at, "fleet").until_recorded(1 << 30, WAIT)
    assert b.done
    run = at.session_state["lesson:fleet"].run
    settings = router_settings(dict(run.scenario.engine.fleet.router_settings))
    # the step that takes a routed request: the player narrates why, in the policy's sentence
    step, routed = next((r.step, r.routed[-1]) for r in run.records if r.routed)
    why = tr(router_class(routed.decision.policy).why(routed.decision, settings), "en")
    assert "{" not in why and routed.decision.policy == "dynamo"
    narration = b.steps[step - 1]["nar"]
    assert any(why in line and routed.request_id in line for line in narration), narration
    # under the player, at that step: the decision with its numbers per replica, the replicas
    b.show(step)
    text = "\n".join(m.value for m in at.markdown) + "\n".join(c.value for c in at.caption)
    assert why in text
    decision, replicas, compare = _tables(at)[:3]
    n = run.scenario.engine.fleet.replicas
    overlap = tr("fleet.lesson.col_overlap", "en")
    assert [int(r[overlap]) for r in decision] == list(routed.decision.overlap_blocks)
    assert tr("fleet.lesson.col_cost", "en") in decision[0]
    assert len(replicas) == n
    # the routers played so far, side by side: this one, its numbers once its run ended
    policy = tr("fleet.lesson.col_policy", "en")
    assert [r[policy] for r in compare] == [tr("fleet.router.dynamo", "en")]


@FLEET_TIMEOUT
def test_the_switch_plays_another_router_beside_the_first():
    at = app("fleet")
    Browser(at, "fleet").until_recorded(1 << 30, WAIT)
    at.segmented_control(key="tg:fleet:router").set_value("round_robin").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["lesson:fleet"].run.scenario.engine.fleet.router == "round_robin"
    assert at.query_params.get("router") in ("round_robin", ["round_robin"])
    b = Browser(at, "fleet").until_recorded(1 << 30, WAIT)
    b.show(len(b.steps))
    compare = _tables(at)[2]
    col, policy = tr("fleet.panel.col_per_replica", "en"), tr("fleet.lesson.col_policy", "en")
    rows = {r[policy]: r[col] for r in compare}
    assert rows[tr("fleet.router.round_robin", "en")] == "3 · 3 · 3"  # nine requests in turn
    assert tr("fleet.router.dynamo", "en") in rows  # the first router played stays beside it
    assert rows[tr("fleet.router.dynamo", "en")] != rows[tr("fleet.router.round_robin", "en")]
    assert at.button(key="fleet:compare_all:fleet")  # offers the other routers


def _workloads_page():
    from pathlib import Path

    from paged_kv_lab.ui.fleet_workloads import render_fleet_mode
    from paged_kv_lab.workloads.page_data import Settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    root = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
    path = Path("tests/fixtures/traces/mooncake_slice.jsonl")
    trace = load_trace(path if path.exists() else root / path).slice(0, 12)
    render_fleet_mode(trace, "slice12", Settings(block_size=512, num_gpu_blocks=140), "en")


@FLEET_TIMEOUT
def test_a_router_registered_here_is_on_the_workloads_list_and_in_the_lessons_comparison():
    """One class, registered at test time: the real workloads' fleet mode offers it, and the
    fleet lesson's comparison (every router, once asked) runs it (its catalogue keys missing,
    its name shows as the key); the lesson's switch is data (content/lessons/fleet/lesson.yaml),
    held equal to the registry by tests/lab/test_fleet_run.py."""
    from paged_kv_lab.fleet.router import ROUTERS, RoundRobin, router

    router("turn_taker")(type("TurnTaker", (RoundRobin,), {}))
    try:
        at = AppTest.from_function(_workloads_page, default_timeout=120)
        at.session_state["fleet:wl_open"] = True
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert "fleet.router.turn_taker" in at.selectbox[0].options
        at = app("fleet")
        at.button(key="fleet:compare_all:fleet").click().run()
        assert not at.exception, [e.value for e in at.exception]
        compare = _tables(at)[-1]  # at step 0 no decision yet: the replicas, the comparison
        policy = tr("fleet.lesson.col_policy", "en")
        assert "fleet.router.turn_taker" in [r[policy] for r in compare]
        assert len(compare) == len(policies())
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


@FLEET_TIMEOUT
def test_a_fleet_case_on_the_casebook_page_shows_the_routers_numbers_and_the_bound(monkeypatch):
    """Case 11 on the casebook page: its player plays the fleet, the router's hit rate is 0 with
    the router's wrong block size and seed and the engines' with the switch, beside the one-pass
    bound of its requests."""
    from paged_kv_lab.content.casebook import cases_by_id, run_numbers
    from paged_kv_lab.fleet.model_fleet import one_pass_bound
    from paged_kv_lab.store.run_store import default_store
    from paged_kv_lab.ui.casebook_page import case_lessons
    from paged_kv_lab.ui.warm_up import record_ahead
    from support.app import pick_case, player_data

    monkeypatch.setattr(default_store(), "background_pause", 0.0)
    case = cases_by_id()["router-hashes-differ"]
    at = app("casebook")
    record_ahead(case_lessons(case), at.session_state["_model_state"])
    pick_case(at, case)
    assert not at.exception, [e.value for e in at.exception]
    assert player_data(at, case.lesson.id)["run"]
    shown = {m.label: m.value for m in at.metric}
    router = tr("casebook.metric.router_hit_rate", "en")
    bound = tr("casebook.metric.bound", "en")
    assert shown[router] == "0.0%"
    run = at.session_state[f"lesson:{case.lesson.id}"].run
    want = one_pass_bound(run.scenario, at.session_state["_model_state"].model)
    assert shown[bound] == f"{100 * want.hit_rate:.1f}%"
    at.toggle(key=f"casebook:fix:{case.id}").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    fixed = at.session_state[f"lesson:{case.lesson.id}-fixed"].run
    after = run_numbers(fixed.records)
    shown = {m.label: m.value for m in at.metric}
    assert shown[router] == f"{100 * after['router_hit_rate']:.1f}%" != "0.0%"
    assert shown[bound] == f"{100 * want.hit_rate:.1f}%"  # the same requests: the same bound
