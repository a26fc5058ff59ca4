"""What crosses from a frontend to the engine core (vLLM: v1/engine/__init__.py).

vLLM runs its frontend (API server, tokenizer) and its engine core in separate processes; kvcore
runs both in one, so only the two shapes its engine core reads are here: the request a frontend
sends (``EngineCoreRequest``, the fields kvcore models) and what a frontend needs to hash a
prompt's blocks itself (``PrefixHashConfig``, new in vLLM 0.34).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from kvcore.lora.request import LoRARequest
from kvcore.multimodal.inputs import MultiModalFeatureSpec


@dataclass
class PrefixHashConfig:
    """What a frontend needs to compute a request's prompt block hashes the engine's way.

    The engine core builds it when it hashes blocks at all (prefix caching on, or a KV connector
    configured: ``EngineCore.prefix_hash_config``; None otherwise) and vLLM sends it to each
    frontend when the engine is ready (``EngineCoreReadyResponse.prefix_hash_config``)."""

    # the algorithm's name (vLLM's --prefix-caching-hash-algo), e.g. "sha256"
    hash_algo: str
    # tokens per hashed block
    hash_block_size: int
    # the parent hash of block 0 (NONE_HASH, from the engine's seed)
    none_hash: bytes
    # tokens after each block that its hash covers too (EAGLE/MTP lookahead hashes), so a block
    # is hashed only once they exist
    num_lookahead_tokens: int = 0


@dataclass
class EngineCoreRequest:
    """One request as a frontend sends it to the engine core (vLLM: ``EngineCoreRequest``), with
    the fields kvcore's Request models. vLLM's carries ``SamplingParams``; kvcore takes the one
    sampling field its engine core needs here, ``max_tokens``.

    ``block_hashes`` (new in vLLM 0.34): the prompt's block hashes, computed by the frontend
    with the engine's ``PrefixHashConfig`` (extra keys included: LoRA, multimodal items, cache
    salt); None when the frontend did not hash (vLLM's Python frontend never does; its Rust
    frontend does). The engine takes them only when their count fits the prompt
    (``kv_cache_utils.frontend_block_hashes``)."""

    request_id: str
    prompt_token_ids: Optional[list[int]]
    max_tokens: int
    arrival_time: int = 0
    lora_request: Optional[LoRARequest] = None
    cache_salt: Optional[str] = None
    priority: int = 0
    mm_features: Sequence[MultiModalFeatureSpec] = ()
    block_hashes: Optional[list[bytes]] = None
