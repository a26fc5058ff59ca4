"""Block tables: per request (and per KV cache group) logical block -> physical block."""
from __future__ import annotations

from kvcore.snapshot import Snapshot

from .common import (NULL_COLOR, Decode, block_tokens, colors_for, empty_figure, group_label, html_text,
                     make_figure, safe_decode, short_hash, stepped_scale)

LABELS = {
    "en": {"logical": "logical block", "physical": "physical block", "tokens": "tokens", "text": "text",
           "null": "null block: outside the sliding window, K/V freed", "hash": "hash", "ref": "ref_cnt",
           "empty": "no request holds blocks", "pending": "reserved, not computed yet", "slot": "slots"},
    "zh": {"logical": "逻辑块", "physical": "物理块", "tokens": "token", "text": "文本",
           "null": "空块：已滑出窗口，K/V 已释放", "hash": "哈希", "ref": "ref_cnt",
           "empty": "没有请求持有块", "pending": "已预留，尚未计算", "slot": "槽位"},
}


def table_rows(snap: Snapshot) -> list[tuple[str, str, int, tuple[int, ...]]]:
    """(row label, request id, group, table) for every request that holds a table."""
    rows = []
    for r in snap.requests:
        for g, table in enumerate(r.block_tables):
            if not table:
                continue
            gl = group_label(snap, g)
            rows.append((f"{r.request_id}" + (f" · {gl}" if gl else ""), r.request_id, g, tuple(table)))
    return rows


def block_tables(snap: Snapshot, *, decode: Decode | None = None, colors: dict[str, str] | None = None,
                 lang: str = "en"):
    L = LABELS.get(lang, LABELS["en"])
    colors = colors_for(snap, colors)
    rows = table_rows(snap)
    if not rows:
        return empty_figure(L["empty"])
    bs = snap.block_size
    blocks = {b.block_id: b for b in snap.blocks}
    reqs = {r.request_id: r for r in snap.requests}
    width = max(len(t) for *_, t in rows)
    cats = ["null"] + list(colors)
    palette = [NULL_COLOR] + [colors[c] for c in colors]
    z = [[None] * width for _ in rows]
    text = [[""] * width for _ in rows]
    hover = [[""] * width for _ in rows]
    shapes = []
    for y, (label, rid, g, table) in enumerate(rows):
        req = reqs[rid]
        for x, bid in enumerate(table):
            b = blocks.get(bid)
            first, last = x * bs, x * bs + bs - 1
            head = f"<b>{rid}</b> {L['logical']} {x} → {L['physical']} {bid}<br>{L['tokens']} {first}–{last}"
            if b is not None and b.is_null:
                z[y][x], text[y][x] = 0, "∅"
                hover[y][x] = f"{head}<br>{L['null']}"
                continue
            z[y][x] = cats.index(rid)
            toks = block_tokens(req, x, bs)
            snippet = html_text(safe_decode(decode, toks), 14) if toks and width <= 8 else ""
            text[y][x] = f"<b>{bid}</b>" + (f"<br>{snippet}" if snippet else "")
            lines = [head, f"{L['slot']} {bid * bs}–{bid * bs + bs - 1}"]
            lines.append(f"{L['text']}: “{html_text(safe_decode(decode, toks))}”" if toks else L["pending"])
            if b is not None:
                lines.append(f"{L['ref']}: {b.ref_cnt}")
                if b.block_hash:
                    lines.append(f"{L['hash']}: {short_hash(b.block_hash)}…")
                if b.ref_cnt > 1:
                    shapes.append({"type": "rect", "x0": x - .45, "x1": x + .45, "y0": y - .42, "y1": y + .42,
                                   "line": {"color": "#111", "width": 3}, "layer": "above"})
            hover[y][x] = "<br>".join(lines)
    data = [{"type": "heatmap", "z": z, "text": text, "customdata": hover, "texttemplate": "%{text}",
             "colorscale": stepped_scale(palette), "zmin": -0.5, "zmax": len(cats) - 0.5, "showscale": False,
             "xgap": 3, "ygap": 3, "y": [r[0] for r in rows], "x": list(range(width)),
             "hovertemplate": "%{customdata}<extra></extra>"}]
    layout = {"shapes": shapes,
              "xaxis": {"title": {"text": L["logical"]}, "dtick": 1, "side": "top", "showgrid": False},
              "yaxis": {"autorange": "reversed", "showgrid": False, "type": "category"}}
    return make_figure(data, layout, height=80 + (52 if width <= 8 else 38) * len(rows), legend=False)
