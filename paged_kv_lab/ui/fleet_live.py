"""The Live vLLM page's fleet parts: the demo server, more endpoints watched as one fleet, and the
router's global index drawn from what every replica's KV events say.

The demo server is one ``DemoSource`` (fleet/demo_publisher.py) per Streamlit process, shared by
every
session: a fleet of our engine replaying the shipped trace model-free, each replica publishing as
a data-parallel rank of one vLLM server would (PUB connecting to loopback ports the page's
watcher binds, replay ROUTERs on loopback). A replica of the fleet, in the pictures, is one rank
of one watched endpoint.
"""

from __future__ import annotations

import threading
from typing import Optional

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from paged_kv_lab.text.i18n import tr

DEMO_REPLICAS = 3
DEMO_PACE_MS = 150.0
MAX_FLEET_ENDPOINTS = 7  # more endpoints besides the main one (each its own shared watcher)
MAX_INDEX_ROWS = 15

_lock = threading.Lock()
_demo = {"source": None, "key": None}


def start_demo(lang: str) -> tuple[Optional[tuple], Optional[str]]:
    """The demo server's watcher key, the demo started if none runs; (None, why) if refused."""
    from paged_kv_lab.fleet.demo_publisher import DemoSource, demo_fleet, free_port_run
    from paged_kv_lab.ui.live_page import connect, get_watcher, watcher_key

    with _lock:
        src, key = _demo["source"], _demo["key"]
        if src is not None and src.running and get_watcher(key) is not None:
            return key, None
        if src is not None:
            src.stop(timeout=1.0)
        try:
            port = free_port_run(2 * DEMO_REPLICAS)
        except OSError as e:
            return None, str(e)
        endpoint = f"tcp://127.0.0.1:{port}"
        replay = f"tcp://127.0.0.1:{port + DEMO_REPLICAS}"
        key = watcher_key(endpoint, replay, "", True, DEMO_REPLICAS)
        watcher, problem = connect(key, lang)
        if problem:
            return None, problem
        watcher.connected.wait(5)
        try:
            src = DemoSource(demo_fleet(replicas=DEMO_REPLICAS), endpoint, replay, "", DEMO_PACE_MS)
        except Exception as e:  # a port taken between the probe and the bind
            return None, str(e)
        _demo["source"], _demo["key"] = src.start(), key
        return key, None


def demo_source():
    return _demo["source"]


def is_demo(key: Optional[tuple]) -> bool:
    """Whether ``key`` is the demo server's watcher."""
    return key is not None and key == _demo["key"]


def demo_button(lang: str) -> None:
    """The "demo server" button: starts (or joins) the demo and watches it in this session."""
    c1, c2 = st.columns([1, 3])
    if c1.button(tr("fleet.live.demo", lang), key="live:demo"):
        key, problem = start_demo(lang)
        if problem:
            st.error(problem)
        else:
            st.session_state["live:key"] = key
    c2.caption(tr("fleet.live.demo_help", lang, n=DEMO_REPLICAS))


def fleet_form(lang: str) -> None:
    """More endpoints watched with the main one, as one fleet (one per line: EVENTS [REPLAY])."""
    from paged_kv_lab.ui.live_page import check_endpoints, connect, watcher_key

    with st.expander(tr("fleet.live.more", lang)):
        with st.form("live:fleet"):
            text = st.text_area(tr("fleet.live.endpoints", lang), key="live:more", max_chars=3000)
            bind = st.checkbox(tr("live.bind", lang), key="live:more_bind")
            go_watch = st.form_submit_button(tr("fleet.live.watch", lang))
        if not go_watch:
            return
        keys = []
        lines = [ln.split() for ln in text.splitlines() if ln.strip()]
        if len(lines) > MAX_FLEET_ENDPOINTS:
            st.error(tr("fleet.live.too_many", lang, n=MAX_FLEET_ENDPOINTS))
            return
        for parts in lines:
            endpoint, replay = parts[0], (parts[1] if len(parts) > 1 else "")
            problem = check_endpoints(endpoint, replay, bind, lang)
            if problem is None:
                key = watcher_key(endpoint, replay or None, "", bind, 1)
                _, problem = connect(key, lang)
            if problem:
                st.error(problem)
                return
            keys.append(key)
        st.session_state["live:fleet_keys"] = keys


def replicas_of(main_key: Optional[tuple]) -> list[tuple[str, object, int]]:
    """Every watched replica: (label, watcher, rank), the main endpoint's ranks first."""
    from paged_kv_lab.ui.live_page import get_watcher

    out = []
    keys = ([main_key] if main_key is not None else []) + list(
        st.session_state.get("live:fleet_keys", [])
    )
    for key in keys:
        w = get_watcher(key)
        if w is None:
            continue
        for rank in range(key[4]):
            out.append((f"{key[0]}#{rank}" if key[4] > 1 else key[0], w, rank))
    return out


def global_index(replicas) -> tuple[list[dict], dict[str, list[int]]]:
    """Per replica its GPU blocks of group 0 (hash -> entry), and every hash with the replicas
    (by position) that hold it: the router's global index."""
    per = [w.entries(rank, "GPU", "0") for _, w, rank in replicas]
    holders: dict[str, list[int]] = {}
    for i, entries in enumerate(per):
        for h in entries:
            holders.setdefault(h, []).append(i)
    return per, holders


def render_fleet_index(main_key: Optional[tuple], lang: str) -> None:
    """The router's global index, when more than one replica is watched."""
    from paged_kv_lab.ui.live_page import chain_depths

    replicas = replicas_of(main_key)
    if len(replicas) < 2:
        return
    per, holders = global_index(replicas)
    st.subheader(tr("fleet.live.index_title", lang, n=len(replicas)))
    st.caption(tr("fleet.live.index_intro", lang))
    labels = [tr("fleet.live.replica", lang, i=i) for i in range(len(replicas))]
    only = [sum(1 for h in e if len(holders[h]) == 1) for e in per]
    shared = [len(e) - o for e, o in zip(per, only)]
    fig = go.Figure()
    fig.add_bar(x=labels, y=only, name=tr("fleet.live.only_here", lang))
    fig.add_bar(x=labels, y=shared, name=tr("fleet.live.shared", lang))
    fig.update_layout(barmode="stack", height=240, margin=dict(l=0, r=0, t=10, b=0))
    st.plotly_chart(fig, key="live:fleet_bars", config={"displayModeBar": False})
    merged = {}
    for e in per:
        merged.update(e)
    depth = chain_depths(merged)
    rows = [
        {
            tr("fleet.live.col_hash", lang): h[:16],
            tr("fleet.live.col_depth", lang): depth.get(h, 0),
            tr("fleet.live.col_holders", lang): ", ".join(str(i) for i in holders[h]),
        }
        for h in sorted(holders, key=lambda h: (-depth.get(h, 0), h))[:MAX_INDEX_ROWS]
    ]
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="live:fleet_index")
    st.caption(
        tr(
            "fleet.live.index_totals",
            lang,
            hashes=len(holders),
            shared=sum(1 for v in holders.values() if len(v) > 1),
        )
    )
    src = demo_source()
    if src is not None and is_demo(main_key):
        if src.error:
            st.error(src.error)
        st.caption(
            tr(
                "fleet.live.demo_status",
                lang,
                sent=src.sent,
                routed=src.fleet.next,
                total=len(src.fleet.requests),
            )
        )
