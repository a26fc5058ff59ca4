"""Greedy verification of draft tokens (vLLM 0.34.0: v1/worker/gpu/spec_decode/
rejection_sampler_utils.py, ``rejection_sample``; 0.33.0 kept it in v1/sample/rejection_sampler.py).

vLLM's ``rejection_sample`` takes the whole batch's logits as tensors and runs Triton kernels;
for a greedy request, with ``rejection_sample_method`` "standard" (vLLM's default) or "block", it
keeps what this function keeps ("synthetic" and "fly" accept by other rules, not modelled).
kvcore verifies one request at a time, on the target's greedy tokens
(``GPUModelRunner.execute_verify`` takes the argmax at every position it verifies).
"""

from __future__ import annotations

from typing import Sequence


def rejection_sample(draft_token_ids: Sequence[int], target_token_ids: Sequence[int]) -> list[int]:
    """Greedy verification (vLLM's ``rejection_sample`` for a greedy request): the tokens a
    request gains are the drafts up to the first one the target disagrees with, then the
    target's token at that place (the bonus token when all drafts hold).

    ``target_token_ids[i]`` is the target model's greedy token after the request's tokens and
    the first i drafts, so it has one more entry than ``draft_token_ids``.
    """
    if len(target_token_ids) != len(draft_token_ids) + 1:
        raise ValueError(
            f"{len(draft_token_ids)} drafts need {len(draft_token_ids) + 1} target tokens; "
            f"got {len(target_token_ids)}"
        )
    out = []
    for draft, target in zip(draft_token_ids, target_token_ids):
        out.append(int(target))
        if draft != target:
            return out
    out.append(int(target_token_ids[-1]))
    return out
