"""Under the player, for a lesson on a P/D pair: each request's time to first token split into
its parts (disagg/pd.py: ttft_split), up to the player's cursor. Text only, read from the
recorded steps."""

from __future__ import annotations

from typing import Any

import streamlit as st

from paged_kv_lab.app.panels import md_escape
from paged_kv_lab.disagg.pd import ttft_split
from paged_kv_lab.text.i18n import tr

COLUMNS = ("request", "prefill", "transfer", "waiting", "first_decode", "total")


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
