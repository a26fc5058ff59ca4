"""The physical block grid: one cell per block, coloured by who holds it."""
from __future__ import annotations

import math
from typing import Iterable

from kvcore.snapshot import Snapshot

from .common import (CACHED_FREE_COLOR, FREE_COLOR, NULL_COLOR, SHARED_BORDER, VICTIM_COLOR, Decode,
                     block_state, colors_for, html_text, legend_entry, make_figure, safe_decode, short_hash,
                     stepped_scale)

LABELS = {
    "en": {"null": "null block", "free": "free", "cached": "cached, free", "shared": "shared (ref_cnt>1)",
           "victim": "next victim", "changed": "changed this step", "block": "block", "ref": "ref_cnt",
           "hash": "hash", "parent": "parent", "text": "text", "owners": "owners", "queue": "free-queue position",
           "head": "head", "none": "—", "group": "group"},
    "zh": {"null": "空块", "free": "空闲", "cached": "已缓存·空闲", "shared": "共享（ref_cnt>1）",
           "victim": "下一个被复用", "changed": "本步变化", "block": "块", "ref": "ref_cnt",
           "hash": "哈希", "parent": "父哈希", "text": "文本", "owners": "持有者", "queue": "空闲队列位置",
           "head": "队头", "none": "—", "group": "组"},
}


def grid_columns(n: int) -> int:
    if n <= 8:
        return max(n, 1)
    return 8 if n <= 24 else 10 if n <= 60 else 16


def cell_xy(i: int, cols: int) -> tuple[int, int]:
    return i % cols, i // cols


def block_hover(b, lang: str, decode: Decode | None) -> str:
    L = LABELS.get(lang, LABELS["en"])
    lines = [f"<b>{L['block']} {b.block_id}</b>"]
    if b.is_null:
        lines.append(L["null"])
        return "<br>".join(lines)
    lines.append(f"{L['ref']}: {b.ref_cnt}")
    lines.append(f"{L['hash']}: {b.block_hash or L['none']}")
    if b.block_hash:
        lines.append(f"{L['parent']}: {b.parent_hash or 'NONE_HASH'}")
        if b.group is not None:
            lines.append(f"{L['group']}: {b.group}")
    if b.token_ids:
        lines.append(f"{L['text']}: “{html_text(safe_decode(decode, b.token_ids))}”")
    lines.append(f"{L['owners']}: {', '.join(b.owners) if b.owners else L['none']}")
    if b.queue_pos is not None:
        head = f" ({L['head']})" if b.queue_pos == 0 else ""
        lines.append(f"{L['queue']}: {b.queue_pos}{head}")
    return "<br>".join(lines)


def block_grid(snap: Snapshot, *, decode: Decode | None = None, colors: dict[str, str] | None = None,
               lang: str = "en", changed: Iterable[int] = (), cols: int | None = None):
    L = LABELS.get(lang, LABELS["en"])
    colors = colors_for(snap, colors)
    n = len(snap.blocks)
    cols = cols or grid_columns(n)
    rows = max(1, math.ceil(n / cols))
    cats = ["null", "free", "cached"] + list(colors)
    palette = [NULL_COLOR, FREE_COLOR, CACHED_FREE_COLOR] + [colors[r] for r in colors]
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    shapes = []
    changed = set(changed)
    victim = snap.free_queue[0] if snap.free_queue else None
    present = set()

    def box(x, y, color, width, dash="solid", pad=0.44):
        shapes.append({"type": "rect", "x0": x - pad, "x1": x + pad, "y0": y - pad, "y1": y + pad,
                       "line": {"color": color, "width": width, "dash": dash}, "layer": "above"})

    for i, b in enumerate(snap.blocks):
        x, y = cell_xy(i, cols)
        state = block_state(b)
        if state == "used":
            cat = b.owners[0] if b.owners and b.owners[0] in colors else "free"
            label = f"<b>{b.block_id}</b><br>r{b.ref_cnt}"
        elif state == "cached":
            cat, label = "cached", f"{b.block_id}<br>#{short_hash(b.block_hash, 4)}"
        elif state == "null":
            cat, label = "null", "∅"
        else:
            cat, label = "free", f"{b.block_id}"
        present.add(cat)
        z[y][x] = cats.index(cat)
        text[y][x] = label
        hover[y][x] = block_hover(b, lang, decode)
        if b.ref_cnt > 1:
            box(x, y, SHARED_BORDER, 4)
            present.add("shared")
        if b.block_id == victim:
            box(x, y, VICTIM_COLOR, 4, pad=0.47)
            present.add("victim")
        if b.block_id in changed:
            box(x, y, "#ff9900", 2, "dot", pad=0.36)
            present.add("changed")
    data = [{"type": "heatmap", "z": z, "text": text, "customdata": hover, "texttemplate": "%{text}",
             "textfont": {"size": 12}, "colorscale": stepped_scale(palette), "zmin": -0.5,
             "zmax": len(cats) - 0.5, "showscale": False, "xgap": 3, "ygap": 3,
             "hovertemplate": "%{customdata}<extra></extra>", "name": "blocks"}]
    for cat, color, symbol, line in (
        ("null", NULL_COLOR, "square", None), ("free", FREE_COLOR, "square", None),
        ("cached", CACHED_FREE_COLOR, "square", None),
        ("shared", "white", "square-open", SHARED_BORDER), ("victim", "white", "square-open", VICTIM_COLOR),
        ("changed", "white", "square-open", "#ff9900"),
    ):
        if cat in present:
            data.append(legend_entry(L[cat], color, symbol, line))
    data += [legend_entry(rid, colors[rid]) for rid in colors if rid in present]
    layout = {"shapes": shapes, "xaxis": {"visible": False, "range": [-0.5, cols - 0.5]},
              "yaxis": {"visible": False, "range": [rows - 0.5, -0.5]}}
    return make_figure(data, layout, height=70 + 52 * rows)
