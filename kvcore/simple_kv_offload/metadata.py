"""What SimpleCPUOffloadConnector's two halves tell each other (vLLM:
v1/simple_kv_offload/metadata.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcore.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

INVALID_JOB_ID = -1


@dataclass
class SimpleCPUOffloadMetadata(KVConnectorMetadata):
    """One step's copies, as flat block id lists (the worker never sees request ids).

    At most one load job (CPU -> GPU) and one store job (GPU -> CPU) per step, each numbered by
    a counter that only grows; ``INVALID_JOB_ID`` means none. ``load_gpu_blocks[i]`` receives
    ``load_cpu_blocks[i]``, and ``store_cpu_blocks[i]`` receives ``store_gpu_blocks[i]``.
    """

    load_event: int = INVALID_JOB_ID
    load_gpu_blocks: list[int] = field(default_factory=list)
    load_cpu_blocks: list[int] = field(default_factory=list)
    # which requests each load job serves, so the worker can name the finished ones
    load_event_to_reqs: dict[int, list[str]] = field(default_factory=dict)
    store_event: int = INVALID_JOB_ID
    store_gpu_blocks: list[int] = field(default_factory=list)
    store_cpu_blocks: list[int] = field(default_factory=list)
    # a request was preempted this step: its blocks may be reused, so copies must be done first
    need_flush: bool = False


@dataclass
class SimpleCPUOffloadWorkerMetadata(KVConnectorWorkerMetadata):
    """The store jobs a worker finished: job -> count of workers that report it done."""

    completed_store_events: dict[int, int]

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, SimpleCPUOffloadWorkerMetadata)
        merged = dict(self.completed_store_events)
        for k, v in other.completed_store_events.items():
            merged[k] = merged.get(k, 0) + v
        return SimpleCPUOffloadWorkerMetadata(completed_store_events=merged)
