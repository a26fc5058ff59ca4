"""Speculative-decoding placeholders (vLLM: v1/structured_output/utils.py, the one helper kvcore
needs from it; kvcore has no structured outputs)."""

from __future__ import annotations

# A draft position that holds no proposed token: vLLM writes -1 there when it pads a one-token
# admission to the 1 + num_spec_tokens rows of a speculative decode. No token id is negative, so
# the target never samples it and such a draft is always rejected.
PADDING_SPEC_TOKEN_ID = -1


def strip_speculative_padding(token_ids: list[int]) -> list[int]:
    """The drafts before the first placeholder: the tokens that were really proposed (a
    placeholder is never followed by a proposed token)."""
    end = next((i for i, t in enumerate(token_ids) if t < 0), len(token_ids))
    return token_ids[:end]
