"""Shared pieces of the figure builders: colours, hash shortening, text decoding."""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from kvcore.snapshot import BlockView, RequestView, Snapshot

Decode = Callable[[Sequence[int]], str]

# Request colours: distinguishable on a projector, none of them grey/yellow/black,
# which are reserved for free, cached-free and null blocks.
PALETTE = (
    "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e", "#17becf",
    "#e377c2", "#8c564b", "#1b9e77", "#7570b3", "#e7298a", "#66a61e",
)
NULL_COLOR = "#303030"
FREE_COLOR = "#e6e6e6"
CACHED_FREE_COLOR = "#f7e08a"
VICTIM_COLOR = "#e00000"
SHARED_BORDER = "#111111"
FONT = dict(family="Inter, 'Noto Sans CJK SC', 'Microsoft YaHei', sans-serif", size=13)


def short_hash(h: str | None, n: int = 8) -> str:
    return "" if not h else h[:n]


def color_map(request_ids: Iterable[str]) -> dict[str, str]:
    """Stable request -> colour (order of first appearance)."""
    out: dict[str, str] = {}
    for rid in request_ids:
        if rid not in out:
            out[rid] = PALETTE[len(out) % len(PALETTE)]
    return out


def colors_for(snap: Snapshot, colors: dict[str, str] | None) -> dict[str, str]:
    colors = dict(colors or {})
    for r in snap.requests:
        if r.request_id not in colors:
            colors[r.request_id] = PALETTE[len(colors) % len(PALETTE)]
    return colors


def safe_decode(decode: Decode | None, ids: Sequence[int]) -> str:
    if not ids:
        return ""
    if decode is None:
        return " ".join(str(i) for i in ids)
    try:
        return decode(list(ids))
    except Exception:  # a bad id must not break a picture
        return " ".join(str(i) for i in ids)


def html_text(s: str, limit: int = 80) -> str:
    """Text for plotly hover: escaped, newlines visible, bounded length."""
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    s = s.replace("\n", "⏎")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def all_tokens(req: RequestView) -> tuple[int, ...]:
    return tuple(req.prompt_token_ids) + tuple(req.output_token_ids)


def block_tokens(req: RequestView, logical: int, block_size: int) -> tuple[int, ...]:
    """Tokens a request's logical block holds K/V for (only computed tokens)."""
    toks = all_tokens(req)[: req.num_computed_tokens]
    return toks[logical * block_size:(logical + 1) * block_size]


def group_label(snap: Snapshot, g: int) -> str:
    if len(snap.groups) <= 1:
        return ""
    info = snap.groups[g] if g < len(snap.groups) else {}
    kind = info.get("kind", "?")
    w = info.get("sliding_window")
    return f"g{g} {kind}" + (f" W={w}" if w else "")


def block_state(b: BlockView) -> str:
    if b.is_null:
        return "null"
    if b.ref_cnt > 0:
        return "used"
    return "cached" if b.block_hash else "free"


def make_figure(data: list[dict], layout: dict, height: int, title: str | None = None,
                legend: bool = True):
    """A plotly Figure from plain dicts, skipping plotly's per-property validation (the builders'
    output is fixed and tested), which costs tens of milliseconds per figure on every Step.
    Streamlit then serialises it without validating again."""
    import plotly.graph_objects as go
    lay = {
        "height": height, "margin": {"l": 10, "r": 10, "t": 36 if title else 10, "b": 10},
        "font": FONT, "plot_bgcolor": "white", "paper_bgcolor": "white", "showlegend": legend,
        "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0},
        "hoverlabel": {"font": {"family": FONT["family"], "size": 13}},
    }
    if title:
        lay["title"] = {"text": title, "x": 0, "font": {"size": 15}}
    lay.update(layout)
    try:
        return go.Figure({"data": data, "layout": lay}, _validate=False)
    except TypeError:  # a plotly without the private switch: validate
        return go.Figure({"data": data, "layout": lay})


def empty_figure(message: str, height: int = 90, color: str | None = None):
    ann = {"text": message, "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper"}
    if color:
        ann["font"] = {"size": 15, "color": color}
    return make_figure([], {"annotations": [ann], "xaxis": {"visible": False}, "yaxis": {"visible": False}},
                       height, legend=False)


def legend_entry(name: str, color: str, symbol: str = "square", line: str | None = None) -> dict:
    """A legend-only trace (no points)."""
    return {"type": "scatter", "x": [None], "y": [None], "mode": "markers", "name": name, "hoverinfo": "skip",
            "marker": {"symbol": symbol, "size": 13, "color": line or color, "line": {"width": 1, "color": "#888"}}}


def stepped_scale(palette: list[str]) -> list[list]:
    """A discrete colorscale: value i (of len(palette)) maps to palette[i] with zmin=-0.5, zmax=k-0.5."""
    k = len(palette)
    scale = []
    for i, c in enumerate(palette):
        scale += [[i / k, c], [(i + 1) / k, c]]
    return scale
