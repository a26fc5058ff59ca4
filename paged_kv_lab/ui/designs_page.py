"""The topic "Hash chains vs radix tree": vLLM's recorded run in the lesson player and, under it
at the player's step, the same requests through SGLang's radix tree and nano-vllm's block table
(designs/). The Why? panel under them answers on all three designs (words/explain_designs.py).

Token text from the model is shown only in dataframes and in Graphviz labels escaped for DOT
(never as HTML or Markdown).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from paged_kv_lab.designs import design_events as ev
from paged_kv_lab.designs.nanovllm import COMMITS
from paged_kv_lab.designs.side_by_side import DesignStep, SideBySide
from paged_kv_lab.text.i18n import said, tr
from paged_kv_lab.ui.lesson_page import render_lesson
from paged_kv_lab.ui.panels import md_escape
from paged_kv_lab.why.explain import RecordedSteps
from paged_kv_lab.why.explain_designs import DesignRun

LESSON_ID = "designs"
NANO_COMMITS = tuple(COMMITS)  # the first is nano-vllm's main today, the default


def render_designs_page() -> None:
    """The lesson; its stage (ui/view.py) draws ``show_designs`` under the player, at its step."""
    render_lesson(LESSON_ID)


def show_designs(run, lang: str, decode, key: str = LESSON_ID) -> DesignRun | None:
    """SGLang's tree, nano-vllm's table and their decisions at the player's step (``run.cursor``):
    drawn in the lesson's fragment, so they follow the player as its other panels do. Returns the
    designs' steps shown so far, for the Why? panel."""
    if run.error or run.scenario is None:
        return None
    st.divider()
    st.subheader(tr("designs.side_title", lang))
    st.markdown(tr("designs.side_intro", lang))
    eng = run.scenario.engine
    page_size = st.radio(
        tr("designs.page_size", lang),
        tuple(dict.fromkeys((1, eng.block_size))),
        horizontal=True,
        key=f"{key}:page_size",
    )
    nano_commit = st.radio(
        tr("designs.nano_commit", lang),
        NANO_COMMITS,
        format_func=lambda c: tr(f"designs.nano_commit.{c}", lang),
        horizontal=True,
        key=f"{key}:nano_commit",
    )
    try:
        side = _side(run, eng.num_gpu_blocks, eng.block_size, page_size, nano_commit)
    except ValueError as e:  # settings from a scenario file the designs cannot take
        st.warning(tr("designs.cannot_follow", lang, error=md_escape(said(e, lang))))
        return None
    step = min(run.cursor, len(side.steps))
    snap = run.initial if step == 0 else run.records[step - 1].snapshot
    here = side.at(step)
    col_v, col_s, col_n = st.columns(3)
    with col_v:
        st.markdown(f"**{tr('designs.vllm', lang)}**")
        st.dataframe(_vllm_table(snap, decode, lang), hide_index=True)
        st.caption(tr("designs.free_queue", lang, queue=" → ".join(map(str, snap.free_queue))))
    with col_s:
        st.markdown(f"**{tr('designs.sglang', lang, page_size=page_size)}**")
        st.graphviz_chart(_tree_dot(here, decode))
        st.caption(
            tr(
                "designs.tree_sizes",
                lang,
                evictable=here.tree.evictable_size,
                protected=here.tree.protected_size,
                free=here.tree.free_slots,
            )
        )
    with col_n:
        st.markdown(f"**{tr('designs.nano', lang, commit=side.nano_commit)}**")
        st.dataframe(_nano_table(here, decode, lang), hide_index=True)
        st.caption(tr("designs.nano_sizes", lang, hashes=here.nano.num_hashes))
    st.markdown(f"**{tr('designs.this_step', lang, step=step, commit=side.nano_commit)}**")
    lines = [event_sentence(e, lang, side.nano_commit) for e in here.events]
    st.dataframe(
        pd.DataFrame({tr("designs.decision", lang): lines or ["—"]}),
        hide_index=True,
        key=f"{key}:decisions",
    )
    rows = hit_rows(snap, here, lang)
    if rows:
        st.markdown(f"**{tr('designs.hits_title', lang)}**")
        st.dataframe(pd.DataFrame(rows), hide_index=True, key=f"{key}:hits")
    for note in differences(snap, here, side, step, eng.block_size, page_size, lang):
        st.info(note)  # request ids in it are Markdown-escaped (a scenario file names them)
    if here.errors:
        st.warning("\n\n".join(md_escape(e) for e in here.errors))
    steps = RecordedSteps(run.initial, tuple(run.records[:step]), eng, decode)
    return DesignRun(tuple(side.steps[:step]), steps, page_size, side.nano_commit)


