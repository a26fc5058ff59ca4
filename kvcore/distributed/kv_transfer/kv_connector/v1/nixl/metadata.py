"""What the NIXL connector's two halves tell each other (vLLM:
distributed/kv_transfer/kv_connector/v1/nixl/metadata.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcore.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

# the params a decode request needs to pull its prompt's K/V (vLLM checks these too, and the
# host/port of the side channel we do not have)
REMOTE_PARAMS = ("remote_engine_id", "remote_request_id", "remote_block_ids")


@dataclass(frozen=True)
class RemoteMeta:
    """Where a request's K/V lives on the prefill engine."""

    engine_id: str
    request_id: str
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class ReqMeta:
    """One pull: ``local_block_ids`` (the decode blocks without a hash) receive the last
    ``len(local_block_ids)`` of ``remote.block_ids``; empty after a full local hit, when only the
    notification goes out. ``awaiting_kvs``: the request waits in WAITING_FOR_REMOTE_KVS."""

    local_block_ids: tuple[int, ...]
    remote: RemoteMeta
    awaiting_kvs: bool


@dataclass
class NixlConnectorMetadata(KVConnectorMetadata):
    """One step's orders from the scheduler half to the worker half (vLLM's fields):
    pulls to start, prefill requests whose blocks await a reader (request -> the step their lease
    ends), requests admitted with transfer params this step, and ones that finished without
    anything to send (aborted)."""

    reqs_to_recv: dict[str, ReqMeta] = field(default_factory=dict)
    reqs_to_send: dict[str, int] = field(default_factory=dict)
    reqs_in_batch: set[str] = field(default_factory=set)
    reqs_not_processed: set[str] = field(default_factory=set)
    step: int = 0
