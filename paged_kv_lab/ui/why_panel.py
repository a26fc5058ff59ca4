"""The "Why?" panel below the player: a request's cache hit explained, a block's life as a
timeline, two requests' chains aligned, and the code that ran in the current step; beside the
other designs (lesson "Hash chains vs radix tree"), the same questions on SGLang's tree and
nano-vllm's table (paged_kv_lab.why.explain_designs).

Everything comes from why.explain* over the steps shown so far (the player's cursor), so
the panel never tells what has not happened yet. Text from tokens and prompts goes through
``md_escape`` or into dataframes (shown as text), never as HTML.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

import streamlit as st

from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.panels import md_escape
from paged_kv_lab.why.explain import ExplainError, RecordedSteps, explain_hit
from paged_kv_lab.why.explain_blocks import compare_requests, life_of_block
from paged_kv_lab.why.explain_designs import (
    DesignError,
    DesignRun,
    evicted_leaves,
    explain_leaf,
    explain_nano_hit,
    explain_sglang_hit,
    leaf_sentences,
    nano_sentences,
    sglang_hit_sentences,
)
from paged_kv_lab.why.explain_text import (
    comparison_sentences,
    hit_sentences,
    life_sentences,
    step_calls,
)
from paged_kv_lab.why.sentences import short_hash
from paged_kv_lab.why.source_links import VLLM_TAG


def recorded_steps(run: Any, decode: Optional[Callable] = None) -> RecordedSteps:
    """The steps ``run`` (a Timeline or a RecordedRun) has shown so far, as why.explain reads
    them."""
    records = run.shown_records() if hasattr(run, "shown_records") else run.records
    scenario = run.scenario
    if (
        scenario is None
        and getattr(run, "trace", None) is not None
        and run.trace.scenario is not None
    ):
        scenario = load_scenario(run.trace.scenario)
    return RecordedSteps(
        run.initial, tuple(records), scenario.engine if scenario is not None else None, decode
    )


def _lines(lines: list[str]) -> None:
    for line in lines:
        st.markdown(md_escape(line))


def why_panel(
    run: Any,
    lang: str,
    key: str,
    decode: Optional[Callable] = None,
    designs: Optional[DesignRun] = None,
) -> None:
    """The panel; ``key`` keeps its widgets apart from another page's (a lesson id, "trace").
    Nothing is computed until the learner opens it (the toggle): the player reruns this part
    of the page whenever its cursor moves. ``designs``: SGLang's and nano-vllm's steps beside
    the run (the lesson "Hash chains vs radix tree"), asked about in two more questions."""
    if not st.toggle(tr("why.title", lang), key=f"why_open:{key}"):
        return
    with st.container(border=True):
        steps = recorded_steps(run, decode)
        if not steps.records:
            st.caption(tr("why.not_yet", lang))
            return
        modes = ("request", "block", "two", "order", "calls")
        if any(r.replica for r in steps.records):  # a P/D pair: either replica's blocks
            modes = ("pd", *modes)
        if designs is not None:
            modes += ("sglang", "nano")
        mode = st.radio(
            tr("why.mode", lang),
            modes,
            format_func=lambda m: tr(f"why.{m}", lang),
            horizontal=True,
            key=f"why_mode:{key}",
        )
        requests = list(steps.request_views())
        try:
            if mode == "pd":
                _pd_answer(steps, requests, lang, key)
            elif mode in ("sglang", "nano"):
                _design_answer(designs, mode, requests, lang, key)
            elif mode == "request":
                rid = st.selectbox(tr("why.pick_request", lang), requests, key=f"why_req:{key}")
                for x in explain_hit(steps, rid):
                    _lines(hit_sentences(x, lang)[:-1])
                _code("get_computed_blocks", lang, key)
            elif mode == "block":
                n = len(steps.records[-1].snapshot.blocks)
                bid = st.selectbox(
                    tr("why.pick_block", lang), list(range(1, n)), key=f"why_block:{key}"
                )
                life = life_of_block(steps, bid)
                _lines(life_sentences(life, lang))
                if life.moments:
                    st.dataframe(
                        block_table(life, lang), hide_index=True, key=f"why_block_table:{key}"
                    )
            elif mode == "order":
                _order_answer(steps, requests, lang, key)
            elif mode == "two":
                c1, c2 = st.columns(2)
                a = c1.selectbox(tr("why.pick_request", lang), requests, key=f"why_a:{key}")
                b = c2.selectbox(
                    tr("why.pick_other", lang),
                    [r for r in requests if r != a] or requests,
                    key=f"why_b:{key}",
                )
                c = compare_requests(steps, a, b)
                _lines(comparison_sentences(c, lang))
                st.dataframe(chain_table(c, lang), hide_index=True, key=f"why_chain_table:{key}")
            else:
                step = len(steps.records)
                # the column is named after the tag its permalinks point into
                vllm_col = "vLLM " + VLLM_TAG.removeprefix("v")
                rows = [
                    {
                        "": "  " * k.depth + k.link.name,
                        vllm_col: k.link.vllm.url,
                        "kvcore": k.link.ours.target,
                    }
                    for k in step_calls(steps, step)
                ]
                link = st.column_config.LinkColumn(display_text=re.escape(VLLM_TAG) + "/(.*)$")
                st.dataframe(
                    rows,
                    hide_index=True,
                    key=f"why_calls:{key}",
                    column_config={vllm_col: link},
                )
                names = list(dict.fromkeys(k.link.name for k in step_calls(steps, step)))
                name = st.selectbox(tr("why.source_of", lang), names, key=f"why_src:{key}")
                if name is not None:
                    _code(name, lang, key)
        except (ExplainError, DesignError) as e:
            st.info(tr(e.text, lang))


def _design_answer(designs: DesignRun, mode: str, requests: list, lang: str, key: str) -> None:
    """SGLang: a request's match in the tree, or why a leaf was evicted; nano-vllm: a request's
    blocks, hit or missed and why. Each with vLLM's answer for the same admission."""
    if mode == "sglang":
        leaves = evicted_leaves(designs)
        ask = st.radio(
            tr("why.mode", lang),
            ("hit", "leaf") if leaves else ("hit",),
            format_func=lambda a: tr(f"why.sg_{a}", lang),
            horizontal=True,
            key=f"why_sg:{key}",
            label_visibility="collapsed",
        )
        if ask == "leaf":
            step, node = st.selectbox(
                tr("why.pick_leaf", lang),
                leaves,
                format_func=lambda sn: tr("why.leaf_label", lang, node=sn[1], step=sn[0]),
                key=f"why_leaf:{key}",
            )
            _lines(leaf_sentences(explain_leaf(designs, node), lang))
            return
    rid = st.selectbox(tr("why.pick_request", lang), requests, key=f"why_req:{key}")
    if mode == "sglang":
        for x in explain_sglang_hit(designs, rid):
            _lines(sglang_hit_sentences(x, designs, lang))
    else:
        for x in explain_nano_hit(designs, rid):
            _lines(nano_sentences(x, lang))


