"""The calls nano-vllm's ``Scheduler`` (``nanovllm/engine/scheduler.py``) makes on the block
manager, for one sequence; the batching around them (``max_num_seqs``, the token budget, which
sequence goes first) is not modelled.

- ``schedule_prefill``: ``schedule``'s prefill half for a waiting sequence. At bb823b3:
  ``can_allocate`` counts the cached blocks (-1: no room), ``allocate`` takes that count, and
  the uncached tokens (or a ``chunk`` of them: chunked prefill) are scheduled; a sequence that
  already holds blocks schedules its next chunk. At 2f352ae: ``can_allocate``, ``allocate``.
- ``schedule_decode``: ``schedule``'s decode half: ``can_append``, then ``may_append``.
- ``postprocess``: after the step, at bb823b3 only: ``hash_blocks`` over what the step
  computed, then those tokens count as cached.

Each takes ``commit`` (default the block manager's own), so the same calls drive nano-vllm's own
code in tests/differential/test_designs_fidelity.py.
"""

from __future__ import annotations

from paged_kv_lab.designs.nanovllm import HEAD


def schedule_prefill(bm, seq, chunk: int | None = None, commit: str | None = None) -> bool:
    """Whether ``seq`` got its blocks (or its next chunk); False leaves everything as it was."""
    if (commit or bm.commit) != HEAD:
        if not bm.can_allocate(seq):
            return False
        bm.allocate(seq)
        return True
    if not seq.block_table:
        num_cached_blocks = bm.can_allocate(seq)
        if num_cached_blocks == -1:
            return False
        bm.allocate(seq, num_cached_blocks)
    num_tokens = seq.num_tokens - seq.num_cached_tokens
    seq.num_scheduled_tokens = num_tokens if chunk is None else min(num_tokens, chunk)
    return True


def schedule_decode(bm, seq, commit: str | None = None) -> bool:
    """Room for ``seq``'s newest token (False: nano-vllm would preempt a sequence)."""
    if not bm.can_append(seq):
        return False
    bm.may_append(seq)
    if (commit or bm.commit) == HEAD:
        seq.num_scheduled_tokens = 1
    return True


def postprocess(bm, seq, commit: str | None = None) -> None:
    """After the step that computed ``seq``'s scheduled tokens."""
    if (commit or bm.commit) == HEAD:
        bm.hash_blocks(seq)
        seq.num_cached_tokens += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0
