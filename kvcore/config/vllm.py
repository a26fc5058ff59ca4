"""Two rules vLLM 0.34.0's ``VllmConfig`` (vllm/config/vllm.py) applies to settings left unset:
``resolve_enable_extensible_kv_cache`` (its ``_resolve_extensible_kv_cache``, below), and the
rule it applies, in ``VllmConfig.__post_init__``, to decide
``SchedulerConfig.disable_hybrid_kv_cache_manager``: whether the KV cache manager runs one
group per kind of layer (the hybrid KV cache manager, "HMA") or treats every attention layer as
full attention (``unify_hybrid_kv_cache_specs`` in kvcore/core/kv_cache_planning.py).

- set to True: HMA is off, whatever else is configured;
- left unset (None, vLLM's default): HMA is off when a ``kv_transfer_config`` names a connector
  that does not support it (``KVConnectorFactory.supports_hma_config``), on a platform without
  hybrid KV cache support, or for a model with chunked local attention (the last two are not
  modelled here: the lab's platform, like CUDA, ROCm, XPU and CPU, supports it, and its models
  have no chunked local attention); on otherwise;
- set to False: HMA is on. vLLM skips the connector check then (only the platform and
  chunked-local rules can refuse it, with a ValueError), so a connector without ``SupportsHMA``
  gets several groups, and vLLM's scheduler asserts there is one group when a request finishes.

The same file resolves the block hashes' lookahead (``resolve_num_hash_lookahead_tokens``, vLLM's
``VllmConfig._resolve_num_hash_lookahead_tokens``) once the speculative settings are final.
"""

from __future__ import annotations

from typing import Optional, Sequence

from kvcore.config.speculative import SpeculativeConfig
from kvcore.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory


def resolve_disable_hybrid_kv_cache_manager(
    disable_hybrid_kv_cache_manager: Optional[bool],
    kv_connector: Optional[str] = None,
    connector_children: Sequence[str] = (),
) -> bool:
    """``disable_hybrid_kv_cache_manager`` as vLLM 0.34.0 resolves it for a configuration whose
    ``kv_transfer_config`` names ``kv_connector`` (None: no kv_transfer_config) with
    ``connector_children`` (a MultiConnector's)."""
    if disable_hybrid_kv_cache_manager is not None:
        return bool(disable_hybrid_kv_cache_manager)
    if kv_connector is None:
        return False
    return not KVConnectorFactory.supports_hma_config(kv_connector, connector_children)


def resolve_num_hash_lookahead_tokens(
    speculative_config: Optional[SpeculativeConfig],
    enable_prefix_caching: bool,
    connector_supports_lookahead_block_hashes: Optional[bool] = None,
) -> int:
    """Tokens after each block that its hash also covers (vLLM 0.34.0's
    ``VllmConfig._resolve_num_hash_lookahead_tokens``): the drafter's prefill lookahead when the
    block drop is on and lookahead hashes are not disabled, with prefix caching on and no KV
    connector, or a connector that supports them (``connector_supports_lookahead_block_hashes``;
    None = no connector). 0 keeps plain hashes."""
    if (
        speculative_config is None
        or not speculative_config.use_eagle_block_drop()
        or speculative_config.disable_lookahead_block_hashes
    ):
        return 0
    if connector_supports_lookahead_block_hashes is not None:
        if not connector_supports_lookahead_block_hashes:
            return 0
    elif not enable_prefix_caching:
        return 0
    return speculative_config.num_prefill_lookahead_tokens


def resolve_enable_extensible_kv_cache(cache_config, cuda_alike: bool = True) -> bool:
    """Settle ``cache_config.enable_extensible_kv_cache`` in place, as vLLM 0.34.0's
    ``VllmConfig._resolve_extensible_kv_cache`` does, and return it.

    It is unsupported off CUDA and ROCm (``cuda_alike`` False: vLLM's CPU platform), and where
    the cache is not sized from measured memory: ``kv_cache_memory_bytes`` or
    ``num_gpu_blocks_override`` stated. Unset (None), it becomes True where supported and False
    elsewhere; stated True where unsupported, a ValueError naming the reason; stated False stays
    False. The lab models a GPU server, so ``cuda_alike`` defaults to True. vLLM's further reasons
    (elastic EP, KV connectors that share the cache through legacy CUDA IPC or a custom memory
    pool, ROCm with connectors that register the cache for RDMA, a driver without virtual memory
    management, no IMEX channel for NIXL) concern setups the lab does not model."""
    unsupported = None
    if not cuda_alike:
        unsupported = "it is only supported on CUDA and ROCm"
    elif cache_config.kv_cache_memory_bytes is not None:
        unsupported = (
            "it sizes the KV cache from measured memory, which kv_cache_memory_bytes overrides"
        )
    elif cache_config.num_gpu_blocks_override is not None:
        unsupported = (
            "it sizes the KV cache from measured memory, which num_gpu_blocks_override overrides"
        )
    requested = cache_config.enable_extensible_kv_cache
    if requested is None:
        cache_config.enable_extensible_kv_cache = unsupported is None
    elif requested and unsupported is not None:
        raise ValueError(f"enable_extensible_kv_cache: {unsupported}.")
    return bool(cache_config.enable_extensible_kv_cache)
