"""Under the player, for a run with a CPU tier: each request's prompt split by tier (GPU hit, CPU
hit, computed) and its time to first token, up to the player's cursor. The two pools themselves
are drawn by the player (player/assets/panels.js: drawCpuPool). Everything is read from the
recorded run (its events and StepRecord.seconds); it is text, no per-step picture."""

from __future__ import annotations

from typing import Any

import streamlit as st

from paged_kv_lab.content.tiers import TierRow, tier_rows
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.panels import md_escape

COLUMNS = ("request", "case", "prompt", "gpu", "cpu", "computed", "steps", "ms")


def tier_table_md(rows: list[TierRow], lang: str) -> str:
    """The rows as a Markdown table (request ids escaped: they are the scenario's text)."""
    head = [tr(f"tier.col_{c}", lang) for c in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ms = "—" if r.ttft_ms is None else f"{r.ttft_ms:.1f}"
        cells = (
            md_escape(r.request_id),
            tr(f"tier.case_{r.case}", lang),
            r.num_prompt_tokens,
            r.gpu_hit_tokens,
            r.cpu_hit_tokens,
            r.computed_tokens,
            r.ttft_steps,
            ms,
        )
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def show_cpu_tier(run: Any, lang: str, device: str = "") -> None:
    """The hit by tier and the time to first token, for the requests that have it so far."""
    if run.scenario is None or run.scenario.engine.cpu_offload is None:
        st.caption(tr("tier.off", lang))
        return
    st.markdown(f"**{tr('tier.table', lang)}**")
    st.caption(tr("tier.table_caption", lang, device=device or "?"))
    rows = tier_rows(run.shown_records())
    if not rows:
        st.caption(tr("tier.no_rows", lang))
        return
    st.markdown(tier_table_md(rows, lang))
    by_case: dict[str, list[float]] = {}
    for r in rows:
        if r.ttft_ms is not None:
            by_case.setdefault(r.case, []).append(r.ttft_ms)
    if by_case:
        cases = ", ".join(
            f"{tr(f'tier.case_{c}', lang)} {sum(v) / len(v):.1f} ms"
            for c, v in sorted(by_case.items())
        )
        st.caption(tr("tier.by_case", lang, cases=cases))
