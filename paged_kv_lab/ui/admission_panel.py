"""Under the player, for a lesson with the "admission" panel: the runs of its
``cache_aware_admission_window`` switch side by side (the other switches as the learner set
them), each with its hit rate and, per request, the step it was admitted, the steps it waited
and the tokens it hit (why/explain_admission.py). The other runs are the run store's shared
runs of the same scenario with that one setting changed, asked for in the background; while
one is still being computed the table says so and polls."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.state import build_scenario, open_run
from paged_kv_lab.ui.why_panel import recorded_steps
from paged_kv_lab.why.explain_admission import admissions

SETTING = "cache_aware_admission_window"
POLL = 1.0  # seconds between the table's reruns while a run is still being computed


def _runs(state, lesson, ms) -> list[tuple[object, object]]:
    """(option value, its run's RecordedRun) for each option of the lesson's window switch."""
    toggle = next((t for t in lesson.toggles if t.setting == SETTING), None)
    if toggle is None:
        return []
    # the session keeps a cursor on each run it compares, so the store keeps them
    held = st.session_state.setdefault(f"admission:runs:{lesson.id}", {})
    out = []
    for option in toggle.choices:
        overrides = {**state.overrides, SETTING: option.value}
        key = repr((ms.name, ms.device, sorted(overrides.items()), state.base))
        if key not in held:
            held[key] = open_run(build_scenario(lesson, state.base, overrides, ms), ms)
        run = held[key].run
        if not run.done:
            run.want(1 << 30)
        out.append((option.value, run))
    return out


def _row(value, shown, run, requests: list[str], lang: str) -> dict:
    steps = recorded_steps(run)
    rows = {a.request_id: a for a in admissions(steps)}
    label = f"{SETTING} = {value}"
    out = {
        tr("admission.col.run", lang): tr("admission.shown", lang, value=label) if shown else label,
        tr(
            "admission.col.hit_rate", lang
        ): f"{100 * steps.last_snapshot().prefix_cache['hit_rate']:.1f}%",
        tr("admission.col.order", lang): " → ".join(
            a.request_id for a in sorted(rows.values(), key=lambda a: a.step or 1 << 30)
        ),
    }
    for rid in requests:
        a = rows.get(rid)
        out[tr("admission.col.admitted", lang, r=rid)] = a.step if a else None
        out[tr("admission.col.waited", lang, r=rid)] = a.waiting_steps if a else None
        out[tr("admission.col.hit", lang, r=rid)] = a.hit_tokens if a else None
    return out


def show_admission(state, lesson, ms, lang: str) -> None:
    st.subheader(tr("admission.compare", lang))
    runs = _runs(state, lesson, ms)
    pending = any(not r.done for _, r in runs)
    shown = state.overrides.get(SETTING, lesson.scenario.get("engine", {}).get(SETTING, 0))
    table = st.fragment(run_every=POLL if pending else None)(_table)
    table(runs, shown, [r.id for r in state.run.scenario.requests], pending, lang)


def _table(runs, shown, requests: list[str], pending: bool, lang: str) -> None:
    if any(not r.done for _, r in runs):
        st.info(tr("admission.computing", lang))
        return
    if pending:
        st.rerun()
    rows = [_row(v, v == shown, r, requests, lang) for v, r in runs]
    with st.container(key="admission-compare"):  # a plain table: its text is in the page
        st.table(pd.DataFrame(rows).set_index(tr("admission.col.run", lang)))
    st.caption(tr("admission.caption", lang))
