"""A trace checked against the resource budget (paged_kv_lab.record.budget) before it is replayed.

A replay holds no KV tensors, so the limits that count are the ones on its size: requests,
each prompt and answer, the pool's block count and block size, the step's token budget. A
refusal names the quantity, the limit and the variable that sets it, as every refusal does.
"""

from __future__ import annotations

from paged_kv_lab.record.budget import ENV, BudgetError, Limits
from paged_kv_lab.workload.replay import ReplaySettings
from paged_kv_lab.workload.trace import Trace


def _refuse(what: str, value: int, limits: Limits, field: str) -> BudgetError:
    allowed = getattr(limits, field)
    return BudgetError(
        f"{what} = {value:,}; {limits.where} at most {allowed:,} ({ENV[field]})",
        ENV[field],
        value,
        allowed,
    )


def check_trace(trace: Trace, settings: ReplaySettings, limits: Limits) -> None:
    """Raise BudgetError if replaying ``trace`` with ``settings`` exceeds ``limits``."""
    s = settings.engine
    checks = (
        ("the trace's requests", len(trace), "max_requests"),
        ("engine.num_gpu_blocks", s.num_gpu_blocks, "max_num_gpu_blocks"),
        ("engine.block_size", s.block_size, "max_block_size"),
        ("engine.max_num_batched_tokens", s.max_num_batched_tokens, "max_num_batched_tokens"),
    )
    for what, value, field in checks:
        if value > getattr(limits, field):
            raise _refuse(what, value, limits, field)
    for r in trace.requests:
        if r.input_length > limits.max_prompt_tokens:
            raise _refuse(
                f"request {r.index}'s input_length", r.input_length, limits, "max_prompt_tokens"
            )
        if r.output_length > limits.max_tokens:
            raise _refuse(
                f"request {r.index}'s output_length", r.output_length, limits, "max_tokens"
            )
