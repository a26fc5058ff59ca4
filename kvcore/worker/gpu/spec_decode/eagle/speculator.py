"""Speculative decoding with an EAGLE-style head on the target's hidden states (vLLM 0.34.0:
v1/worker/gpu/spec_decode/eagle/speculator.py, ``EagleSpeculator``, which ``method="eagle"``
selects; its ``propose`` is the one it inherits from
spec_decode/target_dependent_ar/speculator.py. 0.33.0 had ``EagleProposer`` in
v1/spec_decode/eagle.py, a file 0.34.0 removed).

vLLM's class is built from the ``VllmConfig`` and a device and loads the EAGLE model itself;
kvcore's is handed the head's passes (``EagleForward``, run by
:class:`kvcore.worker.eagle_head_runner.EagleHeadRunner`, which keeps torch out of this file) and
decides which request asks for how many drafts from which row of the target's hidden states.

After the target's verify forward of a step, for every request that sampled: the hidden state at
the position whose logits gave the step's last token (the bonus token after the accepted drafts)
and that token go through the head (:mod:`kvcore.model.eagle_head`), which predicts the next
hidden state; the target's LM head turns it into draft 1. The predicted state and draft 1 give
draft 2, and so on, ``num_speculative_tokens`` times (the forward is
:class:`kvcore.worker.eagle_head_runner.EagleHeadRunner`). So the drafter needs the target's
hidden states up to the last computed token, and vLLM's head also writes K/V of its own there,
which depends on the token after each position: that is why, with plain block hashes, vLLM gives
up the last matched block of every prefix-cache hit (``KVCacheManager(use_eagle=True)``,
decided by ``use_eagle_block_drop`` in :mod:`kvcore.core.sched.scheduler`) and computes it
again.

The scheduler reserves ``num_lookahead_tokens = num_speculative_tokens`` slots, as vLLM does for
EAGLE (its head's K/V layer writes there); our head is one linear map and writes none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol, Sequence


class EagleForward(Protocol):
    """The head's passes (kvcore.worker.eagle_head_runner.EagleHeadRunner)."""

    def draft(self, asks: Sequence[tuple[str, int, int, int]]) -> dict[str, list[int]]:
        """Per (request id, row of the target's last hidden states, last token, number of
        drafts): the drafts."""
        ...


@dataclass
class EagleSpeculator:
    """Drafts ``num_speculative_tokens`` tokens per request from the target's hidden states.

    Invariant: a proposal has at most ``num_speculative_tokens`` tokens and never makes a
    request reach past ``max_model_len``.
    """

    runner: EagleForward
    num_speculative_tokens: int
    max_model_len: int
    # vLLM's SpeculatorConfig.uses_target_hidden_states: the engine hands it the verify step's
    # tokens, and the runner keeps the hidden states they came from
    uses_target_hidden_states: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1; got {self.num_speculative_tokens}"
            )

    @property
    def num_lookahead_tokens(self) -> int:
        """Slots the scheduler reserves past the scheduled tokens (vLLM's EAGLE speculator:
        ``num_speculative_tokens``)."""
        return self.num_speculative_tokens

    def propose(
        self, gained: dict[str, list[int]], num_tokens: dict[str, int]
    ) -> dict[str, list[int]]:
        """``gained[rid]``: the tokens a request gained in the verify step (accepted drafts,
        then the bonus token), row i of its hidden states being the position before token i;
        ``num_tokens[rid]``: its token count now. -> each request's drafts."""
        asks = []
        for rid, tokens in gained.items():
            room = min(self.num_speculative_tokens, self.max_model_len - num_tokens[rid])
            if tokens and room > 0:
                asks.append((rid, len(tokens) - 1, tokens[-1], room))
        return self.runner.draft(asks) if asks else {}
