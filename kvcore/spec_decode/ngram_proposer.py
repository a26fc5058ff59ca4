"""Speculative decoding with an n-gram proposer, verified greedily (vLLM v1:
spec_decode/ngram_proposer, sample/rejection_sampler).

One step of it, as the engine runs it:

1. after a request samples, :class:`NgramProposer` looks for the latest n-gram of its tokens
   earlier in those same tokens and proposes the (up to k) tokens that followed it there: the
   *drafts* (``Request.spec_token_ids``);
2. next step the scheduler schedules ``1 + len(drafts)`` tokens for the request — the last
   sampled token and the drafts — and ``allocate_slots`` gives all of them KV slots;
3. one packed forward computes the target model's greedy choice after each of them;
4. :func:`rejection_sample` keeps the drafts up to the first disagreement, plus the target's own
   token there (or one bonus token if every draft was right);
5. ``update_from_output`` moves ``num_computed_tokens`` back over the rejected drafts: their K/V
   stays in the slots but is never read and is overwritten later.

Greedy verification never changes the output: every token kept is the target model's argmax
after exactly the tokens before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class NgramProposer:
    """Prompt lookup: drafts come from the request's own tokens, no draft model.

    Invariants: ``1 <= min_n <= max_n``; ``k >= 1``; a proposal never has more than ``k``
    tokens nor reaches past ``max_model_len``.
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

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        """Drafts for a request whose tokens so far are ``token_ids``; [] when nothing matches.

        The longest suffix of length n in [min_n, max_n] that also occurs earlier wins; of its
        earlier occurrences the first one is used (as vLLM's KMP search picks), and the up to k
        tokens after it are the drafts.
        """
        total = len(token_ids)
        k = min(self.k, self.max_model_len - total)
        if total < self.min_n or k <= 0:
            return []
        tokens = list(token_ids)
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            suffix = tokens[total - n :]
            # An occurrence must end before the last token: the suffix itself does not count.
            for start in range(total - n):
                if tokens[start : start + n] == suffix:
                    after = start + n
                    return tokens[after : after + min(k, total - after)]
        return []
