"""A trace's budget: the one place that bounds replaying a trace, for the CLI and the app.

A replay holds no KV tensors, so the limits that count are the ones on its size: the file's bytes,
its requests and tokens, each prompt and answer, the pool's block count and block size, the
step's token budget, the engine steps of one replay and the steps recorded for the player at once.
A refusal is a ``BudgetError`` that names the quantity, its value, the limit and the variable
that sets it, as every refusal does (its sentence a catalogue ``Text``, ``e.text``).

Two sides set the limits (``TraceLimits``):
- the CLI's (``cli_trace_limits``): the record budget's generous CLI limits
  (paged_kv_lab/run/budget.py ``cli_limits``, variables ``PAGED_KV_LAB_MAX_*``), which admit
  the whole shipped trace; a trace's total tokens, its steps and a window are not bounded there;
- the "Real workloads" page's (``page_trace_limits``): small ones, each set by its
  ``PAGED_KV_LAB_REPLAY_*`` variable (``PAGE_ENV``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

from paged_kv_lab.run.budget import (
    ENV,
    BudgetError,
    Limits,
    Says,
    _env_int,
    cli_limits,
    count,
    fmt_bytes,
    over,
)
from paged_kv_lab.text.i18n import Text
from paged_kv_lab.workloads.replay import ReplaySettings
from paged_kv_lab.workloads.trace_formats import Trace

UNBOUNDED = 10**18


@dataclass(frozen=True)
class TraceLimits:
    """Upper bounds for replaying one trace. ``env`` names the variable that sets each field (a
    refusal names it; a field with none is bounded by what the side offers); ``where`` names the
    side in a refusal."""

    max_trace_bytes: int
    max_requests: int
    max_trace_tokens: int  # prompt + output tokens of the whole trace
    max_prompt_tokens: int  # one request's input_length
    max_output_tokens: int  # one request's output_length
    max_num_gpu_blocks: int
    max_block_size: int
    max_num_batched_tokens: int
    max_steps: int  # engine steps of one replay
    max_window: int  # steps recorded for the player at once
    where: Text = Text("refusal.where.server")
    env: Mapping[str, str] = field(default_factory=dict)


# -- the page's limits --------------------------------------------------------------------------
PAGE_ENV = {
    "max_trace_bytes": "PAGED_KV_LAB_REPLAY_MAX_BYTES",
    "max_requests": "PAGED_KV_LAB_REPLAY_MAX_REQUESTS",
    "max_trace_tokens": "PAGED_KV_LAB_REPLAY_MAX_TOKENS",
    "max_num_gpu_blocks": "PAGED_KV_LAB_REPLAY_MAX_BLOCKS",
    "max_steps": "PAGED_KV_LAB_REPLAY_MAX_STEPS",
    "max_window": "PAGED_KV_LAB_REPLAY_MAX_WINDOW",
}
PAGE_DEFAULT = {
    "max_trace_bytes": 4 * 10**6,
    "max_requests": 400,
    # prompt + output tokens of the whole trace (its cache history: ~26 MB a million at bs 16)
    "max_trace_tokens": 4 * 10**6,
    "max_num_gpu_blocks": 40_000,
    "max_steps": 200_000,  # engine steps of one replay
    "max_window": 400,  # steps recorded for the player at once
}
PAGE_BLOCK_SIZE = 512  # the page's largest block size choice
PAGE_BATCHED_TOKENS = 65_536  # the page's largest max_num_batched_tokens


def page_trace_limits(env: Optional[Mapping[str, str]] = None) -> TraceLimits:
    """The "Real workloads" page's limits: PAGE_DEFAULT, each changed by its variable. One
    request's prompt or answer is bounded by the trace's total (the same variable)."""
    env = os.environ if env is None else env
    got = {f: _env_int(env, name, PAGE_DEFAULT[f]) for f, name in PAGE_ENV.items()}
    tokens = PAGE_ENV["max_trace_tokens"]
    return TraceLimits(
        **got,
        max_prompt_tokens=got["max_trace_tokens"],
        max_output_tokens=got["max_trace_tokens"],
        max_block_size=PAGE_BLOCK_SIZE,
        max_num_batched_tokens=PAGE_BATCHED_TOKENS,
        where=Text("refusal.where.page"),
        env={**PAGE_ENV, "max_prompt_tokens": tokens, "max_output_tokens": tokens},
    )


# -- the CLI's limits ---------------------------------------------------------------------------
def trace_limits(limits: Limits) -> TraceLimits:
    """A run budget (paged_kv_lab/run/budget.py) as a trace's: its per-request, pool and file
    limits with their variables; a trace's total tokens, steps and window left unbounded."""
    return TraceLimits(
        max_trace_bytes=limits.max_trace_bytes,
        max_requests=limits.max_requests,
        max_trace_tokens=UNBOUNDED,
        max_prompt_tokens=limits.max_prompt_tokens,
        max_output_tokens=limits.max_tokens,
        max_num_gpu_blocks=limits.max_num_gpu_blocks,
        max_block_size=limits.max_block_size,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_steps=UNBOUNDED,
        max_window=UNBOUNDED,
        where=limits.where,
        env={
            "max_trace_bytes": ENV["max_trace_bytes"],
            "max_requests": ENV["max_requests"],
            "max_prompt_tokens": ENV["max_prompt_tokens"],
            "max_output_tokens": ENV["max_tokens"],
            "max_num_gpu_blocks": ENV["max_num_gpu_blocks"],
            "max_block_size": ENV["max_block_size"],
            "max_num_batched_tokens": ENV["max_num_batched_tokens"],
        },
    )


