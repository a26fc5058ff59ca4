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
from watch.prefix_index import CacheEntry, leading_hits
from watch.watcher import KVEventWatcher

PAGE_FILE = "pages/9_live_vllm.py"
MAX_WATCHERS = 8                 # background subscribers per server process
WATCH_HOSTS_ENV = "PAGED_KV_LAB_WATCH_HOSTS"
MAX_TREE_NODES = 1500
MAX_PROMPT_CHARS = 20_000
MAX_PROMPT_TOKENS = 8192
_ENDPOINT = re.compile(r"^tcp://(\*|\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.\-]{1,253}):\d{1,5}$")

TEXT: dict[str, tuple[str, str]] = {
    "title": ("Live vLLM", "实时 vLLM"),
    "intro": ("Point this page at a vLLM 0.33 server started with KV events on "
              "(`--kv-events-config '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
              "\"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", \"topic\": \"kv-events\"}'`). "
              "Every block it caches or evicts arrives here; the page rebuilds its prefix cache.",
              "把本页指向一个开启了 KV 事件的 vLLM 0.33 服务器（`--kv-events-config '{\"enable_kv_cache_events\": true, "
              "\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\", "
              "\"topic\": \"kv-events\"}'`）。它缓存或驱逐的每个块都会发到这里，本页据此重建它的前缀缓存。"),
    "endpoint": ("Event endpoint", "事件端点"),
    "replay": ("Replay endpoint (optional)", "重放端点（可选）"),
    "topic": ("Topic", "主题"),
    "bind": ("Bind (the server's endpoint is a host address, so its socket connects to us)",
             "绑定（服务器端点是主机地址时，它的套接字会连接到我们）"),
    "ranks": ("Data-parallel ranks (rank r on port + r)", "数据并行 rank 数（rank r 使用端口 + r）"),
    "connect": ("Connect", "连接"),
    "disconnect": ("Disconnect", "断开"),
    "bad_endpoint": ("{field}: expected tcp://HOST:PORT (for example tcp://10.0.0.5:5557); got {value!r}",
                     "{field}：应为 tcp://主机:端口（例如 tcp://10.0.0.5:5557）；收到 {value!r}"),
    "bind_star": ("Bind needs a local address such as tcp://*:5557 or tcp://127.0.0.1:5557.",
                  "绑定需要本机地址，例如 tcp://*:5557 或 tcp://127.0.0.1:5557。"),
    "host_not_allowed": ("{field}: this server may watch only {hosts}; got host {host!r} "
                         "(set PAGED_KV_LAB_WATCH_HOSTS to a comma-separated list of hosts, or *, to allow more)",
                         "{field}：本服务器只能监视 {hosts}；收到主机 {host!r}"
                         "（把 PAGED_KV_LAB_WATCH_HOSTS 设为逗号分隔的主机列表或 * 以放开）"),
    "too_many": ("This server already watches {n} endpoints (the limit); disconnect one first.",
                 "本服务器已在监视 {n} 个端点（上限），请先断开一个。"),
    "failed": ("The watcher stopped: {error}", "监视器已停止：{error}"),
    "not_connected": ("Not connected.", "未连接。"),
    "waiting": ("Connecting…", "正在连接……"),
    "status": ("{batches} batches ({replayed} replayed) · {gaps} gaps · {lost} lost · {restarts} restarts · "
               "{skipped} bad messages skipped", "{batches} 批（{replayed} 批来自重放）· {gaps} 处缺口 · 丢失 {lost} 批 · "
               "重启 {restarts} 次 · 跳过 {skipped} 条坏消息"),
    "over_cap": ("{n} hashes were not kept: the index is at its cap.", "{n} 个哈希未保留：索引已达上限。"),
    "rank": ("Rank", "Rank"),
    "tier": ("Tier (medium)", "层级（介质）"),
    "group": ("KV cache group", "KV 缓存组"),
    "group_label": ("group {g}: {kind}", "组 {g}：{kind}"),
    "tree": ("Hash chains (shared prefixes share a path)", "哈希链（共享前缀共用一条路径）"),
    "tree_empty": ("No cached blocks in this group yet.", "该组还没有缓存块。"),
    "root": ("prompt start", "提示开头"),
    "orphans": ("parent not held", "父块不在缓存中"),
    "unknown_tokens": ("tokens not on the wire (sliding window)", "线上没有其 token（滑动窗口）"),
    "rates": ("Blocks stored and removed per second", "每秒存入和移除的块数"),
    "stored": ("stored", "存入"),
    "removed": ("removed", "移除"),
    "cached": ("Cached blocks per tier and group", "各层级、各组的缓存块数"),
    "longest": ("Longest cached prefixes", "最长的已缓存前缀"),
    "col_blocks": ("blocks", "块数"),
    "col_tokens": ("tokens", "token 数"),
    "col_last": ("last block", "最后一块"),
    "col_text": ("text (end of prefix)", "文本（前缀末尾）"),
    "hit_title": ("Would this prompt hit?", "这个提示会命中吗？"),
    "prompt": ("Prompt text (tokenized with the sidebar's model)", "提示文本（用侧边栏的模型分词）"),
    "chat": ("Apply the chat template", "套用对话模板"),
    "token_ids": ("…or token ids, comma separated", "……或 token id，逗号分隔"),
    "block_size": ("Block size", "块大小"),
    "hash_algo": ("Hash algorithm (prefix_caching_hash_algo)", "哈希算法（prefix_caching_hash_algo）"),
    "seed": ("NONE_HASH seed: the server's PYTHONHASHSEED, or vllm-none-hash when unset",
             "NONE_HASH 种子：服务器的 PYTHONHASHSEED，未设置时为 vllm-none-hash"),
    "salt": ("cache_salt (optional)", "cache_salt（可选）"),
    "check": ("Check", "检查"),
    "hit_result": ("{hits} of {blocks} leading full blocks are cached on the server now ({tokens} tokens).",
                   "服务器现在缓存了前 {blocks} 个完整块中的 {hits} 个（{tokens} 个 token）。"),
    "no_tokens": ("Give a prompt (with a model loaded in the sidebar) or token ids.",
                  "请输入提示（需在侧边栏加载模型）或 token id。"),
    "bad_ids": ("Token ids must be integers >= 0 separated by commas (at most {n}).",
                "token id 必须是以逗号分隔的非负整数（最多 {n} 个）。"),
    "too_long": ("The prompt is longer than {n} characters.", "提示超过 {n} 个字符。"),
    "log": ("Event log", "事件日志"),
}


