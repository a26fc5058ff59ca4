"""The scheduler's settings (vLLM: vllm/config/scheduler.py), the fields our scheduler reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ADMIT_FULL_SEQUENCE = "full_sequence"  # v0.33: a waiting request is admitted only if all of it fits
ADMIT_FIRST_CHUNK = "first_chunk"  # older releases: only this step's chunk must fit
# the one list of admission rules (the scenario schema and the playground's form derive theirs)
ADMISSIONS = (ADMIT_FULL_SEQUENCE, ADMIT_FIRST_CHUNK)


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    policy: str = "fcfs"
    max_model_len: int = 8192
    admission: str = ADMIT_FULL_SEQUENCE
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    # Caps a waiting request's prefix-cache hit (vLLM: get_computed_blocks' argument,
    # set there by an output connector); None = num_tokens - 1.
    max_cache_hit_length: Optional[int] = None
    # Draft tokens proposed per request and step (speculative decoding; 0 = off).
    num_spec_tokens: int = 0
    # KV slots reserved past the scheduled tokens (vLLM's num_lookahead_tokens): only drafters
    # that write K/V beyond the verified range (EAGLE, draft models) need them; the n-gram
    # proposer writes none, so with it this stays 0 and drafts get their slots as scheduled tokens.
    num_lookahead_tokens: int = 0
