"""The NIXL connector's worker half, pull mode (vLLM:
distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py): the decode worker copies the
prefill blocks' K/V into its own blocks, in every layer, where NIXL issues RDMA READs between two
GPUs. The flow: connector.py."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from kvcore.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlConnectorMetadata,
    ReqMeta,
)


class NixlAgentRegistry:
    """The engines that can reach each other's K/V: engine id -> its worker half. It stands for
    NIXL's agents and side channel (handshake, memory registration, notifications)."""

    def __init__(self) -> None:
        self.workers: dict[str, "NixlPullConnectorWorker"] = {}

    def register(self, engine_id: str, worker: "NixlPullConnectorWorker") -> None:
        if engine_id in self.workers:
            raise ValueError(f"engine id {engine_id!r} is registered already")
        self.workers[engine_id] = worker

    def get(self, engine_id: str) -> "NixlPullConnectorWorker":
        try:
            return self.workers[engine_id]
        except KeyError:
            raise ValueError(f"no engine {engine_id!r} to pull K/V from") from None


class NixlPullConnectorWorker:
    """The worker half: pulls K/V from another engine's blocks into its own, and lets go of its
    own blocks once a reader says it is done (or the lease ran out).

    Invariant: after ``start_load_kv`` every pulled local block holds, in every layer, the K/V of
    the remote block paired with it; a request it was told to keep is reported in
    ``finished_sending`` exactly once."""

    def __init__(self, engine_id: str, registry: NixlAgentRegistry) -> None:
        self.engine_id = engine_id
        self.registry = registry
        self.kv_caches: Optional[list[Any]] = None
        self._reqs_to_process: set[str] = set()
        self._reqs_to_send: dict[str, int] = {}
        self._notifs: set[str] = set()
        self._done_recving: set[str] = set()
        self._failed_recving: set[str] = set()
        self._invalid_block_ids: set[int] = set()
        self._step = 0
        # Ours, for teaching: the pull for each named request fails; its local blocks are
        # reported invalid and no notification goes out (the prefill side waits for the lease).
        self.fail_load_req_ids: set[str] = set()
        self.num_blocks_pulled = 0
        # what each pull moved since its reader cleared it: request -> (remote, local blocks)
        self.pulls: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        registry.register(engine_id, self)

    def register_kv_caches(self, kv_caches: Any) -> None:
        """The model runner's per-layer tensors ``[num_blocks, ...]`` (None: no model, pulls are
        only reported)."""
        self.kv_caches = list(kv_caches) if kv_caches is not None else None

    def start_load_kv(self, metadata: NixlConnectorMetadata) -> None:
        self._step = metadata.step
        for req_id, meta in metadata.reqs_to_recv.items():
            self._read_blocks(req_id, meta)
        self._reqs_to_process |= metadata.reqs_in_batch
        self._reqs_to_process -= metadata.reqs_not_processed
        for req_id, expires in metadata.reqs_to_send.items():
            if req_id in self._reqs_to_process:
                self._reqs_to_send[req_id] = expires

    def _read_blocks(self, req_id: str, meta: ReqMeta) -> None:
        remote = self.registry.get(meta.remote.engine_id)
        local = list(meta.local_block_ids)
        # A local prefix hit: only the tail of the remote blocks is pulled.
        remote_ids = list(meta.remote.block_ids[len(meta.remote.block_ids) - len(local) :])
        if req_id in self.fail_load_req_ids:
            # as vLLM's pull worker reports a failed READ: the request by name, its blocks (one
            # KV cache group), and the request among the finished receives
            self.fail_load_req_ids.discard(req_id)
            self._invalid_block_ids.update(local)
            self._failed_recving.add(req_id)
            self._done_recving.add(req_id)
            return
        if local and self.kv_caches is not None and remote.kv_caches is not None:
            _copy_blocks(remote.kv_caches, self.kv_caches, remote_ids, local)
        self.num_blocks_pulled += len(local)
        self.pulls[req_id] = (tuple(remote_ids), tuple(local))
        remote.notify(meta.remote.request_id)
        if meta.awaiting_kvs or local:
            self._done_recving.add(req_id)

    def notify(self, request_id: str) -> None:
        """A reader is done with ``request_id``'s blocks (NIXL's notification message)."""
        self._notifs.add(request_id)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """The requests whose blocks a reader is done with (or whose lease ran out), the pulls
        finished since the last call, and which of them failed."""
        done_sending = set()
        for req_id in sorted(self._notifs):
            if req_id in self._reqs_to_send or req_id in self._reqs_to_process:
                done_sending.add(req_id)
                self._reqs_to_process.discard(req_id)
                self._reqs_to_send.pop(req_id, None)
        self._notifs.clear()
        for req_id, expires in sorted(self._reqs_to_send.items()):
            if self._step >= expires:  # nobody read them in time: give them back
                del self._reqs_to_send[req_id]
                self._reqs_to_process.discard(req_id)
                done_sending.add(req_id)
        done_recving, self._done_recving = self._done_recving, set()
        failed, self._failed_recving = self._failed_recving, set()
        return KVConnectorTransferResults(done_sending, done_recving, failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        invalid, self._invalid_block_ids = self._invalid_block_ids, set()
        return invalid


def _copy_blocks(
    src_caches: Sequence[torch.Tensor],
    dst_caches: Sequence[torch.Tensor],
    src_block_ids: Sequence[int],
    dst_block_ids: Sequence[int],
) -> None:
    """In every layer, block ``dst_block_ids[i]`` of ``dst_caches`` receives block
    ``src_block_ids[i]`` of ``src_caches`` (both laid out ``[num_blocks, ...]`` alike)."""
    if len(src_block_ids) != len(dst_block_ids):
        raise ValueError("a copy pairs each source block with one destination block")
    if not dst_block_ids:
        return
    with torch.inference_mode():
        for src, dst in zip(src_caches, dst_caches):
            s = torch.tensor(list(src_block_ids), dtype=torch.long, device=src.device)
            d = torch.tensor(list(dst_block_ids), dtype=torch.long, device=dst.device)
            dst.index_copy_(0, d, src.index_select(0, s).to(dst.device))