def _side(
    run, num_gpu_blocks: int, block_size: int, page_size: int, nano_commit: str
) -> SideBySide:
    """Both designs followed over the steps recorded so far, kept per run, page size and
    nano-vllm commit and advanced as the run grows (a design's step depends only on the steps
    before it)."""
    shape = (num_gpu_blocks, block_size, page_size, nano_commit)
    cache = st.session_state.get("designs:side")
    if cache is None or cache[0] is not run.run or cache[1] != shape:
        side = SideBySide(num_gpu_blocks, block_size, page_size, nano_commit)
        cache = st.session_state["designs:side"] = (run.run, shape, side)
    side = cache[2]
    for rec in run.records[len(side.steps) :]:
        side.advance(rec.snapshot)
    return side


def _text(decode, ids) -> str:
    return decode(list(ids)).replace("\n", "⏎") if ids else ""


def _vllm_table(snap, decode, lang: str) -> pd.DataFrame:
    rows = [
        {
            tr("designs.col_block", lang): b.block_id,
            "ref_cnt": b.ref_cnt,
            tr("designs.col_hash", lang): (b.block_hash or "")[:8],
            tr("designs.col_tokens", lang): _text(decode, b.token_ids),
            tr("designs.col_queue", lang): b.queue_pos,
        }
        for b in snap.blocks
        if not b.is_null
    ]
    return pd.DataFrame(rows)


def _nano_table(here: DesignStep, decode, lang: str) -> pd.DataFrame:
    rows = [
        {
            tr("designs.col_block", lang): b.block_id,
            "ref_count": b.ref_count,
            tr("designs.col_hash", lang): "" if b.hash == -1 else f"{b.hash:016x}"[:8],
            tr("designs.col_tokens", lang): _text(decode, b.token_ids),
            tr("designs.col_queue", lang): b.free_pos,
        }
        for b in here.nano.blocks
    ]
    return pd.DataFrame(rows)


