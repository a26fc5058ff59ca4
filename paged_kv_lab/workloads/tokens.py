"""Prompt tokens from a trace's hash ids, so the prefix cache shares exactly what the trace shares.

Trace block ``h`` at position ``j`` of a prompt becomes tokens that all carry one value,
``block_token(h, j)``, a one-to-one function of the pair (Cantor's pairing, plus one). So two
prompts have equal tokens at a position exactly when the trace gives them the same id at the
same block position. With chained block hashing at any ``block_size`` that divides the trace's
block, two requests then share their first k cache blocks exactly when their first
``k * block_size`` tokens lie in trace blocks with equal ids: the trace's sharing, no more and no
less.

The last trace block is partial when ``input_length`` is not a multiple of the trace block: it
yields only its ``input_length - (n - 1) * trace_block`` tokens. Equal ids there mean equal
content (the trace hashed those tokens), so the cache blocks that are full inside it can be
shared; the partial cache block at its end never is (vLLM caches full blocks only).

Answers are ``PLACEHOLDER_TOKEN`` (0), a value no prompt token takes, so a prompt never hits a
block that holds generated tokens (the trace says nothing about answers being reused).
"""

from __future__ import annotations

from paged_kv_lab.text.i18n import Text
from paged_kv_lab.workloads.trace_formats import TraceRequest

PLACEHOLDER_TOKEN = 0


def block_token(hash_id: int, position: int) -> int:
    """The token value of trace block ``hash_id`` at block position ``position`` (>= 1)."""
    s = hash_id + position
    return s * (s + 1) // 2 + position + 1


def prompt_token_ids(request: TraceRequest, trace_block_size: int) -> list[int]:
    """The request's ``input_length`` prompt tokens, trace block by trace block."""
    out: list[int] = []
    last = len(request.hash_ids) - 1
    for j, h in enumerate(request.hash_ids):
        n = trace_block_size if j < last else request.input_length - last * trace_block_size
        out += [block_token(h, j)] * n
    return out


def check_block_size(block_size: int, trace_block_size: int) -> None:
    """ScenarioError (a ValueError) unless ``block_size`` divides the trace's block (else a cache
    block would straddle two trace blocks and share what the trace does not say is shared)."""
    from paged_kv_lab.run.scenario import ScenarioError

    if block_size < 1 or trace_block_size % block_size:
        divisors = [d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if trace_block_size % d == 0]
        at = {
            "got": block_size,
            "trace": trace_block_size,
            "divisors": ", ".join(map(str, divisors)),
        }
        raise ScenarioError([Text("problem.replay.block_size", at)])
