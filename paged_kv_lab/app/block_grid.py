"""A pool as a grid of cells, one block each, coloured by the block's state: a styled table (the
fleet lesson's pools, the P/D lesson's two pools). A styled table, not a chart: the page's tables
load the one grid the browser needs anyway, where a chart library kept every element of the page
from showing until it had loaded."""

from __future__ import annotations

import pandas as pd


def block_grid(cells: list[str], states: list[str], cols: int, colors: dict, text: dict):
    """``cells`` (one text per block, in order) in rows of ``cols``, each painted by its state in
    ``states`` (``colors``: background, ``text``: foreground); a short last row is padded with
    blank, unpainted cells."""
    rows, paint = [], []
    for i in range(0, len(cells), cols):
        pad = cols - len(cells[i : i + cols])
        rows.append(cells[i : i + cols] + [""] * pad)
        paint.append(states[i : i + cols] + [""] * pad)
    grid = pd.DataFrame(rows, columns=[str(c) for c in range(cols)])
    state = pd.DataFrame(paint, columns=grid.columns)

    def style(_):
        return state.map(
            lambda k: f"background-color: {colors[k]}; color: {text[k]}" if k in colors else ""
        )

    return grid.style.apply(style, axis=None)


def blank_headers(cols: int) -> dict:
    """Column settings that hide the grid's column names (a pool's columns mean nothing)."""
    import streamlit as st

    return {str(c): st.column_config.TextColumn(" ") for c in range(cols)}
