"""PagedAttention addressing: token position -> logical block, offset -> physical block -> slot."""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from kvcore.trace import Snapshot

from .common import NULL_COLOR, Decode, base_layout, colors_for, group_label, all_tokens, safe_decode


@dataclass(frozen=True)
class Address:
    group: int
    group_label: str
    position: int
    logical_block: int
    offset: int
    physical_block: int | None     # None: the table does not reach that far yet
    slot: int | None               # physical_block * block_size + offset
    is_null: bool                  # the slot points at the null block (left the sliding window)
    computed: bool                 # K/V for this position has been written
    token_id: int | None
    token_text: str


def address_of(snap: Snapshot, request_id: str, position: int, decode: Decode | None = None) -> list[Address]:
    r = snap.request(request_id)
    bs = snap.block_size
    nulls = {b.block_id for b in snap.blocks if b.is_null}
    toks = all_tokens(r)
    tok = toks[position] if 0 <= position < len(toks) else None
    out = []
    for g, table in enumerate(r.block_tables or ((),)):
        lb, off = divmod(position, bs)
        pb = table[lb] if lb < len(table) else None
        out.append(Address(
            group=g, group_label=group_label(snap, g), position=position, logical_block=lb, offset=off,
            physical_block=pb, slot=None if pb is None else pb * bs + off, is_null=pb in nulls,
            computed=position < r.num_computed_tokens, token_id=tok,
            token_text=safe_decode(decode, [tok]) if tok is not None else ""))
    return out


def address_figure(snap: Snapshot, request_id: str, position: int, *, colors: dict[str, str] | None = None,
                   lang: str = "en", group: int = 0) -> go.Figure:
    """Two rows: the request's logical blocks on top, the physical pool below, arrows between."""
    colors = colors_for(snap, colors)
    r = snap.request(request_id)
    table = r.block_tables[group] if group < len(r.block_tables) else ()
    bs = snap.block_size
    nulls = {b.block_id for b in snap.blocks if b.is_null}
    n = len(snap.blocks)
    lb = position // bs
    color = colors.get(request_id, "#1f77b4")
    fig = go.Figure()
    span = max(n, len(table), 1)
    lx = [i * (span / max(len(table), 1)) for i in range(len(table))]
    for i, pb in enumerate(table):
        px = pb
        chosen = i == lb
        fig.add_annotation(x=px, y=0.18, ax=lx[i], ay=0.82, xref="x", yref="y", axref="x", ayref="y",
                           showarrow=True, arrowhead=3, arrowwidth=4 if chosen else 1,
                           arrowcolor="#e00000" if chosen else "#aaa", text="")
    top_lbl = "logical" if lang != "zh" else "逻辑块"
    bot_lbl = "physical" if lang != "zh" else "物理块"
    fig.add_trace(go.Scatter(
        x=lx, y=[1] * len(table), mode="markers+text", text=[f"L{i}" for i in range(len(table))],
        marker=dict(symbol="square", size=30, color=[NULL_COLOR if pb in nulls else color for pb in table],
                    line=dict(color=["#e00000" if i == lb else "#fff" for i in range(len(table))], width=3)),
        textfont=dict(color="white"), name=top_lbl,
        hovertext=[f"{top_lbl} {i} → {bot_lbl} {pb}" for i, pb in enumerate(table)], hoverinfo="text"))
    held = set(table)
    fig.add_trace(go.Scatter(
        x=list(range(n)), y=[0] * n, mode="markers+text", text=[str(i) for i in range(n)],
        marker=dict(symbol="square", size=22,
                    color=[NULL_COLOR if i in nulls else (color if i in held else "#e6e6e6") for i in range(n)],
                    line=dict(color=["#e00000" if lb < len(table) and i == table[lb] else "#fff"
                                     for i in range(n)], width=3)),
        textfont=dict(size=10), name=bot_lbl, hoverinfo="skip"))
    fig.update_xaxes(visible=False, range=[-1, span])
    fig.update_yaxes(visible=False, range=[-0.4, 1.4])
    return base_layout(fig, height=170, legend=False)
