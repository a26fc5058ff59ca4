"""Counters of speculative decoding (vLLM: v1/spec_decode/metrics.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecDecodingStats:
    """Counts over a run, as vLLM's spec-decoding metrics keep them: drafts scheduled and
    accepted, and the verification steps they came in. As in vLLM, a padded admission's
    placeholder drafts count as drafts (all rejected)."""

    num_drafts: int = 0  # verification steps that carried at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens gained per verification step: 1 (the target's own token) + accepted drafts."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> "SpecDecodingStats":
        return SpecDecodingStats(
            self.num_drafts + 1,
            self.num_draft_tokens + num_draft_tokens,
            self.num_accepted_tokens + num_accepted_tokens,
        )