def t(key: str, lang: str, **fields) -> str:
    en, zh = TEXT[key]
    text = zh if lang == "zh" else en
    return text.format(**fields) if fields else text


# -- shared watchers ------------------------------------------------------------------------------
_lock = threading.Lock()
_watchers: dict[tuple, KVEventWatcher] = {}
_last_viewed: dict[tuple, float] = {}
IDLE_STOP_S = 600                # a watcher no session has looked at for this long gives its place up


def watcher_key(endpoint: str, replay: Optional[str], topic: str, bind: bool, ranks: int) -> tuple:
    return (endpoint, replay or None, topic, bool(bind), int(ranks))


def check_endpoints(endpoint: str, replay: str, bind: bool, lang: str) -> Optional[str]:
    """A message naming what is wrong with the form, or None."""
    if not _ENDPOINT.match(endpoint or ""):
        return t("bad_endpoint", lang, field=t("endpoint", lang), value=(endpoint or "")[:80])
    if replay and not _ENDPOINT.match(replay):
        return t("bad_endpoint", lang, field=t("replay", lang), value=replay[:80])
    if bind and not re.match(r"^tcp://(\*|127\.0\.0\.1|localhost|\[::1?\]):", endpoint):
        return t("bind_star", lang)
    allowed = allowed_hosts()
    for field, value in (("endpoint", endpoint), ("replay", replay)):
        host = value and value[len("tcp://"):value.rindex(":")].strip("[]")
        if host and host != "*" and "*" not in allowed and host.lower() not in allowed:
            return t("host_not_allowed", lang, field=t(field, lang), host=host, hosts=", ".join(sorted(allowed)))
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
                old.stop(timeout=0.5)     # stopped, failed or forgotten: its place is free
                del _watchers[k]
                _last_viewed.pop(k, None)
        if key not in _watchers and len(_watchers) >= MAX_WATCHERS:
            return None, t("too_many", lang, n=MAX_WATCHERS)
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
    """An icicle of the hash chains: each block under its parent, blocks of a shared prefix shared."""
    depth = chain_depths(entries)
    keep = sorted(entries, key=lambda h: depth.get(h, 0))[:MAX_TREE_NODES]
    kept = set(keep)
    root, orphans, unknown = "root", "orphans", "unknown"
    ids, parents, labels, hover = [root], [""], [t("root", lang)], [""]
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
        hover.append(_label(f"{h} ×{e.count} · {len(e.token_ids or ())} tokens"
                            + (f" · {text[:80]}" if text else "")))
    for name in sorted(extra_roots):
        ids.append(name)
        parents.append("")
        labels.append(t(name if name != "unknown" else "unknown_tokens", lang))
        hover.append("")
    fig = go.Figure(go.Icicle(ids=ids, parents=parents, labels=labels, hovertext=hover,
                              hoverinfo="text", tiling={"orientation": "h"}, maxdepth=8,
                              root_color="#e8e8e8"))
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
        rows.append({"blocks": depth.get(h, 0), "tokens": depth.get(h, 0) * e.block_size, "last": h,
                     "text": text[-80:]})
    return rows


