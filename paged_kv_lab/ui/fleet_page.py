"""Under the player, for a run of a fleet (a scenario with ``engine.fleet``: the fleet lesson, a
fleet case): the router's last decision up to the player's step with its numbers per replica
and the policy's own sentence (``fleet.why.<policy>``, the router registry's name), each
replica's load and prefix-cache counters at that step, the router's and the engines' hit rates,
and the same requests under every registered policy side by side. Also the fleet's lines of
the player's narration: which replica made a step, and why the router sent it the requests it
takes in that step.

Everything shown is read from the recorded steps (``StepRecord.replica``, ``StepRecord.routed``;
fleet/model_fleet.py: ``fleet_figures``). Text only (Markdown tables, as the P/D panel's: the
per-step pictures are the browser player's, and this part of the page reruns on every cursor
report). Request ids and sessions come from scenario files: they go through md_escape, never in
as HTML.
"""

from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from paged_kv_lab.fleet.model_fleet import fleet_figures
from paged_kv_lab.fleet.router import policies, router_class, router_settings
from paged_kv_lab.text.i18n import Text, tr
from paged_kv_lab.ui.panels import md_escape

ROUTER_SETTING = "router"  # the lesson's switch (content/catalog.py: OPTION_EFFECTS)


def is_fleet(scenario) -> bool:
    return scenario is not None and getattr(scenario.engine, "fleet", None) is not None


def why_text(routed, settings: dict) -> Text:
    """ "Why this replica?": the policy's sentence ``fleet.why.<policy>`` with its decision's
    numbers (fleet/router.py: ``Router.why``)."""
    d = routed.decision
    return router_class(d.policy).why(d, settings)


def fleet_lines(rec, settings: dict, lang: str) -> list[str]:
    """The fleet's narration of one step: the replica that made it, and each request routed to
    it just before, with the router's reason."""
    if not isinstance(rec.replica, int):
        return []
    lines = [tr("fleet.step.replica", lang, replica=rec.replica)]
    for r in rec.routed:
        lines.append(
            tr(
                "fleet.step.routed",
                lang,
                req=r.request_id,
                session=r.session,
                replica=r.replica,
                why=why_text(r, settings),
            )
        )
    return lines


def fleet_narrator(inner: Callable, scenario, lang: str) -> Callable:
    """The lesson's narration of a step (``inner``) after the fleet's own lines."""
    settings = router_settings(dict(scenario.engine.fleet.router_settings))

    def narrate(rec) -> list[str]:
        return fleet_lines(rec, settings, lang) + list(inner(rec))

    return narrate


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def md_table(rows: list[dict]) -> str:
    """Rows (column -> cell) as a Markdown table; cells escaped."""
    if not rows:
        return ""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(md_escape(str(c)) for c in cols) + " |"]
    lines.append("|" + "---|" * len(cols))
    for r in rows:
        lines.append("| " + " | ".join(md_escape(str(r.get(c, ""))) for c in cols) + " |")
    return "\n".join(lines)


def show_decision(routed, settings: dict, lang: str) -> None:
    """One decision: where the request went, why, and the numbers per replica it compared."""
    req = md_escape(routed.request_id)
    st.markdown(f"**{tr('fleet.panel.decision', lang, req=req, replica=routed.replica)}**")
    st.caption(tr(why_text(routed, settings), lang))
    d = routed.decision
    rows = []
    for i in range(len(d.overlap_blocks)):
        row = {
            tr("fleet.lesson.col_replica", lang): i,
            tr("fleet.lesson.col_overlap", lang): d.overlap_blocks[i],
            tr("fleet.lesson.col_load", lang): d.load[i],
        }
        if d.score is not None:
            row[tr(f"fleet.lesson.col_{d.score_name}", lang)] = round(d.score[i], 3)
        rows.append(row)
    with st.container(key="fleet-decision"):
        st.markdown(md_table(rows))


def replica_rows(figures, lang: str) -> list[dict]:
    return [
        {
            tr("fleet.lesson.col_replica", lang): r.replica,
            tr("fleet.panel.col_routed", lang): r.routed,
            tr("fleet.panel.col_running", lang): r.running,
            tr("fleet.panel.col_waiting", lang): r.waiting,
            tr("fleet.panel.col_usage", lang): _pct(r.usage),
            tr("fleet.panel.col_hits", lang): f"{r.hits} / {r.queries}",
        }
        for r in figures.replicas
    ]


