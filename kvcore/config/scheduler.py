"""The scheduler's settings (vLLM: vllm/config/scheduler.py), the fields our scheduler reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# vLLM 0.33 and 0.34 by default (scheduler_reserve_full_isl=True): a waiting request is admitted
# only if all of it fits
ADMIT_FULL_SEQUENCE = "full_sequence"
# older releases, and 0.33 / 0.34 with scheduler_reserve_full_isl=False: only this step's
# chunk must fit
ADMIT_FIRST_CHUNK = "first_chunk"
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
    # vLLM 0.34's cache-aware admission: within the first ``cache_aware_admission_window``
    # waiting requests, those whose prefix is cached go before those that would compute theirs
    # (0 = strict arrival order), once the pool's usage is at least
    # ``cache_aware_admission_threshold``. Only with prefix caching and the "fcfs" policy.
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5
    # vLLM 0.34's cap on requests holding blocks for an asynchronous connector load (loading,
    # or landed and waiting for a running slot). Set, it also lets such loads start while the
    # running batch is full; None = no cap, and loads start only when a running slot is free.
    max_num_inflight_kv_loads: Optional[int] = None
    # vLLM's flag: True = every attention layer is managed as full attention in one group (the
    # hybrid KV cache manager off); None = decided from the rest of the configuration
    # (kvcore/config/vllm.py: resolve_disable_hybrid_kv_cache_manager).
    disable_hybrid_kv_cache_manager: Optional[bool] = None

    def __post_init__(self) -> None:
        # vLLM's pydantic bounds on the three 0.34 fields (ge=0; ge=0.0, le=1.0; ge=1)
        if self.cache_aware_admission_window < 0:
            raise ValueError("cache_aware_admission_window must be >= 0")
        if not 0.0 <= self.cache_aware_admission_threshold <= 1.0:
            raise ValueError("cache_aware_admission_threshold must be in [0, 1]")
        if self.max_num_inflight_kv_loads is not None and self.max_num_inflight_kv_loads < 1:
            raise ValueError("max_num_inflight_kv_loads must be >= 1 or None")
