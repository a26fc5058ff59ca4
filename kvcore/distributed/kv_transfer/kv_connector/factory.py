"""Which KV connector a ``kv_transfer_config`` names, and whether it supports the hybrid KV cache
manager (vLLM: vllm/distributed/kv_transfer/kv_connector/factory.py, ``KVConnectorFactory``).

vLLM's factory maps each registered name to a class it imports lazily. The lab runs two of them
(SimpleCPUOffloadConnector: the CPU tier; NixlPullConnector: the P/D pair's pull); for the
others it keeps only what vLLM's configuration reads from the class before anything runs:
whether the class declares ``SupportsHMA``. That one bit decides whether vLLM 0.34 turns the
hybrid KV cache manager off (``kvcore/config/vllm.py``). The table is vLLM 0.34.0's registry;
tests/differential/test_hybrid_kv_cache_manager_vllm.py checks it against vLLM's class
definitions.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from kvcore.distributed.kv_transfer.kv_connector.v1.base import supports_hma


def _simple_cpu_offload():
    from kvcore.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import (
        SimpleCPUOffloadConnector,
    )

    return SimpleCPUOffloadConnector


def _nixl_pull():
    from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector

    return NixlPullConnector


# the connectors kvcore runs: name -> a loader of its class (vLLM loads each lazily too)
_RUN_HERE: dict[str, Callable[[], type]] = {
    "SimpleCPUOffloadConnector": _simple_cpu_offload,
    "NixlPullConnector": _nixl_pull,
}

# vLLM 0.34.0's other registered connectors -> whether the class vLLM loads declares SupportsHMA.
# "NixlConnector" resolves to NixlPullConnector or NixlPushConnector (transfer_mode), both
# NixlBaseConnector subclasses that declare it. "LMCacheMPConnector" is vLLM's built-in class
# only when the lmcache package does not ship its own (then that class's declaration decides).
HMA_DECLARED: dict[str, bool] = {
    "ExampleConnector": False,
    "ExampleHiddenStatesConnector": True,
    "LMCacheConnectorV1": False,
    "LMCacheMPConnector": False,
    "NixlConnector": True,
    "NixlPushConnector": True,
    "MultiConnector": True,  # the wrapper; its children decide (supports_hma_config)
    "HiSparseConnector": True,
    "MoRIIOConnector": True,
    "OffloadingConnector": True,
    "DecodeBenchConnector": True,
    "MooncakeConnector": True,
    "MooncakeStoreConnector": True,
    "UMBPStoreConnector": True,
    "FlexKVConnectorV1": False,
    "HF3FSKVConnector": False,
}

CONNECTOR_NAMES: tuple[str, ...] = tuple(sorted({*_RUN_HERE, *HMA_DECLARED}))
# the names a scenario may give ``engine.kv_connector``: the connectors the lab knows by name
# only (the CPU tier and the P/D pair stand for SimpleCPUOffloadConnector and NixlConnector;
# MultiConnector needs children the scenario does not state)
NAMED_ONLY_CONNECTORS: tuple[str, ...] = tuple(
    sorted(n for n in HMA_DECLARED if n not in ("MultiConnector", "NixlConnector"))
)


class KVConnectorFactory:
    """The registry's lookups the lab needs (vLLM's class of the same name)."""

    @classmethod
    def get_connector_class(cls, kv_connector: str) -> Optional[type]:
        """The class kvcore runs for ``kv_connector``; None for a connector kvcore only knows by
        name; ValueError for a name vLLM 0.34.0 does not register."""
        if kv_connector in _RUN_HERE:
            return _RUN_HERE[kv_connector]()
        if kv_connector in HMA_DECLARED:
            return None
        raise ValueError(f"Unsupported connector type: {kv_connector!r}")

    @classmethod
    def supports_hma_config(cls, kv_connector: str, children: Sequence[str] = ()) -> bool:
        """Whether the connector ``kv_connector`` names supports the hybrid KV cache manager.
        MultiConnector supports it only when every one of its ``children`` does, and not with
        no child at all (vLLM's ``MultiConnector.all_children_support_hma``)."""
        if kv_connector == "MultiConnector":
            return bool(children) and all(cls.supports_hma_config(c) for c in children)
        connector_cls = cls.get_connector_class(kv_connector)
        if connector_cls is not None:
            return supports_hma(connector_cls)
        return HMA_DECLARED[kv_connector]
