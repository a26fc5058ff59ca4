"""What the model runner returns to the scheduler each step (vLLM: v1/outputs.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelRunnerOutput:
    """Sampled tokens per request, in ``req_ids`` order; an empty list for a request still
    in the middle of its prompt (nothing sampled)."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]

    @classmethod
    def from_token_lists(
        cls, req_ids: list[str], sampled: dict[str, list[int]]
    ) -> "ModelRunnerOutput":
        """Several tokens per request (speculative decoding: accepted drafts + one more)."""
        return cls(
            list(req_ids),
            {r: i for i, r in enumerate(req_ids)},
            [list(sampled.get(r, ())) for r in req_ids],
        )

    @classmethod
    def from_sampled(cls, req_ids: list[str], sampled: dict[str, int]) -> "ModelRunnerOutput":
        return cls(
            list(req_ids),
            {r: i for i, r in enumerate(req_ids)},
            [[sampled[r]] if r in sampled else [] for r in req_ids],
        )
