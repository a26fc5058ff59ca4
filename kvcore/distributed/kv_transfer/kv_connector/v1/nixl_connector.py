"""NixlConnector: prefill on one engine, decode on another (vLLM:
distributed/kv_transfer/kv_connector/v1/nixl/, its pull mode).

The flow, as vLLM's P/D proxy drives it:

1. The proxy sends the prompt to the prefill engine with ``max_tokens = 1`` and
   ``kv_transfer_params = {"do_remote_decode": True}``. The prefill engine computes the prompt
   (its own prefix cache serving what it can), samples one token and finishes;
   ``request_finished`` keeps the request's blocks (``delay_free_blocks``) and returns the
   params the decode side needs: ``do_remote_prefill``, ``remote_engine_id``,
   ``remote_request_id``, ``remote_block_ids`` (the blocks of the computed tokens),
   ``remote_num_tokens``.
2. The proxy sends the same prompt, with those params, to the decode engine.
   ``get_num_new_matched_tokens`` answers: everything past the decode engine's own prefix hit
   loads asynchronously. The scheduler allocates the blocks without caching them
   (``delay_cache_blocks``) and parks the request in ``WAITING_FOR_REMOTE_KVS``;
   ``update_state_after_alloc`` notes the blocks to fill (the ones without a hash: the decode
   side's own hit is not pulled again).
3. The decode worker pulls the prefill blocks' K/V into those blocks and tells the prefill
   worker it is done; the prefill worker reports the request in ``finished_sending`` and its
   scheduler frees the blocks; the decode worker reports ``finished_recving``, and the decode
   scheduler caches the blocks and runs the request from its last prompt token on.

What NIXL does over the network, we do in one process: NIXL registers each engine's KV memory
with its transfer agent, swaps agent metadata over a side channel (a ZMQ handshake) and issues
one-sided RDMA READs from the prefill GPU's blocks into the decode GPU's blocks, then sends a
notification message to the prefill agent. Here a :class:`NixlAgentRegistry` stands for the
agents and the side channel (engine id -> that engine's worker half), the READ is a tensor copy
per layer, and the notification is a call on the prefill worker. The copy is done when the call
returns, so a load is reported finished in the step that started it. vLLM's lease on the
prefill blocks (``kv_lease_duration`` seconds, renewed by heartbeats) is counted here in the
prefill engine's steps (``kv_lease_steps``), so runs stay deterministic. Only one KV cache group
(full attention) is modelled; heterogeneous TP, host buffers, push mode and Mamba are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from kvcore.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from kvcore.request import RequestStatus

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


class NixlAgentRegistry:
    """The engines that can reach each other's K/V: engine id -> its worker half. It stands for
    NIXL's agents and side channel (handshake, memory registration, notifications)."""

    def __init__(self) -> None:
        self.workers: dict[str, "NixlConnectorWorker"] = {}

    def register(self, engine_id: str, worker: "NixlConnectorWorker") -> None:
        if engine_id in self.workers:
            raise ValueError(f"engine id {engine_id!r} is registered already")
        self.workers[engine_id] = worker

    def get(self, engine_id: str) -> "NixlConnectorWorker":
        try:
            return self.workers[engine_id]
        except KeyError:
            raise ValueError(f"no engine {engine_id!r} to pull K/V from") from None


