"""Prefix-cache hash chains drawn as a tree of shared prefixes."""
from __future__ import annotations

from collections import defaultdict

from kvcore.snapshot import Snapshot

from .common import (CACHED_FREE_COLOR, Decode, colors_for, empty_figure, html_text, make_figure, safe_decode,
                     short_hash)

LABELS = {
    "en": {"root": "NONE_HASH", "hash": "hash", "parent": "parent", "blocks": "blocks", "text": "text",
           "ref": "ref_cnt", "owners": "owners", "free": "cached, free", "empty": "no cached blocks yet",
           "orphan": "parent not cached", "axis": "logical block index (chain depth)", "group": "group"},
    "zh": {"root": "NONE_HASH（根）", "hash": "哈希", "parent": "父哈希", "blocks": "块", "text": "文本",
           "ref": "ref_cnt", "owners": "持有者", "free": "已缓存·空闲", "empty": "还没有已缓存的块",
           "orphan": "父块不在缓存中", "axis": "逻辑块序号（链深度）", "group": "组"},
}


def chain_nodes(snap: Snapshot):
    """(hash, group) -> blocks carrying it, in block order; plus parent links and depths."""
    nodes: dict[tuple[str, int], list] = {}
    for b in snap.blocks:
        if b.block_hash and not b.is_null:
            nodes.setdefault((b.block_hash, b.group or 0), []).append(b)
    parent = {key: bl[0].parent_hash for key, bl in nodes.items()}
    position: dict[tuple[int, int], int] = {}
    for r in snap.requests:
        for g, table in enumerate(r.block_tables):
            for i, bid in enumerate(table):
                position.setdefault((bid, g), i)
    depth: dict[tuple[str, int], int] = {}

    def depth_of(key, seen=()):
        if key in depth:
            return depth[key]
        for b in nodes[key]:
            if (b.block_id, key[1]) in position:
                depth[key] = position[(b.block_id, key[1])]
                return depth[key]
        ph = parent[key]
        pk = (ph, key[1]) if ph else None
        if pk in nodes and pk not in seen:
            depth[key] = depth_of(pk, seen + (key,)) + 1
        else:
            depth[key] = 0
        return depth[key]

    for key in nodes:
        depth_of(key)
    return nodes, parent, depth


def hash_chains(snap: Snapshot, *, decode: Decode | None = None, colors: dict[str, str] | None = None,
                lang: str = "en"):
    L = LABELS.get(lang, LABELS["en"])
    colors = colors_for(snap, colors)
    nodes, parent, depth = chain_nodes(snap)
    if not nodes:
        return empty_figure(L["empty"])
    groups = sorted({g for _, g in nodes})
    children: dict[object, list] = defaultdict(list)
    roots: dict[int, list] = defaultdict(list)
    for key in sorted(nodes, key=lambda k: nodes[k][0].block_id):
        pk = (parent[key], key[1]) if parent[key] else None
        if pk in nodes:
            children[pk].append(key)
        else:
            roots[key[1]].append(key)
    ypos: dict[object, float] = {}
    next_leaf = [0.0]

    def place(key):
        kids = children.get(key, [])
        if not kids:
            ypos[key] = next_leaf[0]
            next_leaf[0] += 1
        else:
            for c in kids:
                place(c)
            ypos[key] = sum(ypos[c] for c in kids) / len(kids)

    root_y = {}
    for g in groups:
        start = next_leaf[0]
        for key in roots[g]:
            place(key)
        root_y[g] = (start + next_leaf[0] - 1) / 2
        next_leaf[0] += 0.6
    ex, ey, ox, oy = [], [], [], []
    for key in nodes:
        pk = (parent[key], key[1]) if parent[key] else None
        x1, y1 = depth[key], ypos[key]
        if pk in nodes:
            ex += [depth[pk], x1, None]
            ey += [ypos[pk], y1, None]
        elif parent[key] is None:
            ex += [-1, x1, None]
            ey += [root_y[key[1]], y1, None]
        else:
            ox += [x1 - 0.6, x1, None]
            oy += [y1, y1, None]
    data = [{"type": "scatter", "x": ex, "y": ey, "mode": "lines", "line": {"color": "#999", "width": 2},
             "hoverinfo": "skip", "showlegend": False}]
    if ox:
        data.append({"type": "scatter", "x": ox, "y": oy, "mode": "lines", "name": L["orphan"],
                     "line": {"color": "#bbb", "width": 2, "dash": "dot"}, "hoverinfo": "skip"})
    rt = [L["root"] + (f" · g{g}" if len(groups) > 1 else "") for g in groups]
    data.append({"type": "scatter", "x": [-1] * len(groups), "y": [root_y[g] for g in groups],
                 "mode": "markers+text", "text": rt, "textposition": "middle left", "hovertext": rt,
                 "hoverinfo": "text", "marker": {"size": 16, "color": "#555", "symbol": "diamond"},
                 "showlegend": False})
    xs, ys, labels, hover, fill, line, size = [], [], [], [], [], [], []
    for key, bl in nodes.items():
        h, g = key
        owners = [o for b in bl for o in b.owners]
        used = any(b.ref_cnt > 0 for b in bl)
        xs.append(depth[key])
        ys.append(ypos[key])
        labels.append(",".join(str(b.block_id) for b in bl))
        fill.append(colors.get(owners[0], "#888") if used and owners else CACHED_FREE_COLOR)
        line.append("#111" if any(b.ref_cnt > 1 for b in bl) else "#666")
        size.append(34 + 8 * (len(bl) - 1))
        lines = [f"<b>{L['hash']}</b>: {h}", f"{L['parent']}: {parent[key] or 'NONE_HASH'}",
                 f"{L['blocks']}: {labels[-1]}" + (f" ({L['group']} {g})" if len(groups) > 1 else ""),
                 f"{L['ref']}: {', '.join(str(b.ref_cnt) for b in bl)}",
                 f"{L['owners']}: {', '.join(dict.fromkeys(owners)) or L['free']}"]
        if bl[0].token_ids:
            lines.append(f"{L['text']}: “{html_text(safe_decode(decode, bl[0].token_ids))}”")
        hover.append("<br>".join(lines))
    data.append({"type": "scatter", "x": xs, "y": ys, "mode": "markers+text", "text": labels,
                 "textposition": "middle center", "textfont": {"color": "#111", "size": 12},
                 "marker": {"size": size, "color": fill, "line": {"color": line, "width": 2}, "symbol": "square"},
                 "customdata": hover, "hovertemplate": "%{customdata}<extra></extra>", "showlegend": False})
    data.append({"type": "scatter", "x": xs, "y": [y + 0.42 for y in ys], "mode": "text",
                 "text": ["#" + short_hash(k[0], 6) for k in nodes], "textposition": "middle center",
                 "textfont": {"size": 10, "color": "#555"}, "hoverinfo": "skip", "showlegend": False})
    layout = {"xaxis": {"title": {"text": L["axis"]}, "range": [-2.6, max(depth.values()) + 0.6], "dtick": 1,
                        "showgrid": False, "zeroline": False},
              "yaxis": {"visible": False, "autorange": "reversed"}}
    return make_figure(data, layout, height=max(170, 80 + 60 * next_leaf[0]), legend=bool(ox))
