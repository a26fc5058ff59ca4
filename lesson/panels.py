"""The pictures and tables every lesson (and the trace viewer) shows, drawn from the current Snapshot."""
from __future__ import annotations

import re

import pandas as pd
import streamlit as st

from kvcore.snapshot import Snapshot

from . import figures as F
from .catalog import Lesson, moment_matches, narration_for_step
from .events import changed_blocks, reason, step_sentences
from .i18n import pick, tr
from .memory import DTYPES, blocks_in_budget, bytes_per_block, dims_from_config, formula, human_bytes
from .myths import myth_sections
from .runtime import Timeline

PLOTLY_CONFIG = {"displayModeBar": False, "scrollZoom": False}
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|>~<$])")


def md_escape(s: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", s).replace("\n", "⏎ ")


def chart(fig, key: str) -> None:
    st.plotly_chart(fig, key=key, config=PLOTLY_CONFIG, width="stretch")


def fmt_fields(snap: Snapshot, run: Timeline) -> dict:
    eng = run.scenario.engine
    return {"block_size": snap.block_size, "num_gpu_blocks": snap.num_gpu_blocks,
            "sliding_window": eng.sliding_window, "max_num_batched_tokens": eng.max_num_batched_tokens,
            "max_num_seqs": eng.max_num_seqs, "step": snap.step}


class _Safe(dict):
    def __missing__(self, key):
        return "{" + key + "}"


def narration(lesson: Lesson, run: Timeline, lang: str) -> list[str]:
    """Narration for the shown step: intro at step 0, moments that first happen now, outro at the end."""
    snap, rec = run.snapshot, run.record
    base = fmt_fields(snap, run)
    texts = []
    if rec is None:
        texts.append(pick(lesson.intro, lang).format_map(_Safe(base)))
        return texts
    for m in narration_for_step(lesson, run.shown_records(), rec.step):
        e = next(e for e in rec.events if moment_matches(m, e, rec))
        fields = {**base, **{k: v for k, v in e.data.items() if not isinstance(v, dict)},
                  "req": e.request_id or "", "blocks": "[" + ", ".join(map(str, e.block_ids)) + "]"}
        if "slots" in fields:
            fields["slots"] = "[" + ", ".join(map(str, fields["slots"])) + "]"
        texts.append(pick(m.text, lang).format_map(_Safe(fields)))
    if run.finished and lesson.outro:
        texts.append("🏁 " + pick(lesson.outro, lang).format_map(_Safe(base)))
    return texts


def auto_summary(run: Timeline, lang: str) -> str:
    rec = run.record
    if rec is None:
        return ""
    parts = []
    for e in rec.events:
        if e.kind == "scheduled":
            kind = e.data.get("kind", "")
            parts.append(f"{e.request_id}: {e.data.get('num_tokens')} ({reason(kind, lang)})")
    total = sum(rec.scheduled.values())
    head = f"第 {rec.step} 步：调度 {total} 个 token" if lang == "zh" else f"Step {rec.step}: {total} tokens scheduled"
    return head + (" — " + ", ".join(parts) if parts else "")


def show_narration(lesson: Lesson, run: Timeline, lang: str) -> None:
    texts = narration(lesson, run, lang)
    if texts:
        for t in texts:
            st.info(t, icon="💡")
    else:
        st.caption(auto_summary(run, lang))


def show_events(run: Timeline, lang: str, decode) -> None:
    rec = run.record
    st.markdown(f"**{tr('events', lang)}**")
    if rec is None:
        st.caption(tr("events_none", lang))
        return
    multi = len(rec.snapshot.groups) > 1
    lines = [s for _, s in step_sentences(rec.events, lang, decode, multi)]
    box = st.container(height=360, border=True)
    with box:
        for line in lines:
            st.markdown(md_escape_keep(line))


def md_escape_keep(line: str) -> str:
    """Escape only what breaks markdown in sentences (keeps our `code` and plain words)."""
    for ch in "*_#$~[]":
        line = line.replace(ch, "\\" + ch)
    return line.replace("<", "&lt;")


def show_grid(run: Timeline, lang: str, decode, colors, key: str) -> None:
    snap = run.snapshot
    changed = changed_blocks(run.record.events) if run.record else set()
    st.markdown(f"**{tr('grid', lang)}**")
    chart(F.block_grid(snap, decode=decode, colors=colors, lang=lang, changed=changed), f"grid:{key}")
    st.caption(tr("grid_caption", lang))


def show_queue(run: Timeline, lang: str, decode, key: str) -> None:
    snap = run.snapshot
    st.markdown(f"**{tr('queue', lang)}**")
    chart(F.free_queue(snap, decode=decode, lang=lang), f"queue:{key}")
    st.caption(tr("queue_caption", lang))


def show_metrics_row(run: Timeline, lang: str) -> None:
    snap = run.snapshot
    c = st.columns(5)
    c[0].metric(tr("m_step", lang), snap.step)
    c[1].metric(tr("m_free", lang), snap.num_free_blocks)
    c[2].metric(tr("usage", lang), f"{100 * snap.usage:.0f}%")
    c[3].metric(tr("hit_rate", lang), f"{100 * float(snap.prefix_cache.get('hit_rate', 0.0)):.0f}%")
    c[4].metric(f"{tr('running', lang)} / {tr('waiting', lang)}", f"{len(snap.running)} / {len(snap.waiting)}")


def show_outputs(run: Timeline, lang: str) -> None:
    snap = run.snapshot
    st.markdown(f"**{tr('outputs', lang)}**")
    if not snap.requests:
        st.caption("—")
    for r in snap.requests:
        text = md_escape(r.text) if r.text else "…"
        st.markdown(f"**{r.request_id}** · `{r.status}` · {r.num_output_tokens} tok — {text}")


def requests_frame(snap: Snapshot, lang: str) -> pd.DataFrame:
    cols = tr("req_table_cols", lang)
    rows = [(r.request_id, r.status, r.num_prompt_tokens, r.num_output_tokens, r.num_computed_tokens,
             r.num_cached_tokens, r.num_preemptions, r.priority) for r in snap.requests]
    return pd.DataFrame(rows, columns=list(cols))


def show_tables(run: Timeline, lang: str, decode, colors, key: str) -> None:
    st.markdown(f"**{tr('tables', lang)}**")
    chart(F.block_tables(run.snapshot, decode=decode, colors=colors, lang=lang), f"tables:{key}")


def show_chains_and_metrics(run: Timeline, lang: str, decode, colors, key: str) -> None:
    left, right = st.columns(2)
    with left:
        st.markdown(f"**{tr('chains', lang)}**")
        chart(F.hash_chains(run.snapshot, decode=decode, colors=colors, lang=lang), f"chains:{key}")
        st.caption(tr("chains_caption", lang))
    with right:
        st.markdown(f"**{tr('metrics', lang)}**")
        chart(F.metrics_over_time(run.snapshots(), lang=lang), f"metrics:{key}")


def show_extra_panels(lesson: Lesson, run: Timeline, lang: str, colors, key: str, model) -> None:
    if "budget" in lesson.panels:
        st.markdown(f"**{tr('budget', lang)}**")
        chart(F.token_budget(run.shown_records(), run.scenario.engine.max_num_batched_tokens, colors=colors,
                             lang=lang), f"budget:{key}")
    if "held" in lesson.panels:
        st.markdown(f"**{tr('held', lang)}**")
        chart(F.blocks_held(run.snapshots(), colors=colors, lang=lang), f"held:{key}")
    if "memory" in lesson.panels and model is not None:
        show_memory(run, lang, model, key)


def show_memory(run: Timeline, lang: str, model, key: str) -> None:
    with st.expander(tr("memory", lang), expanded=True):
        dims = dims_from_config(model.config)
        model_dtype = str(getattr(model, "dtype", "float32")).replace("torch.", "")
        c1, c2, c3 = st.columns(3)
        bs = c1.select_slider("block_size", options=[1, 2, 4, 8, 16, 32, 64, 128],
                              value=16, key=f"mem_bs:{key}")
        dtype = c2.selectbox("dtype", DTYPES, index=DTYPES.index(model_dtype) if model_dtype in DTYPES else 0,
                             key=f"mem_dt:{key}")
        gib = c3.slider("GiB" if lang == "en" else "显存预算（GiB）", 0.25, 80.0, 8.0, 0.25, key=f"mem_gb:{key}")
        bpb = bytes_per_block(bs, dims, dtype)
        n = blocks_in_budget(int(gib * 1024 ** 3), bpb)
        st.markdown(
            (f"**{model.name}**: {dims.layers} layers × {dims.kv_heads} KV heads × head size {dims.head_dim}.  \n"
             f"bytes per block = block_size × layers × 2 (K, V) × KV heads × head size × dtype bytes  \n"
             f"= `{formula(bs, dims, dtype)}` ({human_bytes(bpb)})  \n"
             f"{gib:g} GiB → **{n:,} blocks** = {n * bs:,} tokens of KV cache.")
            if lang == "en" else
            (f"**{model.name}**：{dims.layers} 层 × {dims.kv_heads} 个 KV 头 × 头维度 {dims.head_dim}。  \n"
             f"每块字节数 = block_size × 层数 × 2（K、V）× KV 头数 × 头维度 × dtype 字节数  \n"
             f"= `{formula(bs, dims, dtype)}`（{human_bytes(bpb)}）  \n"
             f"{gib:g} GiB → **{n:,} 个块** = {n * bs:,} 个 token 的 KV 缓存。"))
        eng = run.scenario.engine
        pool = bytes_per_block(eng.block_size, dims, model_dtype) * eng.num_gpu_blocks
        st.caption((f"This lesson's pool: {eng.num_gpu_blocks} blocks × {eng.block_size} tokens = {human_bytes(pool)} "
                    f"(the engine allocates exactly this for its paged K/V tensors).") if lang == "en" else
                   (f"本课的块池：{eng.num_gpu_blocks} 块 × {eng.block_size} token = {human_bytes(pool)}"
                    f"（引擎为分页 K/V 张量正好分配这么多）。"))


def show_address(run: Timeline, lang: str, colors, key: str, decode) -> None:
    snap = run.snapshot
    with st.expander(tr("address", lang), expanded=False):
        reqs = [r for r in snap.requests if any(r.block_tables)]
        if not reqs:
            st.caption(tr("address_none", lang))
            return
        c1, c2, c3 = st.columns([1, 2, 1])
        rid = c1.selectbox(tr("address_req", lang), [r.request_id for r in reqs], key=f"addr_req:{key}")
        r = snap.request(rid)
        n = max(1, r.num_prompt_tokens + r.num_output_tokens)
        pos = c2.slider(tr("address_pos", lang), 0, max(n - 1, 1), min(n - 1, r.num_computed_tokens - 1 if
                        r.num_computed_tokens else 0), key=f"addr_pos:{key}")
        groups = len(r.block_tables)
        g = c3.selectbox("KV group", list(range(groups)), key=f"addr_g:{key}") if groups > 1 else 0
        for a in F.address_of(snap, rid, pos, decode):
            phys = "—" if a.physical_block is None else ("∅ (null)" if a.is_null else str(a.physical_block))
            slot = "—" if a.slot is None or a.is_null else str(a.slot)
            gl = f" [{a.group_label}]" if a.group_label else ""
            tok = md_escape(a.token_text) if a.token_text else "?"
            st.markdown(
                f"token {pos} “{tok}”{gl}: logical block = {pos} // {snap.block_size} = **{a.logical_block}**, "
                f"offset = {pos} % {snap.block_size} = **{a.offset}** → physical block **{phys}** → slot "
                f"{phys} × {snap.block_size} + {a.offset} = **{slot}**"
                + ("" if a.computed else (" _(not computed yet)_" if lang == "en" else " _（尚未计算）_")))
        chart(F.address_figure(snap, rid, pos, colors=colors, lang=lang, group=g), f"addr:{key}")


def show_requests(run: Timeline, lang: str) -> None:
    st.markdown(f"**{tr('requests', lang)}**")
    st.dataframe(requests_frame(run.snapshot, lang), hide_index=True, width="stretch")


def show_myths(run: Timeline, lang: str, expanded: bool = False) -> None:
    with st.expander(tr("myths", lang), expanded=expanded):
        for myth, fact, live in myth_sections(run.snapshots(), lang):
            st.markdown(f"❌ {myth}")
            st.markdown(f"✅ {fact}")
            st.success(("Live: " if lang == "en" else "实时：") + live)


def show_questions(lesson: Lesson, lang: str) -> None:
    if not lesson.questions:
        return
    with st.expander(tr("check_yourself", lang), expanded=False):
        for i, q in enumerate(lesson.questions):
            opts = [pick(o, lang) for o in q.options]
            choice = st.radio(pick(q.prompt, lang), opts, index=None, key=f"cq:{lesson.id}:{i}")
            if choice is not None:
                if opts.index(choice) == q.answer:
                    st.success(tr("quiz_right", lang) + " " + pick(q.explain, lang))
                else:
                    st.error(tr("quiz_wrong", lang, answer=opts[q.answer]) + " " + pick(q.explain, lang))