class NixlConnectorScheduler:
    """The scheduler half. Invariant: a request's pull is ordered at most once (its
    ``do_remote_prefill`` is cleared once its blocks are allocated), and a prefill request whose
    blocks were kept is handed to the worker half exactly once (``reqs_to_send``)."""

    def __init__(self, engine_id: str, block_size: int, kv_lease_steps: int = 30) -> None:
        if kv_lease_steps < 1:
            raise ValueError("kv_lease_steps must be >= 1")
        self.engine_id = engine_id
        self.block_size = block_size
        self.kv_lease_steps = kv_lease_steps
        self._step = 0
        self._reqs_need_recv: dict[str, ReqMeta] = {}
        self._reqs_need_send: dict[str, int] = {}
        self._reqs_in_batch: set[str] = set()
        self._reqs_not_processed: set[str] = set()
        # The params each prefill request finished with, until the proxy takes them. vLLM
        # returns them in the request's output (EngineCoreOutput.kv_transfer_params); kvcore's
        # EngineCore makes no output objects, so the proxy (paged_kv_lab/disagg/) reads them here.
        self.kv_transfer_params_out: dict[str, dict[str, Any]] = {}

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        """A decode request pulls its whole prompt past the local hit, asynchronously."""
        params = getattr(request, "kv_transfer_params", None)
        if params is not None and params.get("do_remote_prefill"):
            count = request.num_prompt_tokens - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        params = getattr(request, "kv_transfer_params", None)
        if not params:
            return
        if params.get("do_remote_decode"):
            self._reqs_in_batch.add(request.request_id)
        if params.get("do_remote_prefill"):
            if all(p in params for p in REMOTE_PARAMS):
                # The blocks without a hash are the ones to fill; the local hit stays. A full
                # local hit pulls nothing but still tells the prefill side to let go.
                (group,) = blocks.blocks
                local = (
                    tuple(b.block_id for b in group if b.block_hash is None and not b.is_null)
                    if num_external_tokens > 0
                    else ()
                )
                self._reqs_need_recv[request.request_id] = ReqMeta(
                    local,
                    RemoteMeta(
                        params["remote_engine_id"],
                        params["remote_request_id"],
                        tuple(params["remote_block_ids"]),
                    ),
                    awaiting_kvs=num_external_tokens > 0,
                )
            params["do_remote_prefill"] = False

    def build_connector_meta(self, scheduler_output) -> NixlConnectorMetadata:
        self._step += 1
        meta = NixlConnectorMetadata(
            reqs_to_recv=self._reqs_need_recv,
            reqs_to_send=self._reqs_need_send,
            reqs_in_batch=self._reqs_in_batch,
            reqs_not_processed=self._reqs_not_processed,
            step=self._step,
        )
        self._reqs_need_recv, self._reqs_need_send = {}, {}
        self._reqs_in_batch, self._reqs_not_processed = set(), set()
        return meta

    def request_finished(
        self, request, block_ids: list[int]
    ) -> tuple[bool, Optional[dict[str, Any]]]:
        """A prefill request that finished normally keeps its blocks for the reader and returns
        the params that send the decode engine to them. Others free their blocks now."""
        params = getattr(request, "kv_transfer_params", None)
        if not params:
            return False, None
        if params.get("do_remote_prefill"):
            # Finished before its blocks were allocated (aborted): nothing to pull; vLLM still
            # notifies the prefill side so it frees its blocks.
            params["do_remote_prefill"] = False
            return False, None
        if not params.get("do_remote_decode"):
            return False, None
        if request.status not in (
            RequestStatus.FINISHED_LENGTH_CAPPED,
            RequestStatus.FINISHED_STOPPED,
        ):
            self._reqs_not_processed.add(request.request_id)
            return False, None
        delay_free_blocks = len(block_ids) > 0
        if delay_free_blocks:
            self._reqs_need_send[request.request_id] = self._step + 1 + self.kv_lease_steps
        out = dict(
            do_remote_prefill=True,
            do_remote_decode=False,
            remote_block_ids=list(block_ids),
            remote_engine_id=self.engine_id,
            remote_request_id=request.request_id,
            remote_num_tokens=request.num_computed_tokens if delay_free_blocks else 0,
        )
        self.kv_transfer_params_out[request.request_id] = out
        return delay_free_blocks, out


class NixlConnectorWorker:
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
            from kvcore.worker.block_copy import copy_blocks  # torch: the worker role only

            copy_blocks(remote.kv_caches, self.kv_caches, remote_ids, local)
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


class NixlConnector(KVConnectorBase_V1, SupportsHMA):
    """One class, two roles: each call goes to the half of the role it was built for. Both
    engines of a pair share one ``registry``; ``engine_id`` names this one."""

    def __init__(
        self,
        role: KVConnectorRole,
        engine_id: str,
        block_size: int,
        registry: Optional[NixlAgentRegistry] = None,
        kv_lease_steps: int = 30,
    ) -> None:
        super().__init__(role)
        self.connector_scheduler: Optional[NixlConnectorScheduler] = None
        self.connector_worker: Optional[NixlConnectorWorker] = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = NixlConnectorScheduler(engine_id, block_size, kv_lease_steps)
        else:
            if registry is None:
                raise ValueError("the worker half needs the registry of the engines it reaches")
            self.connector_worker = NixlConnectorWorker(engine_id, registry)

    # -- worker side --------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Any) -> None:
        if self.connector_worker is not None:
            self.connector_worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: Any = None, **kwargs: Any) -> None:
        if self.connector_worker is not None:
            md = self._get_connector_metadata()
            assert isinstance(md, NixlConnectorMetadata)
            self.connector_worker.start_load_kv(md)

    def wait_for_save(self) -> None:
        """Nothing to save: the reader pulls."""

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        if self.connector_worker is not None:
            return self.connector_worker.get_transfer_results(finished_req_ids)
        return KVConnectorTransferResults()

    def get_finished(self, finished_req_ids: set[str]):
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending or None, r.finished_recving or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self.connector_worker is not None:
            return self.connector_worker.get_block_ids_with_load_errors()
        return set()

    # -- scheduler side -----------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        assert self.connector_scheduler is not None
        return self.connector_scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        assert self.connector_scheduler is not None
        self.connector_scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        assert self.connector_scheduler is not None
        return self.connector_scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids: list[int]):
        assert self.connector_scheduler is not None
        return self.connector_scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids: tuple[list[int], ...]):
        if len(block_ids) != 1:
            raise ValueError("NixlConnector is modelled for one KV cache group")
        return self.request_finished(request, block_ids[0])