def dot_escape(text: str) -> str:
    """A string safe inside a double-quoted DOT label (no HTML label is ever used)."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "⏎")
    return "".join(c if c.isprintable() else "·" for c in out)


def _tree_dot(here: DesignStep, decode) -> str:
    changed = {
        getattr(e, "node_id", None) for e in here.events if not isinstance(e, ev.LockChanged)
    }
    lines = ["digraph tree {", "rankdir=LR;", 'node [shape=box, fontsize=10, fontname="sans"];']
    for n in here.tree.nodes:
        if n.parent_id is None:
            lines.append(f'n{n.node_id} [label="root", shape=circle];')
            continue
        text = _text(decode, n.token_ids)
        short = text if len(text) <= 24 else text[:22] + "…"
        head = f"#{n.node_id} · {len(n.token_ids)} tok · lock {n.lock_ref}"
        label = dot_escape(head) + "\\n" + dot_escape(short)
        style = ', style=filled, fillcolor="#ffe9a8"' if n.node_id in changed else ""
        if n.lock_ref:
            style += ', color="#1f77b4", penwidth=2'
        lines.append(f'n{n.node_id} [label="{label}"{style}];')
        lines.append(f"n{n.parent_id} -> n{n.node_id};")
    lines.append("}")
    return "\n".join(lines)


def event_sentence(e: ev.DesignEvent, lang: str, nano_commit: str) -> str:
    """One decision in words (any catalogue language), every field from the event; nano-vllm's
    name the commit that made them."""
    fields = {k: v for k, v in e.to_dict().items() if k not in ("kind", "design")}
    fields["commit"] = nano_commit
    if isinstance(e, ev.LockChanged):
        fields["what"] = tr("designs.lock", lang) if e.locked else tr("designs.unlock", lang)
    if isinstance(e, ev.BlockMiss):
        fields["reason"] = tr(f"designs.miss_{e.reason}", lang)
    if isinstance(e, ev.BlockHit) and e.wrong_prefix:
        return tr("designs.ev_block_hit_wrong", lang, **fields)
    return tr(f"designs.ev_{e.kind}", lang, **fields)


def hit_rows(snap, here: DesignStep, lang: str) -> list[dict]:
    rows = []
    for r in snap.requests:
        if r.request_id not in here.sglang_hits and r.request_id not in here.nano_hits:
            continue
        rows.append(
            {
                tr("designs.col_request", lang): r.request_id,
                tr("designs.col_prompt", lang): r.num_prompt_tokens,
                "vLLM": r.num_cached_tokens,
                "SGLang": here.sglang_hits.get(r.request_id, "—"),
                "nano-vllm": here.nano_hits.get(r.request_id, "—"),
            }
        )
    return rows


def differences(
    snap, here: DesignStep, side: SideBySide, step: int, block_size: int, page_size: int, lang
) -> list[str]:
    """The differences between the designs that this step shows, named where they happen."""
    notes = []
    prompts = {r.request_id: r for r in snap.requests}
    esc = {rid: md_escape(rid) for rid in prompts}
    for e in here.events:
        r = prompts.get(e.request_id or "")
        if isinstance(e, ev.PrefixMatched) and r is not None:
            v, s = r.num_cached_tokens, e.prefix_len
            n = here.nano_hits.get(r.request_id)
            if s > v:
                notes.append(
                    tr(
                        "designs.diff_granularity",
                        lang,
                        req=esc[r.request_id],
                        s=s,
                        v=v,
                        bs=block_size,
                    )
                )
            last = -(-r.num_prompt_tokens // block_size) - 1
            last_hit = any(
                isinstance(x, ev.BlockHit) and x.request_id == r.request_id and x.index == last
                for x in here.events
            )
            if n is not None and last_hit:  # 2f352ae only: bb823b3 never looks the last one up
                notes.append(tr("designs.diff_last_block", lang, req=esc[r.request_id], n=n, v=v))
            elif n is not None and n != v:
                notes.append(
                    tr(
                        "designs.diff_nano_hits",
                        lang,
                        req=esc[r.request_id],
                        commit=side.nano_commit,
                        n=n,
                        v=v,
                    )
                )
            notes.append(
                tr(
                    "designs.diff_lookup",
                    lang,
                    req=esc[r.request_id],
                    nodes=e.nodes_visited,
                    blocks=r.num_prompt_tokens // block_size,
                )
            )
            notes.append(tr("designs.diff_lookup_nanovllm", lang))
    sg_evicted = [e for e in here.events if isinstance(e, ev.LeafEvicted)]
    nano_evicted = [e for e in here.events if isinstance(e, ev.BlockMiss) and e.evicted_hash]
    if sg_evicted or nano_evicted:
        notes.append(
            tr(
                "designs.diff_eviction",
                lang,
                commit=side.nano_commit,
                sg=", ".join(f"#{e.node_id} ({e.num_tokens})" for e in sg_evicted) or "—",
                nano=", ".join(str(e.block_id) for e in nano_evicted) or "—",
            )
        )
    if any(isinstance(e, ev.NodeInserted) for e in here.events) and page_size < block_size:
        notes.append(tr("designs.diff_partial", lang, bs=block_size))
    return notes


def design_curves(trace, settings, values, lang: str) -> list[tuple[str, list[tuple[int, float]]]]:
    """For the workloads page's sweep chart: SGLang's and nano-vllm's hit rate at the same pool
    sizes (the same KV memory in tokens) as (name, [(num_gpu_blocks, hit rate)]) per design, when
    the toggle asks for them (else none); kept per trace, settings and sizes."""
    if not values or not st.toggle(tr("designs.curves", lang), key="designs:curves"):
        return []
    if settings.arrival != "sequential":
        st.caption(tr("designs.curves_sequential", lang))
        return []
    from paged_kv_lab.designs.three_designs import NAMES, sweep_compare
    from paged_kv_lab.workloads.replay import replay_settings

    key = (trace.name, len(trace), repr(settings), tuple(values))
    cache = st.session_state.get("designs:curves_data")
    if cache is None or cache[0] != key:
        overrides = {
            "block_size": settings.block_size,
            "max_num_seqs": settings.max_num_seqs,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
        }
        with st.spinner(tr("designs.curves_running", lang)):
            rows = sweep_compare(
                trace,
                lambda v: replay_settings(trace, {**overrides, "num_gpu_blocks": v}),
                values,
                ("sglang", "nano"),
            )
        cache = st.session_state["designs:curves_data"] = (key, rows)
    return [
        (NAMES[d], [(r["num_gpu_blocks"], r[d]) for r in cache[1] if r[d] is not None])
        for d in ("sglang", "nano")
    ]