def _decoder(ms):
    model = getattr(ms, "model", None)
    if model is None:
        return None
    return lambda ids: model.decode(list(ids))


# -- the page ------------------------------------------------------------------------------------
def render_live_page() -> None:
    lang = st.session_state.get("_prefs", {}).get("lang", st.session_state.get("lang", "en"))
    st.title(f"📡 {t('title', lang)}")
    st.caption(t("intro", lang))
    with st.form("live:connect"):
        c1, c2 = st.columns(2)
        endpoint = c1.text_input(t("endpoint", lang), "tcp://127.0.0.1:5557", key="live:endpoint", max_chars=300)
        replay = c2.text_input(t("replay", lang), "tcp://127.0.0.1:5558", key="live:replay", max_chars=300)
        c3, c4, c5 = st.columns([2, 2, 3])
        topic = c3.text_input(t("topic", lang), "kv-events", key="live:topic", max_chars=200)
        ranks = c4.number_input(t("ranks", lang), 1, 16, 1, key="live:ranks")
        bind = c5.checkbox(t("bind", lang), key="live:bind")
        go_connect = st.form_submit_button(t("connect", lang))
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
    key = st.session_state.get("live:key")
    if key is not None and st.button(t("disconnect", lang), key="live:disconnect"):
        disconnect(key)
        st.session_state.pop("live:key", None)
        key = None
    watcher = get_watcher(key)
    if watcher is None:
        st.info(t("not_connected", lang))
    else:
        st.fragment(_live_view, run_every=1.0)(key, lang)
    _hit_form(watcher, lang)


