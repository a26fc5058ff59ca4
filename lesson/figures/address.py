"""PagedAttention addressing: token position -> logical block, offset -> physical block -> slot."""
from __future__ import annotations

from dataclasses import dataclass

from kvcore.snapshot import Snapshot

from .common import NULL_COLOR, Decode, all_tokens, colors_for, group_label, make_figure, safe_decode


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
                   lang: str = "en", group: int = 0):
    """Two rows: the request's logical blocks on top, the physical pool below, arrows between."""
    colors = colors_for(snap, colors)
    r = snap.request(request_id)
    table = r.block_tables[group] if group < len(r.block_tables) else ()
    nulls = {b.block_id for b in snap.blocks if b.is_null}
    n = len(snap.blocks)
    lb = position // snap.block_size
    color = colors.get(request_id, "#1f77b4")
    span = max(n, len(table), 1)
    lx = [i * (span / max(len(table), 1)) for i in range(len(table))]
    arrows = [{"x": pb, "y": 0.18, "ax": lx[i], "ay": 0.82, "xref": "x", "yref": "y", "axref": "x", "ayref": "y",
               "showarrow": True, "arrowhead": 3, "arrowwidth": 4 if i == lb else 1,
               "arrowcolor": "#e00000" if i == lb else "#aaa", "text": ""} for i, pb in enumerate(table)]
    top = "逻辑块" if lang == "zh" else "logical"
    bottom = "物理块" if lang == "zh" else "physical"
    chosen = table[lb] if lb < len(table) else None
    held = set(table)
    data = [
        {"type": "scatter", "x": lx, "y": [1] * len(table), "mode": "markers+text", "name": top,
         "text": [f"L{i}" for i in range(len(table))], "textfont": {"color": "white"},
         "marker": {"symbol": "square", "size": 30, "color": [NULL_COLOR if pb in nulls else color for pb in table],
                    "line": {"color": ["#e00000" if i == lb else "#fff" for i in range(len(table))], "width": 3}},
         "hovertext": [f"{top} {i} → {bottom} {pb}" for i, pb in enumerate(table)], "hoverinfo": "text"},
        {"type": "scatter", "x": list(range(n)), "y": [0] * n, "mode": "markers+text", "name": bottom,
         "text": [str(i) for i in range(n)], "textfont": {"size": 10}, "hoverinfo": "skip",
         "marker": {"symbol": "square", "size": 22,
                    "color": [NULL_COLOR if i in nulls else (color if i in held else "#e6e6e6") for i in range(n)],
                    "line": {"color": ["#e00000" if i == chosen else "#fff" for i in range(n)], "width": 3}}},
    ]
    layout = {"annotations": arrows, "xaxis": {"visible": False, "range": [-1, span]},
              "yaxis": {"visible": False, "range": [-0.4, 1.4]}}
    return make_figure(data, layout, height=170, legend=False)
