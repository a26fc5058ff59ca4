"""The free queue drawn in its real order, head (next to be reused) -> tail."""
from __future__ import annotations

import math

from kvcore.snapshot import Snapshot

from .common import (CACHED_FREE_COLOR, FREE_COLOR, VICTIM_COLOR, Decode, empty_figure, html_text,
                     make_figure, safe_decode, short_hash)

LABELS = {
    "en": {"head": "HEAD · next victim", "tail": "TAIL", "pos": "position", "block": "block",
           "hash": "hash (lost when popped)", "text": "text", "empty": "free queue is empty",
           "nohash": "no hash: nothing to lose", "parent": "parent"},
    "zh": {"head": "队头 · 下一个被复用", "tail": "队尾", "pos": "位置", "block": "块",
           "hash": "哈希（被取出时丢失）", "text": "文本", "empty": "空闲队列为空",
           "nohash": "无哈希：没有可丢失的缓存", "parent": "父哈希"},
}


def free_queue(snap: Snapshot, *, decode: Decode | None = None, lang: str = "en", cols: int = 16):
    L = LABELS.get(lang, LABELS["en"])
    blocks = {b.block_id: b for b in snap.blocks}
    q = list(snap.free_queue)
    if not q:
        return empty_figure(L["empty"], 80, VICTIM_COLOR)
    rows = math.ceil(len(q) / cols)
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    for pos, bid in enumerate(q):
        x, y = pos % cols, pos // cols
        b = blocks.get(bid)
        cached = bool(b and b.block_hash)
        z[y][x] = 1 if cached else 0
        text[y][x] = f"<b>{bid}</b>" + (f"<br>#{short_hash(b.block_hash, 4)}" if cached else "")
        lines = [f"<b>{L['block']} {bid}</b>", f"{L['pos']}: {pos}"]
        if cached:
            lines.append(f"{L['hash']}: {b.block_hash}")
            lines.append(f"{L['parent']}: {b.parent_hash or 'NONE_HASH'}")
            if b.token_ids:
                lines.append(f"{L['text']}: “{html_text(safe_decode(decode, b.token_ids))}”")
        else:
            lines.append(L["nohash"])
        hover[y][x] = "<br>".join(lines)
    data = [{"type": "heatmap", "z": z, "text": text, "customdata": hover, "texttemplate": "%{text}",
             "textfont": {"size": 13}, "showscale": False, "zmin": -0.5, "zmax": 1.5, "xgap": 10, "ygap": 8,
             "colorscale": [[0, FREE_COLOR], [0.5, FREE_COLOR], [0.5, CACHED_FREE_COLOR], [1, CACHED_FREE_COLOR]],
             "hovertemplate": "%{customdata}<extra></extra>"}]
    shapes = [{"type": "rect", "x0": -0.5, "x1": 0.5, "y0": -0.5, "y1": 0.5,
               "line": {"color": VICTIM_COLOR, "width": 4}}]
    for pos in range(len(q) - 1):
        x, y = pos % cols, pos // cols
        if x < cols - 1:
            shapes.append({"type": "line", "x0": x + 0.36, "x1": x + 0.64, "y0": y, "y1": y,
                           "line": {"color": "#777", "width": 2}})
    tx, ty = (len(q) - 1) % cols, (len(q) - 1) // cols
    annotations = [
        {"x": 0, "y": -0.5, "text": L["head"], "showarrow": False, "yshift": 10, "xanchor": "left",
         "font": {"color": VICTIM_COLOR, "size": 12}},
        {"x": tx, "y": ty + 0.5, "text": L["tail"], "showarrow": False, "yshift": -10,
         "font": {"color": "#555", "size": 12}},
    ]
    layout = {"shapes": shapes, "annotations": annotations,
              "xaxis": {"visible": False, "range": [-0.6, cols - 0.4]},
              "yaxis": {"visible": False, "range": [rows - 0.5 + 0.4, -1.0]}}
    return make_figure(data, layout, height=70 + 52 * rows, legend=False)
