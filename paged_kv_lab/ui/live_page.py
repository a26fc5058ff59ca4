"""Live vLLM: watch a running vLLM server's prefix cache through its KV events.

One ``KVEventWatcher`` (watch/watcher.py) per endpoint per server process, shared
by every session that connects to it; a session holds only the key of the
watcher it looks at. The pictures redraw every second from the watcher's
snapshot. "Would this prompt hit?" hashes a prompt as the server does
(hash algorithm, NONE_HASH seed, block size, salt) and counts the leading
blocks the server holds now.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Optional

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from kvcore.utils.hashing import HASH_FUNCTIONS
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.watch.prefix_index import CacheEntry, leading_hits
from paged_kv_lab.watch.watcher import KVEventWatcher

MAX_WATCHERS = 8  # background subscribers per server process
WATCH_HOSTS_ENV = "PAGED_KV_LAB_WATCH_HOSTS"
MAX_TREE_NODES = 1500
MAX_PROMPT_CHARS = 20_000
MAX_PROMPT_TOKENS = 8192
_ENDPOINT = re.compile(r"^tcp://(\*|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]{1,253}):\d{1,5}$")

# -- shared watchers ------------------------------------------------------------------------------
_lock = threading.Lock()
_watchers: dict[tuple, KVEventWatcher] = {}
_last_viewed: dict[tuple, float] = {}
IDLE_STOP_S = 600  # a watcher no session has looked at for this long gives its place up


def watcher_key(endpoint: str, replay: Optional[str], topic: str, bind: bool, ranks: int) -> tuple:
    return (endpoint, replay or None, topic, bool(bind), int(ranks))


def check_endpoints(endpoint: str, replay: str, bind: bool, lang: str) -> Optional[str]:
    """A message naming what is wrong with the form, or None."""
    if not _ENDPOINT.match(endpoint or ""):
        return tr(
            "live.bad_endpoint", lang, field=tr("live.endpoint", lang), value=(endpoint or "")[:80]
        )
    if replay and not _ENDPOINT.match(replay):
        return tr("live.bad_endpoint", lang, field=tr("live.replay", lang), value=replay[:80])
    if bind and not re.match(r"^tcp://(\*|127\.0\.0\.1|localhost|\[::1?\]):", endpoint):
        return tr("live.bind_star", lang)
    allowed = allowed_hosts()
    for field, value in (("endpoint", endpoint), ("replay", replay)):
        host = value and value[len("tcp://") : value.rindex(":")].strip("[]")
        if host and host != "*" and "*" not in allowed and host.lower() not in allowed:
            return tr(
                "live.host_not_allowed",
                lang,
                field=tr(f"live.{field}", lang),
                host=host,
                hosts=", ".join(sorted(allowed)),
            )
    return None


def allowed_hosts() -> set[str]:
    """Hosts the page may connect to: loopback by default, so a visitor cannot make a shared server
    open connections elsewhere; PAGED_KV_LAB_WATCH_HOSTS widens it (comma-separated; "*" = any)."""
    raw = os.environ.get(WATCH_HOSTS_ENV, "")
    extra = {h.strip().lower().strip("[]") for h in raw.split(",") if h.strip()}
    return {"127.0.0.1", "localhost", "::1"} | extra


def connect(key: tuple, lang: str) -> tuple[Optional[KVEventWatcher], Optional[str]]:
    """The shared watcher for ``key``, started if new; (None, message) if refused."""
    with _lock:
        w = _watchers.get(key)
        if w is not None and w.running:
            return w, None
        now = time.monotonic()
        for k, old in list(_watchers.items()):
            if not old.running or now - _last_viewed.get(k, now) > IDLE_STOP_S:
                old.stop(timeout=0.5)  # stopped, failed or forgotten: its place is free
                del _watchers[k]
                _last_viewed.pop(k, None)
        if key not in _watchers and len(_watchers) >= MAX_WATCHERS:
            return None, tr("live.too_many", lang, n=MAX_WATCHERS)
        endpoint, replay, topic, bind, ranks = key
        try:
            w = KVEventWatcher(endpoint, replay, topic, bind, ranks)
        except ValueError as e:
            return None, str(e)
        _watchers[key] = w.start()
        _last_viewed[key] = now
        return w, None


def disconnect(key: tuple) -> None:
    """Stops the shared watcher: every session looking at this endpoint loses it."""
    with _lock:
        w = _watchers.pop(key, None)
        _last_viewed.pop(key, None)
    if w is not None:
        w.stop()


def get_watcher(key: Optional[tuple]) -> Optional[KVEventWatcher]:
    if key is None:
        return None
    with _lock:
        w = _watchers.get(key)
        if w is not None:
            _last_viewed[key] = time.monotonic()
        return w


# -- pictures ------------------------------------------------------------------------------------
def _label(text: str) -> str:
    # Plotly reads a few HTML tags (<b>, <br>, <a href>) in text; token text is data, so its
    # angle brackets are swapped for look-alikes that no renderer takes for markup.
    return text.replace("\n", "⏎").replace("<", "‹").replace(">", "›")


def chain_depths(entries: dict[str, CacheEntry]) -> dict[str, int]:
    """Blocks from the start of the prompt to each entry, following parents held in the tier
    (an entry whose chain breaks counts from the break)."""
    depth: dict[str, int] = {}
    for h in entries:
        path = []
        cur: Optional[str] = h
        while cur is not None and cur in entries and cur not in depth and len(path) < 100_000:
            path.append(cur)
            cur = entries[cur].parent_block_hash
        base = depth.get(cur, 0) if cur is not None else 0
        for i, node in enumerate(reversed(path)):
            depth[node] = base + i + 1
    return depth


def tree_figure(entries: dict[str, CacheEntry], decode, lang: str) -> go.Figure:
    """An icicle of the hash chains: each block under its parent, blocks of a shared prefix
    shared."""
    depth = chain_depths(entries)
    keep = sorted(entries, key=lambda h: depth.get(h, 0))[:MAX_TREE_NODES]
    kept = set(keep)
    root, orphans, unknown = "root", "orphans", "unknown"
    ids, parents, labels, hover = [root], [""], [tr("live.root", lang)], [""]
    extra_roots = set()
    for h in keep:
        e = entries[h]
        if e.token_ids is None:
            parent = unknown
        elif e.parent_block_hash is None:
            parent = root
        elif e.parent_block_hash in kept:
            parent = e.parent_block_hash
        else:
            parent = orphans
        if parent in (orphans, unknown):
            extra_roots.add(parent)
        text = decode(e.token_ids) if (decode is not None and e.token_ids) else ""
        ids.append(h)
        parents.append(parent)
        labels.append(_label(f"{h[:8]} {text[:24]}" if text else h[:8]))
        hover.append(
            _label(
                f"{h} ×{e.count} · {len(e.token_ids or ())} tokens"
                + (f" · {text[:80]}" if text else "")
            )
        )
    for name in sorted(extra_roots):
        ids.append(name)
        parents.append("")
        labels.append(tr("live." + (name if name != "unknown" else "unknown_tokens"), lang))
        hover.append("")
    fig = go.Figure(
        go.Icicle(
            ids=ids,
            parents=parents,
            labels=labels,
            hovertext=hover,
            hoverinfo="text",
            tiling={"orientation": "h"},
            maxdepth=8,
            root_color="#e8e8e8",
        )
    )
    fig.update_layout(margin=dict(l=0, r=0, t=10, b=0), height=420)
    return fig


def longest_prefixes(entries: dict[str, CacheEntry], decode, limit: int = 10) -> list[dict]:
    depth = chain_depths(entries)
    parents = {e.parent_block_hash for e in entries.values()}
    leaves = [h for h in entries if h not in parents]
    rows = []
    for h in sorted(leaves, key=lambda h: -depth.get(h, 0))[:limit]:
        e = entries[h]
        text = decode(e.token_ids) if (decode is not None and e.token_ids) else ""
        rows.append(
            {
                "blocks": depth.get(h, 0),
                "tokens": depth.get(h, 0) * e.block_size,
                "last": h,
                "text": text[-80:],
            }
        )
    return rows


def _decoder(ms):
    model = getattr(ms, "model", None)
    if model is None:
        return None
    return lambda ids: model.decode(list(ids))


# -- the page ------------------------------------------------------------------------------------
def render_live_page() -> None:
    lang = st.session_state.get("_prefs", {}).get("lang", st.session_state.get("lang", "en"))
    st.title(f"📡 {tr('live.title', lang)}")
    st.caption(tr("live.intro", lang))
    with st.form("live:connect"):
        c1, c2 = st.columns(2)
        endpoint = c1.text_input(
            tr("live.endpoint", lang), "tcp://127.0.0.1:5557", key="live:endpoint", max_chars=300
        )
        replay = c2.text_input(
            tr("live.replay", lang), "tcp://127.0.0.1:5558", key="live:replay", max_chars=300
        )
        c3, c4, c5 = st.columns([2, 2, 3])
        topic = c3.text_input(tr("live.topic", lang), "kv-events", key="live:topic", max_chars=200)
        ranks = c4.number_input(tr("live.ranks", lang), 1, 16, 1, key="live:ranks")
        bind = c5.checkbox(tr("live.bind", lang), key="live:bind")
        go_connect = st.form_submit_button(tr("live.connect", lang))
    if go_connect:
        problem = check_endpoints(endpoint.strip(), replay.strip(), bind, lang)
        if problem:
            st.error(problem)
        else:
            key = watcher_key(endpoint.strip(), replay.strip() or None, topic, bind, ranks)
            w, problem = connect(key, lang)
            if problem:
                st.error(problem)
            else:
                st.session_state["live:key"] = key
    from paged_kv_lab.ui.fleet_live import demo_button, fleet_form

    demo_button(lang)
    fleet_form(lang)
    key = st.session_state.get("live:key")
    if key is not None and st.button(tr("live.disconnect", lang), key="live:disconnect"):
        disconnect(key)
        st.session_state.pop("live:key", None)
        key = None
    watcher = get_watcher(key)
    if watcher is None:
        st.info(tr("live.not_connected", lang))
    else:
        st.fragment(_live_view, run_every=1.0)(key, lang)
    _hit_form(watcher, lang)


def _live_view(key: tuple, lang: str) -> None:
    watcher = get_watcher(key)  # also marks it as looked at
    if watcher is None:
        st.info(tr("live.not_connected", lang))
        return
    snap = watcher.snapshot(with_state=False)
    if snap.error:
        st.error(tr("live.failed", lang, error=snap.error))
    elif not watcher.connected.is_set():
        st.info(tr("live.waiting", lang))
    s = snap.stats
    st.markdown(
        tr(
            "live.status",
            lang,
            batches=s.batches,
            replayed=s.replayed_batches,
            gaps=s.gaps,
            lost=s.lost_batches,
            restarts=s.restarts,
            skipped=s.garbage_messages + s.oversized_messages,
        )
    )
    if s.hashes_over_cap:
        st.warning(tr("live.over_cap", lang, n=s.hashes_over_cap))
    c1, c2, c3 = st.columns(3)
    rank = c1.selectbox(tr("live.rank", lang), [r.rank for r in snap.ranks], key="live:rank")
    rv = snap.ranks[rank]
    media = rv.media or ["GPU"]
    medium = c2.selectbox(tr("live.tier", lang), media, key="live:medium")
    groups = sorted({g for (m, g) in watcher.tiers(rank) if m == medium} | set(rv.group_info)) or [
        "0"
    ]
    group = c3.selectbox(
        tr("live.group", lang),
        groups,
        key="live:group",
        format_func=lambda g: tr(
            "live.group_label",
            lang,
            g=g,
            kind=(rv.group_info.get(g) or {}).get("kv_cache_spec_kind") or "?",
        ),
    )
    entries = watcher.entries(rank, medium, group)
    from paged_kv_lab.ui.fleet_live import is_demo

    # the demo's tokens are a trace's stand-ins (workloads/tokens.py): no text to decode
    decode = None if is_demo(key) else _decoder(st.session_state.get("_model_state"))
    st.subheader(tr("live.tree", lang))
    if entries:
        st.plotly_chart(
            tree_figure(entries, decode, lang), key="live:tree", config={"displayModeBar": False}
        )
    else:
        st.caption(tr("live.tree_empty", lang))
    hist = snap.history
    c1, c2 = st.columns(2)
    with c1:
        st.markdown(f"**{tr('live.rates', lang)}**")
        fig = go.Figure()
        xs = pd.to_datetime([h["t"] for h in hist], unit="s")
        fig.add_scatter(x=xs, y=[h["stored"] for h in hist], name=tr("live.stored", lang))
        fig.add_scatter(x=xs, y=[-h["removed"] for h in hist], name=tr("live.removed", lang))
        fig.update_layout(height=260, margin=dict(l=0, r=0, t=10, b=0))
        st.plotly_chart(fig, key="live:rates", config={"displayModeBar": False})
    with c2:
        st.markdown(f"**{tr('live.cached', lang)}**")
        fig = go.Figure()
        series = sorted({k for h in hist for k in h["cached"]})
        for name in series:
            fig.add_scatter(
                x=pd.to_datetime([h["t"] for h in hist], unit="s"),
                y=[h["cached"].get(name, 0) for h in hist],
                name=name,
            )
        fig.update_layout(height=260, margin=dict(l=0, r=0, t=10, b=0))
        st.plotly_chart(fig, key="live:cached", config={"displayModeBar": False})
    st.subheader(tr("live.longest", lang))
    rows = longest_prefixes(entries, decode)
    cols = {c: tr(f"live.col_{c}", lang) for c in ("blocks", "tokens", "last", "text")}
    st.dataframe(
        pd.DataFrame([{cols[c]: r[c] for c in cols} for r in rows]),
        hide_index=True,
        key="live:longest",
    )
    with st.expander(tr("live.log", lang)):
        st.code("\n".join(snap.log[-60:]) or "-", language=None)
    from paged_kv_lab.ui.fleet_live import render_fleet_index

    render_fleet_index(key, lang)


def _hit_form(watcher: Optional[KVEventWatcher], lang: str) -> None:
    st.subheader(tr("live.hit_title", lang))
    # The tier picked above (rank, medium, group) is the one checked.
    rank = st.session_state.get("live:rank", 0)
    medium = st.session_state.get("live:medium", "GPU")
    group = st.session_state.get("live:group", "0")
    info = {}
    if watcher is not None:
        snap = watcher.snapshot(with_state=False)
        rank = rank if rank < len(snap.ranks) else 0
        info = snap.ranks[rank].group_info.get(group, {})
    with st.form("live:hit"):
        prompt = st.text_area(
            tr("live.prompt", lang), key="live:prompt", max_chars=MAX_PROMPT_CHARS
        )
        chat = st.checkbox(tr("live.chat", lang), key="live:chat")
        ids_text = st.text_input(
            tr("live.token_ids", lang), key="live:ids", max_chars=MAX_PROMPT_TOKENS * 8
        )
        c1, c2, c3, c4 = st.columns(4)
        block_size = c1.number_input(
            tr("live.block_size", lang),
            1,
            1024,
            int(info.get("block_size") or 16),
            key="live:block_size",
        )
        algo = c2.selectbox(
            tr("live.hash_algo", lang),
            sorted(HASH_FUNCTIONS),
            key="live:algo",
            index=sorted(HASH_FUNCTIONS).index("sha256") if "sha256" in HASH_FUNCTIONS else 0,
        )
        seed = c3.text_input(
            tr("live.seed", lang), "vllm-none-hash", key="live:seed", max_chars=100
        )
        salt = c4.text_input(tr("live.salt", lang), "", key="live:salt", max_chars=200)
        go_check = st.form_submit_button(tr("live.check", lang))
    if not go_check:
        return
    ids = None
    if ids_text.strip():
        parts = [p.strip() for p in ids_text.split(",") if p.strip()]
        if len(parts) > MAX_PROMPT_TOKENS or not all(p.isdigit() for p in parts):
            st.error(tr("live.bad_ids", lang, n=MAX_PROMPT_TOKENS))
            return
        ids = [int(p) for p in parts]
    elif prompt.strip():
        ms = st.session_state.get("_model_state")
        model = getattr(ms, "model", None)
        if model is not None:
            ids = model.encode_prompt(prompt, chat)[:MAX_PROMPT_TOKENS]
    if not ids:
        st.error(tr("live.no_tokens", lang))
        return
    entries: dict = {}
    use_int = True
    if watcher is not None:
        entries = watcher.entries(rank, medium, group)
        use_int = not entries or len(next(iter(entries))) == 16
    hits, texts = leading_hits(
        entries, ids, int(block_size), algo, seed or "vllm-none-hash", salt or None, use_int
    )
    st.success(
        tr("live.hit_result", lang, hits=hits, blocks=len(texts), tokens=hits * int(block_size))
    )
    st.dataframe(
        pd.DataFrame(
            {
                "block": list(range(len(texts))),
                "hash": texts,
                "cached": [h in entries for h in texts],
            }
        ),
        hide_index=True,
        key="live:hits",
    )
