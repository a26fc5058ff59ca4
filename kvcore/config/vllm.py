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
"""

from __future__ import annotations

from typing import Optional, Sequence

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