def _live_view(key: tuple, lang: str) -> None:
    watcher = get_watcher(key)        # also marks it as looked at
    if watcher is None:
        st.info(t("not_connected", lang))
        return
    snap = watcher.snapshot(with_state=False)
    if snap.error:
        st.error(t("failed", lang, error=snap.error))
    elif not watcher.connected.is_set():
        st.info(t("waiting", lang))
    s = snap.stats
    st.markdown(t("status", lang, batches=s.batches, replayed=s.replayed_batches, gaps=s.gaps,
                  lost=s.lost_batches, restarts=s.restarts, skipped=s.garbage_messages + s.oversized_messages))
    if s.hashes_over_cap:
        st.warning(t("over_cap", lang, n=s.hashes_over_cap))
    c1, c2, c3 = st.columns(3)
    rank = c1.selectbox(t("rank", lang), [r.rank for r in snap.ranks], key="live:rank")
    rv = snap.ranks[rank]
    media = rv.media or ["GPU"]
    medium = c2.selectbox(t("tier", lang), media, key="live:medium")
    groups = sorted({g for (m, g) in watcher.tiers(rank) if m == medium} | set(rv.group_info)) or ["0"]
    group = c3.selectbox(t("group", lang), groups, key="live:group",
                         format_func=lambda g: t("group_label", lang, g=g, kind=(rv.group_info.get(g) or {}).get(
                             "kv_cache_spec_kind") or "?"))
    entries = watcher.entries(rank, medium, group)
    decode = _decoder(st.session_state.get("_model_state"))
    st.subheader(t("tree", lang))
    if entries:
        st.plotly_chart(tree_figure(entries, decode, lang), key="live:tree", config={"displayModeBar": False})
    else:
        st.caption(t("tree_empty", lang))
    hist = snap.history
    c1, c2 = st.columns(2)
    with c1:
        st.markdown(f"**{t('rates', lang)}**")
        fig = go.Figure()
        xs = pd.to_datetime([h["t"] for h in hist], unit="s")
        fig.add_scatter(x=xs, y=[h["stored"] for h in hist], name=t("stored", lang))
        fig.add_scatter(x=xs, y=[-h["removed"] for h in hist], name=t("removed", lang))
        fig.update_layout(height=260, margin=dict(l=0, r=0, t=10, b=0))
        st.plotly_chart(fig, key="live:rates", config={"displayModeBar": False})
    with c2:
        st.markdown(f"**{t('cached', lang)}**")
        fig = go.Figure()
        series = sorted({k for h in hist for k in h["cached"]})
        for name in series:
            fig.add_scatter(x=pd.to_datetime([h["t"] for h in hist], unit="s"),
                            y=[h["cached"].get(name, 0) for h in hist], name=name)
        fig.update_layout(height=260, margin=dict(l=0, r=0, t=10, b=0))
        st.plotly_chart(fig, key="live:cached", config={"displayModeBar": False})
    st.subheader(t("longest", lang))
    rows = longest_prefixes(entries, decode)
    st.dataframe(pd.DataFrame([{t("col_blocks", lang): r["blocks"], t("col_tokens", lang): r["tokens"],
                                t("col_last", lang): r["last"], t("col_text", lang): r["text"]} for r in rows]),
                 hide_index=True, key="live:longest")
    with st.expander(t("log", lang)):
        st.code("\n".join(snap.log[-60:]) or "-", language=None)


def _hit_form(watcher: Optional[KVEventWatcher], lang: str) -> None:
    st.subheader(t("hit_title", lang))
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
        prompt = st.text_area(t("prompt", lang), key="live:prompt", max_chars=MAX_PROMPT_CHARS)
        chat = st.checkbox(t("chat", lang), key="live:chat")
        ids_text = st.text_input(t("token_ids", lang), key="live:ids", max_chars=MAX_PROMPT_TOKENS * 8)
        c1, c2, c3, c4 = st.columns(4)
        block_size = c1.number_input(t("block_size", lang), 1, 1024, int(info.get("block_size") or 16),
                                     key="live:block_size")
        algo = c2.selectbox(t("hash_algo", lang), sorted(HASH_FUNCTIONS), key="live:algo",
                            index=sorted(HASH_FUNCTIONS).index("sha256") if "sha256" in HASH_FUNCTIONS else 0)
        seed = c3.text_input(t("seed", lang), "vllm-none-hash", key="live:seed", max_chars=100)
        salt = c4.text_input(t("salt", lang), "", key="live:salt", max_chars=200)
        go_check = st.form_submit_button(t("check", lang))
    if not go_check:
        return
    ids = None
    if ids_text.strip():
        parts = [p.strip() for p in ids_text.split(",") if p.strip()]
        if len(parts) > MAX_PROMPT_TOKENS or not all(p.isdigit() for p in parts):
            st.error(t("bad_ids", lang, n=MAX_PROMPT_TOKENS))
            return
        ids = [int(p) for p in parts]
    elif prompt.strip():
        ms = st.session_state.get("_model_state")
        model = getattr(ms, "model", None)
        if model is not None:
            ids = model.encode_prompt(prompt, chat)[:MAX_PROMPT_TOKENS]
    if not ids:
        st.error(t("no_tokens", lang))
        return
    entries: dict = {}
    use_int = True
    if watcher is not None:
        entries = watcher.entries(rank, medium, group)
        use_int = not entries or len(next(iter(entries))) == 16
    hits, texts = leading_hits(entries, ids, int(block_size), algo, seed or "vllm-none-hash", salt or None, use_int)
    st.success(t("hit_result", lang, hits=hits, blocks=len(texts), tokens=hits * int(block_size)))
    st.dataframe(pd.DataFrame({"block": list(range(len(texts))), "hash": texts,
                               "cached": [h in entries for h in texts]}), hide_index=True, key="live:hits")
