"""Small charts over time: usage / hit rate / queues, token budget, blocks held."""
from __future__ import annotations

from typing import Sequence

from kvcore.events import SCHEDULED
from kvcore.snapshot import Snapshot, StepRecord

from .common import color_map, make_figure

LABELS = {
    "en": {"usage": "KV usage %", "hit": "prefix hit rate %", "running": "running", "waiting": "waiting",
           "step": "step", "pct": "%", "count": "requests", "budget": "max_num_batched_tokens",
           "tokens": "tokens scheduled", "blocks": "blocks held (not counting null)",
           "prefill": "prefill", "chunk": "prefill chunk", "decode": "decode"},
    "zh": {"usage": "KV 使用率 %", "hit": "前缀命中率 %", "running": "运行中", "waiting": "等待中",
           "step": "步", "pct": "%", "count": "请求数", "budget": "max_num_batched_tokens",
           "tokens": "本步调度的 token", "blocks": "持有的块数（不含空块）",
           "prefill": "预填充", "chunk": "分块预填充", "decode": "解码"},
}


def metrics_over_time(snaps: Sequence[Snapshot], *, lang: str = "en"):
    L = LABELS.get(lang, LABELS["en"])
    steps = [s.step for s in snaps]
    data = [
        {"type": "scatter", "x": steps, "y": [100 * s.usage for s in snaps], "name": L["usage"],
         "mode": "lines+markers", "line": {"color": "#d62728", "width": 3}},
        {"type": "scatter", "x": steps, "y": [100 * float(s.prefix_cache.get("hit_rate", 0.0)) for s in snaps],
         "name": L["hit"], "mode": "lines+markers", "line": {"color": "#2ca02c", "width": 3}},
        {"type": "bar", "x": steps, "y": [len(s.running) for s in snaps], "name": L["running"], "yaxis": "y2",
         "marker": {"color": "rgba(31,119,180,0.45)"}},
        {"type": "bar", "x": steps, "y": [len(s.waiting) for s in snaps], "name": L["waiting"], "yaxis": "y2",
         "marker": {"color": "rgba(255,127,14,0.45)"}},
    ]
    layout = {"barmode": "group",
              "xaxis": {"title": {"text": L["step"]}, "dtick": 1 if len(steps) <= 30 else None},
              "yaxis": {"title": {"text": L["pct"]}, "range": [0, 105]},
              "yaxis2": {"title": {"text": L["count"]}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                         "dtick": 1, "showgrid": False}}
    return make_figure(data, layout, height=260)


def token_budget(records: Sequence[StepRecord], budget: int, *, colors: dict[str, str] | None = None,
                 lang: str = "en"):
    """Stacked bars: tokens each request got per step; hatched bars are prefills and chunks."""
    L = LABELS.get(lang, LABELS["en"])
    rids = list(dict.fromkeys(r for rec in records for r in rec.scheduled))
    colors = {**color_map(rids), **(colors or {})}
    steps = [rec.step for rec in records]
    data = []
    for rid in rids:
        ys, patterns, kinds = [], [], []
        for rec in records:
            kind = next((e.phase for e in rec.events if e.kind == SCHEDULED and e.request_id == rid), "")
            ys.append(rec.scheduled.get(rid, 0))
            kinds.append(L.get(kind, kind))
            patterns.append("" if kind == "decode" else "/")
        data.append({"type": "bar", "x": steps, "y": ys, "name": rid, "customdata": kinds,
                     "marker": {"color": colors.get(rid), "pattern": {"shape": patterns}},
                     "hovertemplate": f"{rid}: %{{y}} (%{{customdata}})<extra></extra>"})
    if steps:
        data.append({"type": "scatter", "x": [steps[0] - 0.5, steps[-1] + 0.5], "y": [budget, budget],
                     "mode": "lines", "name": L["budget"], "line": {"color": "#d62728", "dash": "dash", "width": 2}})
    layout = {"barmode": "stack", "xaxis": {"title": {"text": L["step"]}, "dtick": 1 if len(steps) <= 30 else None},
              "yaxis": {"title": {"text": L["tokens"]}, "rangemode": "tozero"}}
    return make_figure(data, layout, height=260)


def blocks_held(snaps: Sequence[Snapshot], *, colors: dict[str, str] | None = None, lang: str = "en"):
    """Per request: distinct non-null blocks in its tables, step by step (flat under a sliding window)."""
    L = LABELS.get(lang, LABELS["en"])
    nulls = {b.block_id for s in snaps[:1] for b in s.blocks if b.is_null}
    rids = list(dict.fromkeys(r.request_id for s in snaps for r in s.requests))
    colors = {**color_map(rids), **(colors or {})}
    data = []
    for rid in rids:
        xs, ys = [], []
        for s in snaps:
            try:
                r = s.request(rid)
            except KeyError:
                continue
            xs.append(s.step)
            ys.append(len({b for t in r.block_tables for b in t if b not in nulls}))
        data.append({"type": "scatter", "x": xs, "y": ys, "name": rid, "mode": "lines+markers",
                     "line": {"color": colors.get(rid)}})
    layout = {"xaxis": {"title": {"text": L["step"]}}, "yaxis": {"title": {"text": L["blocks"]}, "rangemode": "tozero"}}
    return make_figure(data, layout, height=240)
