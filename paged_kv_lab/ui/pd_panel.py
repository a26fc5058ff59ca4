"""Under the player, for a lesson on a P/D pair: both replicas' pools side by side at the
player's step (disagg/pd.py: pair_at), the step's pulls marked on both sides, and each request's
time to first token split into its parts (disagg/pd.py: ttft_split), up to the player's cursor.
Text only (Markdown tables: the per-step pictures are the browser player's, and this part of the
page reruns on every cursor report), read from the recorded steps; request ids go through
md_escape, and a pool's cells hold only block ids and marks."""

from __future__ import annotations

from typing import Any

import streamlit as st

from paged_kv_lab.disagg.pd import REPLICAS, pair_at, ttft_split
from paged_kv_lab.text.i18n import Text, tr
from paged_kv_lab.ui.panels import md_escape

COLUMNS = ("request", "prefill", "transfer", "waiting", "first_decode", "total")
POOL_COLS = 6  # two pools side by side: a block's cell holds its id and a mark
# the mark after a block's id, by its part (disagg/pd.py: BLOCK_PARTS; the pull's marks are
# followed by the other side's block id); a free block without a hash has none
PART_MARKS = {
    "pull_from": "→",
    "pull_into": "←",
    "failed": "✗",
    "kept": "⏸",
    "delayed": "∅",
    "used": "●",
    "cached": "○",
}


def cell_text(b) -> str:
    """A block's cell: its id, then its part's mark and, in the step's pull, the paired id."""
    mark = PART_MARKS.get(b.part)
    if mark is None:
        return str(b.block_id)
    return f"{b.block_id} {mark}" + ("" if b.paired is None else f" {b.paired}")


def pool_table(cells: list[str]) -> str:
    """A pool as a Markdown table of POOL_COLS columns (its header row left blank)."""
    lines = ["|" + " |" * POOL_COLS, "|" + "---|" * POOL_COLS]
    for i in range(0, len(cells), POOL_COLS):
        row = cells[i : i + POOL_COLS]
        lines.append("| " + " | ".join(row + [" "] * (POOL_COLS - len(row))) + " |")
    return "\n".join(lines)


def show_pools(run: Any, lang: str) -> None:
    """The two pools at the player's step, labelled with their replica and the step they show."""
    shown = run.shown_records()
    step = shown[-1].step if shown else 0
    view = pair_at(run.initial, shown, step)
    st.markdown(f"**{tr('pd.pools.title', lang, step=step)}**")
    if view.replica is None:
        st.caption(tr("pd.pools.start", lang))
    else:
        replica = Text(f"pd.replica.{view.replica}")
        st.caption(tr("pd.pools.stepped", lang, step=step, replica=replica))
    for rid, (remote, local) in view.pulls.items():
        fields = {"step": step, "req": md_escape(rid), "remote": list(remote), "local": list(local)}
        st.markdown(tr("pd.pools.pull", lang, **fields))
    for rid, ids in view.failed.items():
        st.markdown(tr("pd.pools.failed", lang, step=step, req=md_escape(rid), blocks=list(ids)))
    for name, col in zip(REPLICAS, st.columns(2)):
        with col, st.container(key=f"pd-pool-{name}"):
            label = "pd.pools.pool_now" if view.replica == name else "pd.pools.pool"
            replica = Text(f"pd.replica.{name}")
            st.markdown(tr(label, lang, replica=replica, step=view.as_of[name]))
            st.markdown(pool_table([cell_text(b) for b in view.blocks[name]]))
    st.caption(tr("pd.pools.legend", lang))


def show_ttft_split(run: Any, lang: str, device: str = "") -> None:
    st.markdown(f"**{tr('pd.ttft.title', lang)}**")
    st.caption(tr("pd.ttft.caption", lang, device=device or "?"))
    rows = ttft_split(run.shown_records())
    if not rows:
        st.caption(tr("pd.ttft.none", lang))
        return
    head = [tr(f"pd.ttft.col_{c}", lang) for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        parts = (r.prefill_ms, r.transfer_ms, r.waiting_ms, r.first_decode_ms, r.total_ms)
        lines.append(
            "| " + " | ".join([md_escape(r.request_id), *(f"{v:.1f}" for v in parts)]) + " |"
        )
    st.markdown("\n".join(lines))