def _pd_answer(steps: RecordedSteps, requests: list, lang: str, key: str) -> None:
    """A P/D pair: a block or a request of either replica, with the vLLM code behind the answer."""
    from paged_kv_lab.disagg.pd import REPLICAS
    from paged_kv_lab.why.explain_pd import explain_pd_block, explain_pd_request

    c1, c2 = st.columns(2)
    replica = c1.radio(
        tr("why.pd.pick_replica", lang),
        REPLICAS,
        format_func=lambda r: tr(f"pd.replica.{r}", lang),
        horizontal=True,
        key=f"why_pd_replica:{key}",
    )
    ask = c2.radio(
        tr("why.mode", lang),
        ("block", "request"),
        format_func=lambda a: tr(f"why.pd.ask_{a}", lang),
        horizontal=True,
        key=f"why_pd_ask:{key}",
        label_visibility="collapsed",
    )
    if ask == "block":
        n = len(steps.records[-1].snapshot.blocks)
        bid = st.selectbox(tr("why.pick_block", lang), list(range(1, n)), key=f"why_pd_block:{key}")
        answer = explain_pd_block(steps, replica, bid)
    else:
        rid = st.selectbox(tr("why.pick_request", lang), requests, key=f"why_pd_req:{key}")
        answer = explain_pd_request(steps, replica, rid)
    _lines([tr(text, lang) for text in answer.texts])
    for name in answer.sources:
        _code(name, lang, key)


