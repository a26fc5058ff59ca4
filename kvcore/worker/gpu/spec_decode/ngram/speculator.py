"""Speculative decoding with an n-gram proposer, verified greedily (vLLM 0.34.0:
v1/worker/gpu/spec_decode/ngram/speculator.py, ``NgramGPUSpeculator``, which ``method="ngram"``
and ``"ngram_gpu"`` select; the verification is in spec_decode/rejection_sampler_utils.py. 0.33.0
had ``NgramProposer`` in v1/spec_decode/ngram_proposer.py, a file 0.34.0 removed).

vLLM's class is built from the ``VllmConfig`` and a device and drafts for the whole batch with
two Triton kernels; kvcore's holds the four numbers it decides by (``prompt_lookup_min``,
``prompt_lookup_max``, ``num_speculative_tokens``, ``max_model_len``) and drafts for one
request's token ids, with the same result.

One step of it, as the engine runs it:

1. after a request samples, :class:`NgramGPUSpeculator` looks for the longest n-gram ending its
   tokens that occurs earlier in those same tokens, takes the last such occurrence, and proposes
   the tokens that followed it there, then pads to k with the last sampled token: the *drafts*
   (``Request.spec_token_ids``), k of them (fewer only where they would pass ``max_model_len``);
2. next step the scheduler schedules ``1 + len(drafts)`` tokens for the request — the last
   sampled token and the drafts, fewer where the token budget or ``max_model_len`` cuts them —
   and ``allocate_slots`` gives all of them KV slots, padding included;
3. one packed forward computes the target model's greedy choice after each of them;
4. ``rejection_sample`` (:mod:`kvcore.worker.gpu.spec_decode.rejection_sampler_utils`) keeps
   the drafts up to the first disagreement, plus the target's own token there (or one bonus
   token if every draft was right): a padding draft is kept only where the target's greedy
   token happens to equal it;
5. ``update_from_output`` moves ``num_computed_tokens`` back over the rejected drafts: their K/V
   stays in the slots but is never read and is overwritten later.

Greedy verification never changes the output: every token kept is the target model's argmax
after exactly the tokens before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class NgramGPUSpeculator:
    """Prompt lookup: drafts come from the request's own tokens, no draft model.

    Invariants: ``1 <= min_n <= max_n``; ``k >= 1``; a proposal for a request that sampled has
    exactly ``min(k, max_model_len - len(token_ids))`` tokens. vLLM 0.34.0 fills all k draft
    slots and its scheduler never schedules a draft at or past ``max_model_len``; kvcore stops
    the list there, which schedules the same tokens and keeps a huge k from building a huge list.
    """

    min_n: int
    max_n: int
    k: int
    max_model_len: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(
                f"prompt_lookup_min={self.min_n} must be >= 1 and <= prompt_lookup_max={self.max_n}"
            )
        if self.k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1; got {self.k}")

    def find_match(self, token_ids: Sequence[int]) -> tuple[int, int]:
        """``(n, pos)`` of the match the drafts follow, ``(0, -1)`` when there is none.

        The suffix of length n (``min_n <= n <= max_n``) matches at ``pos`` when
        ``token_ids[pos:pos + n]`` equals it and ``pos + n < len(token_ids)`` (the suffix itself
        does not count; an earlier occurrence may overlap it). The longest n wins; of its
        occurrences, the one starting last (vLLM 0.34.0's scan packs n above pos in one score
        and keeps the maximum; 0.33.0's KMP search kept the first).
        """
        total = len(token_ids)
        tokens = list(token_ids)
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            suffix = tokens[total - n :]
            for pos in range(total - n - 1, -1, -1):
                if tokens[pos : pos + n] == suffix:
                    return n, pos
        return 0, -1

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        """The k drafts for a request that has just sampled and whose tokens are ``token_ids``.

        The tokens after the match (:meth:`find_match`) come first, as many as there are up to
        k; every slot left (all k when nothing matches, or the request has fewer than ``min_n``
        tokens) holds the last sampled token, ``token_ids[-1]``. Those padding drafts are
        scheduled and verified like any other, so they take KV slots and are rejected unless
        the target's greedy token equals them. The list stops below ``max_model_len`` (class
        docstring).
        """
        if not token_ids:
            raise ValueError("a request that sampled has at least one token")
        k = min(self.k, self.max_model_len - len(token_ids))
        if k <= 0:
            return []
        n, pos = self.find_match(token_ids)
        drafts = list(token_ids[pos + n : pos + n + k]) if n else []
        return drafts + [token_ids[-1]] * (k - len(drafts))
