"""Shared pieces of the Python-side charts: request colours (the player's palette) and the figure wrapper."""
from __future__ import annotations

from player import color_map  # one colour per request, the same as the player's

FONT = dict(family="Inter, 'Noto Sans CJK SC', 'Microsoft YaHei', sans-serif", size=13)

__all__ = ["FONT", "color_map", "make_figure"]


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


