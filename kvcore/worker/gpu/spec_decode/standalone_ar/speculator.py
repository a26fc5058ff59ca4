"""Speculative decoding with a draft model that writes K/V ahead (vLLM 0.34.0:
v1/worker/gpu/spec_decode/standalone_ar/speculator.py, ``StandaloneARSpeculator``, which
``method="draft_model"`` selects, on the autoregressive drafting of
spec_decode/autoregressive/speculator.py. 0.33.0 had ``DraftModelProposer`` in
v1/spec_decode/draft_model.py, on spec_decode/llm_base_proposer.py; 0.34.0 removed both files).

vLLM's class is built from the ``VllmConfig`` and a device, loads the draft model itself and
drafts for the batch on the GPU; kvcore's is handed the draft's forward (``DraftForward``, run
by :class:`kvcore.worker.draft_model_runner.DraftModelRunner`, which keeps torch out of this
file) and decides the same passes: which tokens each pass feeds, at which positions, and how
many drafts a request gets.

Our draft model is the target cut short (self-speculative, early-exit drafting): SmolLM2's first
L decoder layers with its final norm and LM head. Its layers keep K/V of their own in the paged
pool, through the target's block tables (:mod:`kvcore.worker.draft_model_runner`).

After the target's forward of a step, the proposer drafts for every request that ran:

1. **first pass**: the draft reads, per request, the tokens the target computed this step that
   survived verification, plus the token just sampled; it writes their draft K/V and, for a
   request that sampled, proposes draft 1 (a prefill chunk only writes);
2. **passes 2..k**: draft i is fed at the next position, one token per request, and proposes
   draft i + 1. The last draft is proposed, never fed.

So the drafter writes K/V up to ``k - 1`` positions past the request's tokens, and after an
all-accepted step that is up to ``k`` positions past what the target was scheduled for. Those
slots must exist before the forward runs, which is why the scheduler calls
``allocate_slots(..., num_lookahead_tokens=k)`` (vLLM: ``VllmConfig.num_lookahead_tokens`` equals
``num_speculative_tokens`` for draft models and EAGLE). The n-gram proposer writes nothing and
needs no lookahead.

Since the draft reads the target's own block tables, a prefix-cache hit brings the draft's K/V
along (the drafter ran over every token that filled the block), and a preempted request
recomputes both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from kvcore.worker.gpu.input_batch import SeqBatchItem


class DraftForward(Protocol):
    """One forward of the draft model (kvcore.worker.draft_model_runner.DraftModelRunner)."""

    num_layers: int

    def execute(self, items: Sequence[SeqBatchItem]) -> dict[str, int]: ...


@dataclass
class StandaloneARSpeculator:
    """Drafts ``num_speculative_tokens`` tokens per request with a draft model.

    Invariants: a proposal has at most ``num_speculative_tokens`` tokens and never makes a
    request reach past ``max_model_len``; the draft writes K/V only at positions below
    ``num_tokens + num_speculative_tokens - 1`` of a request, inside the slots the scheduler
    reserved with ``num_lookahead_tokens = num_speculative_tokens``.
    """

    runner: DraftForward
    num_speculative_tokens: int
    max_model_len: int
    num_forwards: int = 0  # draft passes run so far (the bench counts them)

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1; got {self.num_speculative_tokens}"
            )

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots the scheduler must reserve past the scheduled tokens (vLLM's property of the
        same name on VllmConfig: ``num_speculative_tokens`` for a draft model)."""
        return self.num_speculative_tokens

    def propose(
        self, first_pass: Sequence[SeqBatchItem], num_tokens: dict[str, int]
    ) -> dict[str, list[int]]:
        """Run the first pass over ``first_pass`` (one item per request that ran this step: its
        verified tokens, plus its new token if it sampled) and the k - 1 passes after it.

        ``num_tokens[rid]`` is the request's token count after this step; a request drafts at
        most ``max_model_len - num_tokens`` tokens. Returns the drafts of every item with
        ``sample=True`` (possibly fewer than k near ``max_model_len``).
        """
        if not first_pass:
            return {}
        out: dict[str, list[int]] = {}
        room = {
            it.request_id: min(
                self.num_speculative_tokens, self.max_model_len - num_tokens[it.request_id]
            )
            for it in first_pass
            if it.sample
        }
        proposed = self._run(first_pass)
        current: list[SeqBatchItem] = []
        for it in first_pass:
            rid = it.request_id
            if rid not in proposed or room[rid] <= 0:
                continue
            out[rid] = [proposed[rid]]
            current.append(it)
        for _ in range(self.num_speculative_tokens - 1):
            nxt = [
                SeqBatchItem(
                    request_id=it.request_id,
                    token_ids=[out[it.request_id][-1]],
                    start_pos=it.start_pos + len(it.token_ids),
                    block_tables=it.block_tables,
                    sample=True,
                    lora_request=it.lora_request,
                )
                for it in current
                if len(out[it.request_id]) < room[it.request_id]
            ]
            if not nxt:
                break
            for rid, token in self._run(nxt).items():
                out[rid].append(token)
            current = nxt
        return out

    def _run(self, items: list[SeqBatchItem]) -> dict[str, Any]:
        self.num_forwards += 1
        return self.runner.execute(items)