def show_fleet(run: Any, lang: str, lesson=None, ms=None, overrides=None) -> None:
    """The panel at the player's step (``run``: the session's Timeline over a fleet's run);
    with ``lesson`` and ``ms``, the comparison of every policy under it."""
    scenario = run.scenario
    conf = scenario.engine.fleet
    settings = router_settings(dict(conf.router_settings))
    shown = run.shown_records()
    figures = fleet_figures(shown, conf.replicas, run.initial)
    step = shown[-1].step if shown else 0
    st.markdown(f"**{tr('fleet.panel.title', lang, step=step)}**")
    if figures.routed:
        show_decision(figures.routed[-1], settings, lang)
    else:
        st.caption(tr("fleet.panel.none_routed", lang))
    with st.container(key="fleet-replicas"):
        st.markdown(md_table(replica_rows(figures, lang)))
    st.caption(
        tr(
            "fleet.panel.rates",
            lang,
            router=_pct(figures.router_hit_rate),
            engine=_pct(figures.engine_hit_rate),
            hits=figures.engine_hits,
            queries=figures.engine_queries,
        )
    )
    if lesson is not None and ms is not None:
        show_compare(lesson, ms, overrides or {}, conf.router, lang)


def _policy_runs(lesson, ms, overrides: dict, current: str, lang: str) -> dict:
    """The runs of the lesson's scenario (its other switches as the page has them) under the
    policies this session played, or under every registered one once asked (a button: each is
    a whole fleet on the model, computed once per server); opened once per session and held, so
    the store computes them."""
    from paged_kv_lab.ui.state import build_scenario, open_run

    held = st.session_state.setdefault(f"fleet:policy_runs:{lesson.id}", {})
    played = st.session_state.setdefault(f"fleet:compared:{lesson.id}", [])
    if current not in played:
        played.append(current)
    names = policies()
    rest = [p for p in names if p not in played]
    ask = tr("fleet.lesson.compare_all", lang)
    if rest and st.button(ask, key=f"fleet:compare_all:{lesson.id}"):
        played.extend(rest)
    base = {k: v for k, v in overrides.items() if k != ROUTER_SETTING}
    out = {}
    for p in [p for p in names if p in played]:
        name = (p, ms.name, ms.device, tuple(sorted(base.items())))
        timeline = held.get(name)
        if timeline is None:
            scenario = build_scenario(lesson, lesson.scenario, {**base, ROUTER_SETTING: p}, ms)
            timeline = held[name] = open_run(scenario, ms)
        timeline.run.want(1 << 30)
        out[p] = timeline
    return out


def compare_rows(runs: dict, num_replicas: int, lang: str) -> list[dict]:
    rows = []
    for p, timeline in runs.items():
        run = timeline.run
        label = tr(f"fleet.router.{p}", lang)
        if not run.done:
            rows.append({tr("fleet.lesson.col_policy", lang): label})
            continue
        f = fleet_figures(run.records, num_replicas, run.initial)
        rows.append(
            {
                tr("fleet.lesson.col_policy", lang): label,
                tr("fleet.panel.col_engine_rate", lang): _pct(f.engine_hit_rate),
                tr("fleet.panel.col_router_rate", lang): _pct(f.router_hit_rate),
                tr("fleet.panel.col_per_replica", lang): " · ".join(
                    str(r.routed) for r in f.replicas
                ),
                tr("fleet.panel.col_peak_waiting", lang): " · ".join(
                    str(w) for w in peak_waiting(run.records, num_replicas)
                ),
                tr("fleet.lesson.col_placement", lang): " ".join(
                    f"{r.request_id}→{r.replica}" for r in f.routed
                ),
            }
        )
    return rows


def peak_waiting(records, num_replicas: int) -> list[int]:
    """Per replica, the most requests its scheduler held waiting after any of its steps."""
    peak = [0] * num_replicas
    for rec in records:
        if isinstance(rec.replica, int):
            peak[rec.replica] = max(peak[rec.replica], len(rec.snapshot.waiting))
    return peak


def show_compare(lesson, ms, overrides: dict, current: str, lang: str) -> None:
    st.markdown(f"**{tr('fleet.lesson.compare', lang)}**")
    runs = _policy_runs(lesson, ms, overrides, current, lang)
    n = lesson_replicas(runs)
    with st.container(key="fleet-compare"):
        st.markdown(md_table(compare_rows(runs, n, lang)))
    pending = [p for p, t in runs.items() if not t.run.done]
    st.caption(
        tr("fleet.lesson.compare_caption", lang, policy=Text(f"fleet.router.{current}"))
        + (" " + tr("fleet.panel.computing", lang, n=len(pending)) if pending else "")
    )


def lesson_replicas(runs: dict) -> int:
    timeline = next(iter(runs.values()))
    return timeline.run.scenario.engine.fleet.replicas