def cli_trace_limits(available: Optional[int] = None) -> TraceLimits:
    """The command line's limits: the record budget's CLI limits (``cli_limits``)."""
    return trace_limits(cli_limits(available))


# -- the checks ---------------------------------------------------------------------------------
AnyLimits = Union[TraceLimits, Limits]


def _limits(limits: AnyLimits) -> TraceLimits:
    return limits if isinstance(limits, TraceLimits) else trace_limits(limits)


def refuse(what: Says, value: int, limits: AnyLimits, field: str) -> BudgetError:
    """The refusal of ``value`` over ``limits.<field>``, naming the limit's variable."""
    limits = _limits(limits)
    allowed = getattr(limits, field)
    show = fmt_bytes if field == "max_trace_bytes" else count
    name = limits.env.get(field, "")
    text = over(what, show(value), show(allowed), limits.where, name)
    return BudgetError(text, name, value, allowed)


def check(what: Says, value: int, limits: AnyLimits, field: str) -> None:
    """Raise the refusal if ``value`` is over ``limits.<field>``."""
    if value > getattr(_limits(limits), field):
        raise refuse(what, value, limits, field)


def check_trace(trace: Trace, settings: Optional[ReplaySettings], limits: AnyLimits) -> None:
    """Raise BudgetError if replaying ``trace`` (with ``settings``, if given) exceeds ``limits``:
    its requests and tokens, the pool, the block size and the step's token budget, then each
    request's prompt and answer."""
    limits = _limits(limits)
    check(Text("refusal.what.trace_requests"), len(trace), limits, "max_requests")
    tokens = trace.prompt_tokens + trace.output_tokens
    check(Text("refusal.what.trace_tokens"), tokens, limits, "max_trace_tokens")
    if settings is not None:
        s = settings.engine
        check("engine.num_gpu_blocks", s.num_gpu_blocks, limits, "max_num_gpu_blocks")
        check("engine.block_size", s.block_size, limits, "max_block_size")
        batched = s.max_num_batched_tokens
        check("engine.max_num_batched_tokens", batched, limits, "max_num_batched_tokens")
    for r in trace.requests:
        at = {"index": r.index}
        check(Text("refusal.what.input_length", at), r.input_length, limits, "max_prompt_tokens")
        check(Text("refusal.what.output_length", at), r.output_length, limits, "max_output_tokens")