def _order_answer(steps, requests: list, lang: str, key: str) -> None:
    """ "Why was B admitted before A?": the window, the threshold and the usage at that step
    (why/explain_admission.py), and where vLLM 0.34.0 decides it."""
    from paged_kv_lab.why.explain_admission import (
        admissions,
        explain_order,
        order_sentences,
        source_lines,
    )

    by_step = [a.request_id for a in sorted(admissions(steps), key=lambda a: a.step or 1 << 30)]
    c1, c2 = st.columns(2)
    b = c1.selectbox(tr("why.pick_second", lang), by_step or requests, key=f"why_ob:{key}")
    rest = [r for r in requests if r != b] or requests
    a = c2.selectbox(tr("why.pick_first", lang), rest, key=f"why_oa:{key}")
    _lines(order_sentences(explain_order(steps, a, b), lang))
    st.caption(" · ".join(md_escape(line) for line in source_lines(lang)))


def _code(name: str, lang: str, key: str) -> None:
    from paged_kv_lab.why.source_links import FUNCTIONS

    link = FUNCTIONS[name]
    st.markdown(f"[{tr('why.vllm_code', lang, f=link.vllm.qualname)}]({link.vllm.url})")
    with st.expander(tr("why.our_code", lang, f=link.ours.target)):
        st.code(link.ours.source(), language="python")


BLOCK_COLUMNS = (
    "step",
    "event",
    "request",
    "logical_block",
    "ref_cnt",
    "hash",
    "lost_hash",
    "queue",
    "reason",
    "prefix",
)


def block_table(life, lang: str) -> list[dict]:
    """The block's timeline, one row per event (the same facts as its sentences)."""
    col = {c: tr(f"why.col.{c}", lang) for c in BLOCK_COLUMNS}
    return [
        {
            col["step"]: m.step,
            col["event"]: m.kind,
            col["request"]: m.request_id or "",
            col["logical_block"]: m.logical_index,
            col["ref_cnt"]: m.ref_cnt,
            col["hash"]: short_hash(m.block_hash),
            col["lost_hash"]: short_hash(m.lost_hash),
            col["queue"]: m.joined or ("" if m.queue_pos is None else str(m.queue_pos)),
            col["reason"]: m.reason,
            col["prefix"]: m.prefix_text or "",
        }
        for m in life.moments
    ]


def chain_table(c, lang: str) -> list[dict]:
    """The two chains aligned block by block."""
    return [
        {
            tr("why.col.block", lang): r.index,
            tr("why.col.hash_of", lang, r=c.a): short_hash(r.hash_a),
            tr("why.col.hash_of", lang, r=c.b): short_hash(r.hash_b),
            tr("why.col.same", lang): r.same,
            tr("why.col.tokens_of", lang, r=c.a): str(list(r.tokens_a)),
            tr("why.col.tokens_of", lang, r=c.b): str(list(r.tokens_b)),
            tr("why.col.shared", lang): ", ".join(
                tr("why.col.shared_span", lang, b=s.block_id, f=s.first_step, l=s.last_step)
                for s in r.shared
            ),
        }
        for r in c.rows
    ]
