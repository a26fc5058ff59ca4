"""Lesson 10's table: each request's prompt split by tier (GPU hit, CPU hit, computed) and its
time to first token, from a recorded run (vLLM 0.34's SimpleCPUOffloadConnector keeps copies of GPU
blocks in a CPU pool of its own, so a block evicted from the GPU is not always lost)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from paged_kv_lab.recording.snapshot import StepRecord


# -- the hit split by tier, and the time to first token -------------------------------------------
@dataclass(frozen=True)
class TierRow:
    """One request's prompt by tier and its time to first token, from a recorded run."""

    request_id: str
    case: str  # "gpu_hit" | "cpu_hit" | "miss"
    num_prompt_tokens: int
    gpu_hit_tokens: int
    cpu_hit_tokens: int
    computed_tokens: int
    ttft_steps: int | None  # from the step it arrived in to the step of its first token
    ttft_ms: float | None  # wall time of those steps here; None if not measured (a trace)


def tier_rows(records: Sequence[StepRecord]) -> list[TierRow]:
    """Per request that has produced its first token: its last admission's lookup (GPU hit, CPU
    hit, the rest computed) and its time to first token."""
    arrived: dict[str, int] = {}
    prompt: dict[str, int] = {}
    gpu: dict[str, int] = {}
    cpu: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, rec in enumerate(records):
        for e in rec.events:
            if e.kind == "arrived":
                arrived[e.request_id], prompt[e.request_id] = i, e.num_prompt_tokens
            elif e.kind in ("cache_hit", "cache_miss") and e.request_id not in first:
                gpu[e.request_id] = e.num_tokens if e.kind == "cache_hit" else 0
                cpu[e.request_id] = 0
            elif e.kind == "cpu_hit" and e.request_id not in first:
                cpu[e.request_id] = e.num_tokens
            elif e.kind == "kv_load_failed" and e.request_id not in first:
                # only the tokens before the first failed block came from the CPU
                cpu[e.request_id] = max(0, e.num_computed_tokens - gpu.get(e.request_id, 0))
            elif e.kind == "sampled":
                for rid in e.tokens:
                    first.setdefault(rid, i)
    rows = []
    for rid, i in first.items():
        if rid not in arrived:
            continue
        g, c = gpu.get(rid, 0), cpu.get(rid, 0)
        steps = records[arrived[rid] : i + 1]
        measured = all(r.seconds > 0 for r in steps)
        rows.append(
            TierRow(
                request_id=rid,
                case="cpu_hit" if c else ("gpu_hit" if g else "miss"),
                num_prompt_tokens=prompt[rid],
                gpu_hit_tokens=g,
                cpu_hit_tokens=c,
                computed_tokens=prompt[rid] - g - c,
                ttft_steps=len(steps),
                ttft_ms=1000 * sum(r.seconds for r in steps) if measured else None,
            )
        )
    return rows
