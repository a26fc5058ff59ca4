"""The rule vLLM 0.34.0 applies, in ``VllmConfig.__post_init__`` (vllm/config/vllm.py), to decide
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
