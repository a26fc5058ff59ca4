"""Real workloads' fleet mode: the trace shown, with the page's settings per replica, through N
replicas behind a router (fleet/trace_fleet.py); per-replica figures and curves over the trace's
clock.

A fleet run is computed once per (trace, settings, replicas, router) and process, and shared
(``FLEETS``, a kind of the server's one cache: runs/server_cache.py).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from paged_kv_lab.store.server_cache import Shared
from paged_kv_lab.text.i18n import tr

MAX_REPLICAS = 8
CHART_POINTS = 400
# (trace key, settings, replicas, router) -> (figures, each replica's series, its sub-trace); a
# failure is not kept (the next click tries again)
FLEETS: Shared[tuple] = Shared("fleet workloads", keep_errors=False)


def fleet_result(trace_key: str, trace, settings, replicas: int, policy: str):
    """The fleet's figures and each replica's series (sampled), for the page."""

    def compute():
        from paged_kv_lab.fleet.trace_fleet import fleet_result, sub_trace, trace_fleet

        fleet = trace_fleet(trace, settings.replay_settings(trace), replicas, policy)
        fleet.run()
        series = [r.result().series.sample(CHART_POINTS) for r in fleet.replicas]
        subs = [sub_trace(fleet, i) for i in range(replicas)]
        return fleet_result(fleet), series, subs

    return FLEETS.get((trace_key, settings, replicas, policy), compute)


def render_fleet_mode(trace, trace_key: str, settings, lang: str) -> None:
    from paged_kv_lab.fleet.router import policies

    # drawn only once opened: a closed expander costs the page nothing
    box = st.expander(tr("fleet.workloads.title", lang), key="fleet:wl_open", on_change="rerun")
    if not box.open:
        return
    with box:
        st.caption(tr("fleet.workloads.intro", lang))
        with st.form("fleet:wl"):
            c1, c2 = st.columns(2)
            replicas = c1.number_input(tr("fleet.workloads.replicas", lang), 1, MAX_REPLICAS, 4)
            policy = c2.selectbox(
                tr("fleet.lesson.policy", lang),
                policies(),
                index=policies().index("prefix"),
                format_func=lambda p: tr(f"fleet.router.{p}", lang),
            )
            go = st.form_submit_button(tr("fleet.workloads.run", lang))
        if go:
            st.session_state["fleet:wl_choice"] = (trace_key, settings, int(replicas), policy)
        choice = st.session_state.get("fleet:wl_choice")
        if choice is None or choice[0] != trace_key:
            return
        _, chosen, n, pol = choice
        with st.spinner(tr("fleet.workloads.running", lang)):
            result, series, subs = fleet_result(trace_key, trace, chosen, n, pol)
        st.markdown(
            tr(
                "fleet.workloads.totals",
                lang,
                n=n,
                policy=tr(f"fleet.router.{pol}", lang),
                rate=f"{result.hit_rate:.1%}",
                evictions=f"{result.evictions:,}",
                source=tr(f"fleet.router.{pol}.source", lang),
            )
        )
        rows = [
            {
                tr("fleet.lesson.col_replica", lang): r.replica,
                tr("fleet.workloads.col_requests", lang): r.requests,
                tr("fleet.lesson.col_hit_rate", lang): f"{r.hit_rate:.1%}",
                tr("fleet.workloads.col_peak", lang): f"{r.peak_usage:.0%}",
                tr("fleet.workloads.col_evictions", lang): r.evictions,
            }
            for r in result.replicas
        ]
        st.dataframe(pd.DataFrame(rows), hide_index=True, key="fleet:wl_table")
        for name, values in (
            ("usage", lambda s: s.usage()),
            ("hit_rate", lambda s: s.hit_rate()),
        ):
            frames = [
                pd.DataFrame(
                    {
                        "t": [c / 1000 for c in s.clock_ms],
                        "v": values(s),
                        "replica": tr("fleet.live.replica", lang, i=i),
                    }
                )
                for i, s in enumerate(series)
            ]
            data = pd.concat(frames) if frames else pd.DataFrame()
            st.markdown(f"**{tr(f'fleet.workloads.chart_{name}', lang)}**")
            st.line_chart(data, x="t", y="v", color="replica", height=220)
        step_into_replica(subs, trace_key, (n, pol), lang)


def step_into_replica(subs, trace_key: str, fleet_key: tuple, lang: str) -> None:
    """Make one replica's requests the page's trace: its replay is exactly that replica's run
    (fleet/trace_fleet.py, sub_trace), so the page's over-time chart, step-into and large-pool
    player show that replica's pool."""
    from paged_kv_lab.ui.workloads_page import get_workloads_state, use_trace

    c1, c2 = st.columns([1, 2], vertical_alignment="bottom")
    i = c1.selectbox(
        tr("fleet.workloads.pick_replica", lang),
        [j for j, sub in enumerate(subs) if len(sub)],
        format_func=lambda j: tr("fleet.live.replica", lang, i=j),
        key="fleet:wl_replica",
    )
    if i is not None and c2.button(tr("fleet.workloads.step_into", lang), key="fleet:wl_into"):
        use_trace(get_workloads_state(), subs[i], f"{trace_key}#fleet{fleet_key}#{i}")
        st.rerun()
    st.caption(tr("fleet.workloads.step_into_help", lang))
