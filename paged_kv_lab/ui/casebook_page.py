"""The casebook page: pick where the question arises (one engine, a hybrid model, a fleet,
disaggregation: ``casebook.WHERE``), then a case of that group; read the question, step its
scenario in the lesson player, switch the fix on and compare the hit rate before and after, and
read the answer with the vLLM releases it was checked in (content/casebook.py holds the cases).

The case is what the page remembers (``CASE_KEY``, also what a link names); the group follows it,
and picking another group picks that group's first case.

Each case's scenario, and its fixed twin, is a ``Lesson``; the page gives each its own
``LessonState`` and player key, so the switch flips between two shared recorded runs and every
learner's cursor stays where it was in each.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd
import streamlit as st

from paged_kv_lab.content.casebook import (
    FLEET_NUMBERS,
    RATES,
    WHERE,
    Case,
    cases_by_id,
    issue_url,
    run_numbers,
)
from paged_kv_lab.content.catalog import Lesson
from paged_kv_lab.store.server_cache import Shared
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.lesson_page import (
    current_lang,
    current_model,
    lesson_player,
    played_model_state,
)
from paged_kv_lab.ui.player_component import page_fragment, player_panel, step_cap_note
from paged_kv_lab.ui.state import (
    LessonState,
    get_state,
    init_globals_from_url,
    write_url,
)
from paged_kv_lab.ui.why_panel import why_panel

# (case, model, device) -> the one-pass bound of a fleet case's requests (a few bytes)
BOUNDS: Shared = Shared("fleet case bounds", size=lambda _: 256, keep_errors=False)
CASE_KEY = "casebook:case"
WHERE_KEY = "casebook:where"
FIX_KEY = "casebook:fix:{id}"
RESULTS_POLL = 1.0  # seconds between the results' reruns while a run is still being computed


def _from_link() -> None:
    """A link to a case's run ("?lesson=case-<id>[-fixed]", what the player writes) opens that
    case with its switch as it was; read once per session, before the widgets exist."""
    if st.session_state.get("_casebook_link_read"):
        return
    st.session_state["_casebook_link_read"] = True
    name = str(st.query_params.get("lesson", ""))
    if not name.startswith("case-"):
        return
    fixed = name.endswith("-fixed")
    case_id = name.removeprefix("case-").removesuffix("-fixed")
    by_id = cases_by_id()
    if case_id in by_id:
        st.session_state[CASE_KEY] = case_id
        has_fix = by_id[case_id].fix is not None
        st.session_state[FIX_KEY.format(id=case_id)] = fixed and has_fix


def _refs(refs) -> str:
    return ", ".join(f"[{r}]({issue_url(r)})" for r in refs)


def show_case_text(case: Case, lang: str) -> None:
    st.subheader(f"{case.icon} {case.number}. {tr(case.title, lang)}")
    links = tr("casebook.thread", lang, ref=f"[{case.issue}]({case.url})")
    if case.related:
        links += " · " + tr("casebook.related", lang, refs=_refs(case.related))
    st.markdown(f"**{tr('casebook.asked', lang)}** {tr(case.asked, lang)}\n\n{links}")


def show_answer(case: Case, lang: str) -> None:
    with st.container(border=True):
        st.markdown(f"**{tr('casebook.answer', lang)}** {tr(case.answer, lang)}")
        st.caption(holds_for_line(case, lang))


def holds_for_line(case: Case, lang: str) -> str:
    """Which vLLM releases the answer was checked in (the case's ``holds_for``)."""
    return tr("casebook.holds_for", lang, versions=", ".join(case.holds_for))


def groups(by_id: dict[str, Case]) -> dict[str, list[str]]:
    """Where each question arises -> its cases' ids, in ``WHERE``'s order and by number; only
    the groups that have a case."""
    out = {w: [i for i, c in by_id.items() if c.where == w] for w in WHERE}
    return {w: ids for w, ids in out.items() if ids}


def _follow_where(by_grouped: dict[str, list[str]]) -> None:
    """A new group picks its first case (the group radio's on_change)."""
    st.session_state[CASE_KEY] = by_grouped[st.session_state[WHERE_KEY]][0]


def pick_case(by_id: dict[str, Case], lang: str) -> str:
    """The group radio, then the case radio of that group; the chosen case's id."""
    grouped = groups(by_id)
    if st.session_state.get(CASE_KEY) not in by_id:
        st.session_state[CASE_KEY] = next(iter(by_id))  # the first case by number
    st.session_state[WHERE_KEY] = by_id[st.session_state[CASE_KEY]].where
    where = st.radio(
        tr("casebook.where", lang),
        list(grouped),
        key=WHERE_KEY,
        horizontal=True,
        format_func=lambda w: tr(f"casebook.where.{w}", lang, n=len(grouped[w])),
        on_change=_follow_where,
        args=(grouped,),
    )
    return st.radio(
        tr("casebook.pick", lang),
        grouped[where],
        key=CASE_KEY,
        format_func=lambda i: f"{by_id[i].icon} {by_id[i].number}. {tr(by_id[i].title, lang)}",
    )


def case_stage(lesson: Lesson, state: LessonState, ms, lang: str) -> None:
    """The part of the page that follows the player's cursor (a fragment, as on a lesson page)."""
    kw = lesson_player(state, lesson, ms, lang)
    player_panel(
        state,
        lesson.id,
        lang,
        focus=lesson.focus,
        url_step=True,
        **{k: kw[k] for k in ("decode", "narrate", "intro", "outro", "request_ids", "meta")},
    )
    step_cap_note(state.run, lang)
    if getattr(state.run.scenario.engine, "fleet", None) is not None:  # a case on a fleet
        from paged_kv_lab.ui.fleet_page import show_fleet

        show_fleet(state.run, lang)
    else:
        why_panel(state.run, lang, lesson.id, kw["decode"])
    write_url(state, lesson, lang, ms)


def case_lessons(case: Case) -> tuple[Lesson, ...]:
    fixed = case.fixed_lesson()
    return (case.lesson,) if fixed is None else (case.lesson, fixed)


def final_numbers(state: LessonState) -> Optional[dict]:
    """The numbers of the run's last step once the run has ended, else None (its steps are asked
    for as background work: the store keeps clicks first). Never waits."""
    run = state.run.run
    if not run.done:
        run.want(1 << 30)
    if not run.done or not run.records:
        return None
    return run_numbers(run.records)  # a fleet's: over every replica


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _shown(key: str, x: float) -> str:
    """A number as the page shows it: a rate in %, a count as it is."""
    return _pct(x) if key in RATES else f"{x:g}"


def _figure_keys(case: Case) -> list[str]:
    """The numbers the case shows: its own and vLLM's hit rate, or its own alone when it is a
    count (one axis holds one unit)."""
    keys = list(dict.fromkeys((case.figure, "hit_rate")))
    return keys if case.figure in RATES else [case.figure]


def show_figure(case: Case, before: dict, after: Optional[dict], lang: str) -> None:
    """Before / after: the case's number (and vLLM's own hit rate) at the end of each run, in %
    (a count as it is). A Vega-Lite bar chart, not plotly: plotly's 4.7 MB script would hold the
    whole page back on a first visit (measured: tests/browser/test_browser_pages_open.py)."""
    keys = _figure_keys(case)
    rate = case.figure in RATES
    y = "%" if rate else tr("casebook.count", lang)
    runs = [(tr("casebook.before", lang), before)] + (
        [(tr("casebook.after", lang), after)] if after else []
    )
    rows = [
        {
            "run": label,
            "metric": tr(f"casebook.metric.{key}", lang),
            y: round(100 * n[key], 1) if rate else n[key],
        }
        for label, n in runs
        for key in keys
    ]
    st.caption(tr("casebook.figure", lang))
    st.bar_chart(
        pd.DataFrame(rows),
        x="run",
        y=y,
        color="metric",
        stack=False,
        sort=False,
        height=280,
        x_label="",
    )


def show_numbers(case: Case, shown: dict, lang: str) -> None:
    """The shown run's number as a metric (the switch changes it), with its counts."""
    cols = st.columns(2)
    for col, key in zip(cols, dict.fromkeys((case.figure, "hit_rate"))):
        col.metric(tr(f"casebook.metric.{key}", lang), _shown(key, shown[key]))
    if case.where == "fleet":  # the router's view beside the engines', and what is achievable
        show_fleet_numbers(case, shown, lang)
    counts = tr("casebook.metric.hits", lang, hits=shown["hits"], queries=shown["queries"])
    if shown["preempted_queries"]:
        counts += " · " + tr(
            "casebook.metric.preempted",
            lang,
            hits=shown["preempted_hits"],
            queries=shown["preempted_queries"],
        )
    st.caption(counts)


def show_fleet_numbers(case: Case, shown: dict, lang: str) -> None:
    """A fleet case's other numbers: the router's hit rate (summed over tokens, and as Dynamo's
    histogram averages it per request), the busiest replica's share, and the one-pass bound of
    the case's requests (fleet/model_fleet.py: one_pass_bound; computed once per server)."""
    from paged_kv_lab.fleet.model_fleet import one_pass_bound
    from paged_kv_lab.ui.modelstate import engine_lock

    keys = [k for k in FLEET_NUMBERS if k != case.figure]  # the figure's is shown already
    cols = st.columns(len(keys) + 1)
    for col, key in zip(cols, keys):
        col.metric(tr(f"casebook.metric.{key}", lang), _pct(shown[key]))
    ms = current_model()
    scenario = get_state(case.lesson, ms).run.scenario

    def compute():
        with engine_lock():
            return one_pass_bound(scenario, ms.model)

    bound = BOUNDS.get((case.id, ms.name, ms.device), compute)
    if bound.hit_rate is not None:
        cols[-1].metric(tr("casebook.metric.bound", lang), _pct(bound.hit_rate))


def case_results(case: Case, states, fixed: bool, pending: bool, lang: str) -> None:
    """The shown run's numbers and the before/after figure, once both runs have ended. While one
    is still being computed, this part polls (``pending``: a fragment run every ``RESULTS_POLL``
    s) and reruns the whole page when both have ended, which stops the polling."""
    before, after = (final_numbers(s) if s is not None else None for s in states)
    if before is None or (states[1] is not None and after is None):
        st.info(tr("casebook.computing", lang))
        return
    if pending:
        st.rerun()
    show_numbers(case, after if fixed and after is not None else before, lang)
    show_figure(case, before, after, lang)


def render_casebook() -> None:
    init_globals_from_url()
    _from_link()
    lang = current_lang()
    ms = current_model()
    st.title(f"📒 {tr('casebook.title', lang)}")
    st.caption(tr("casebook.summary", lang))
    by_id = cases_by_id()
    case = by_id[pick_case(by_id, lang)]
    ms = played_model_state(case.lesson, ms, lang)  # a case on a hybrid model plays on its own
    show_case_text(case, lang)
    if ms.model is None:
        st.error(tr("model_failed", lang, model=ms.name, device=ms.device, error=ms.error))
        st.info(tr("model_hint", lang))
        show_answer(case, lang)
        return
    fixed_lesson = case.fixed_lesson()
    fixed = False
    if case.fix is not None:
        fixed = st.toggle(
            tr(case.fix.label, lang),
            key=FIX_KEY.format(id=case.id),
            help=tr(case.fix.explain, lang),
        )
        if fixed:
            st.caption(tr(case.fix.explain, lang))
    lesson = fixed_lesson if fixed and fixed_lesson is not None else case.lesson
    state = get_state(lesson, ms)
    if state.error:
        st.error(state.error)
    if state.notice:
        st.success(state.notice)
    state.error = state.notice = None
    page_fragment(case_stage, lesson.id)(lesson, state, ms, lang)
    states = (get_state(case.lesson, ms), get_state(fixed_lesson, ms) if fixed_lesson else None)
    for s in states:
        if s is not None:
            final_numbers(s)
    pending = not all(s.run.run.done for s in states if s is not None)
    results = st.fragment(run_every=RESULTS_POLL if pending else None)(case_results)
    results(case, states, fixed, pending, lang)
    show_answer(case, lang)
