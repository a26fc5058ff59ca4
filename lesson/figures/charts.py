"""Small charts over time: usage / hit rate / queues, token budget, blocks held."""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from kvcore.trace import SCHEDULED, Snapshot, StepRecord

from .common import base_layout, color_map

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


def metrics_over_time(snaps: Sequence[Snapshot], *, lang: str = "en") -> go.Figure:
    L = LABELS.get(lang, LABELS["en"])
    steps = [s.step for s in snaps]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=steps, y=[100 * s.usage for s in snaps], name=L["usage"], mode="lines+markers",
                             line=dict(color="#d62728", width=3)))
    fig.add_trace(go.Scatter(x=steps, y=[100 * float(s.prefix_cache.get("hit_rate", 0.0)) for s in snaps],
                             name=L["hit"], mode="lines+markers", line=dict(color="#2ca02c", width=3)))
    fig.add_trace(go.Bar(x=steps, y=[len(s.running) for s in snaps], name=L["running"], yaxis="y2",
                         marker_color="rgba(31,119,180,0.45)"))
    fig.add_trace(go.Bar(x=steps, y=[len(s.waiting) for s in snaps], name=L["waiting"], yaxis="y2",
                         marker_color="rgba(255,127,14,0.45)"))
    fig.update_layout(
        barmode="group",
        xaxis=dict(title=L["step"], dtick=1 if len(steps) <= 30 else None),
        yaxis=dict(title=L["pct"], range=[0, 105]),
        yaxis2=dict(title=L["count"], overlaying="y", side="right", rangemode="tozero", dtick=1,
                    showgrid=False),
    )
    return base_layout(fig, height=260)


def token_budget(records: Sequence[StepRecord], budget: int, *, colors: dict[str, str] | None = None,
                 lang: str = "en") -> go.Figure:
    """Stacked bars: tokens each request got per step; hatched bars are prefill chunks."""
    L = LABELS.get(lang, LABELS["en"])
    rids = list(dict.fromkeys(r for rec in records for r in rec.scheduled))
    colors = {**color_map(rids), **(colors or {})}
    steps = [rec.step for rec in records]
    fig = go.Figure()
    for rid in rids:
        ys, patterns, kinds = [], [], []
        for rec in records:
            n = rec.scheduled.get(rid, 0)
            kind = next((e.data.get("kind", "") for e in rec.events
                         if e.kind == SCHEDULED and e.request_id == rid), "")
            ys.append(n)
            kinds.append(L.get(kind, kind))
            patterns.append("" if kind == "decode" else "/")
        fig.add_trace(go.Bar(x=steps, y=ys, name=rid, marker=dict(color=colors.get(rid), pattern_shape=patterns),
                             customdata=kinds, hovertemplate=f"{rid}: %{{y}} ({'%{customdata}'})<extra></extra>"))
    if steps:
        fig.add_trace(go.Scatter(x=[steps[0] - 0.5, steps[-1] + 0.5], y=[budget, budget], mode="lines",
                                 name=L["budget"], line=dict(color="#d62728", dash="dash", width=2)))
    fig.update_layout(barmode="stack", xaxis=dict(title=L["step"], dtick=1 if len(steps) <= 30 else None),
                      yaxis=dict(title=L["tokens"], rangemode="tozero"))
    return base_layout(fig, height=260)


def blocks_held(snaps: Sequence[Snapshot], *, colors: dict[str, str] | None = None,
                lang: str = "en") -> go.Figure:
    """Per request: distinct non-null blocks in its tables, step by step (flat under a sliding window)."""
    L = LABELS.get(lang, LABELS["en"])
    nulls = {b.block_id for s in snaps[:1] for b in s.blocks if b.is_null}
    rids = list(dict.fromkeys(r.request_id for s in snaps for r in s.requests))
    colors = {**color_map(rids), **(colors or {})}
    fig = go.Figure()
    for rid in rids:
        xs, ys = [], []
        for s in snaps:
            try:
                r = s.request(rid)
            except KeyError:
                continue
            held = {b for t in r.block_tables for b in t if b not in nulls}
            xs.append(s.step)
            ys.append(len(held))
        fig.add_trace(go.Scatter(x=xs, y=ys, name=rid, mode="lines+markers", line=dict(color=colors.get(rid))))
    fig.update_layout(xaxis=dict(title=L["step"]), yaxis=dict(title=L["blocks"], rangemode="tozero"))
    return base_layout(fig, height=240)
