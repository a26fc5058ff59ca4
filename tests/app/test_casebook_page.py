"""AppTest: the casebook page renders every case (question, thread link, player, answer, figure)
on the tiny model, and each case's switch changes the hit rate the page shows; the cases are
grouped by where the question arises, and each answer names the vLLM releases it was checked in."""

import pytest

from paged_kv_lab.content.casebook import CASES, WHERE
from paged_kv_lab.text.i18n import tr
from support.app import app, pick_case, player_data

PAGE = "casebook"  # the registry's page id


@pytest.fixture(autouse=True)
def no_background_pause(monkeypatch):
    """The page waits for each case's two runs, which the store computes as background work,
    pacing it (one idle gap per step) for other sessions' clicks; here no one else clicks."""
    from paged_kv_lab.store.run_store import default_store

    monkeypatch.setattr(default_store(), "background_pause", 0.0)


def recorded(at):
    """The page once its cases' runs have ended (the server's warm-up records them ahead; until
    then the page plays what is recorded and says the figure is being computed)."""
    from paged_kv_lab.ui.casebook_page import case_lessons
    from paged_kv_lab.ui.warm_up import record_ahead

    record_ahead([x for c in CASES for x in case_lessons(c)], at.session_state["_model_state"])
    return at.run()


def shown(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_the_cases_are_grouped_by_where_the_question_arises_with_their_versions():
    at = app(PAGE)
    assert not at.exception, [e.value for e in at.exception]
    grouped = {w: [c for c in CASES if c.where == w] for w in WHERE}
    grouped = {w: cs for w, cs in grouped.items() if cs}
    where = at.radio(key="casebook:where")
    assert list(where.options) == [
        tr(f"casebook.where.{w}", "en", n=len(cs)) for w, cs in grouped.items()
    ]
    assert len(grouped) > 1, "more than one group to tell apart"
    for w, cs in grouped.items():
        at.radio(key="casebook:where").set_value(w).run()
        assert not at.exception, [e.value for e in at.exception]
        # a new group shows its own cases and picks its first one
        assert list(at.radio(key="casebook:case").options) == [
            f"{c.icon} {c.number}. {tr(c.title, 'en')}" for c in cs
        ]
        assert at.radio(key="casebook:case").value == cs[0].id
        captions = [c.value for c in at.caption]
        for case in cs:
            pick_case(at, case)
            assert at.radio(key="casebook:where").value == w
            captions = [c.value for c in at.caption]
            line = tr("casebook.holds_for", "en", versions=", ".join(case.holds_for))
            assert line in captions, (case.id, captions)
            assert all(v in line for v in case.holds_for)
    # a link to a case's run opens that case in its group
    last = CASES[-1]
    at.session_state["_casebook_link_read"] = False
    at.query_params["lesson"] = f"case-{last.id}"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key="casebook:case").value == last.id
    assert at.radio(key="casebook:where").value == last.where


def test_every_case_renders_and_its_switch_changes_the_hit_rate():
    at = recorded(app(PAGE))
    for case in CASES:
        pick_case(at, case)
        assert not at.exception, [e.value for e in at.exception]
        text = "\n".join(m.value for m in at.markdown)
        assert tr(case.asked, "en") in text and tr(case.answer, "en") in text
        assert f"({case.url})" in text, "the thread is linked"
        assert player_data(at, case.lesson.id)["run"], "the player is mounted for the case's run"
        assert len(at.get("vega_lite_chart")) == 1, "the before/after figure"
        label = tr(f"casebook.metric.{case.figure}", "en")
        before = shown(at)[label]
        at.toggle(key=f"casebook:fix:{case.id}").set_value(True).run()
        assert not at.exception, [e.value for e in at.exception]
        assert player_data(at, case.lesson.id + "-fixed")["run"], "the switch plays the fixed run"
        after = shown(at)[label]
        assert before != after, (case.id, before, after)
        assert tr(case.fix.explain, "en") in "\n".join(c.value for c in at.caption)
        at.toggle(key=f"casebook:fix:{case.id}").set_value(False).run()
        assert shown(at)[label] == before


def test_the_page_speaks_chinese():
    at = app(PAGE)
    at.session_state["lang"] = "zh"
    at.session_state["_prefs"] = {**at.session_state["_prefs"], "lang": "zh"}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value.endswith(tr("casebook.title", "zh"))
    text = "\n".join(m.value for m in at.markdown)
    assert tr(CASES[0].answer, "zh") in text
