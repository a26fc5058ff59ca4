"""NixlConnector: prefill on one engine, decode on another (vLLM:
distributed/kv_transfer/kv_connector/v1/nixl/connector.py, its pull mode).

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

from typing import TYPE_CHECKING, Any, Optional

from kvcore.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata
from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler import (
    NixlPullConnectorScheduler,
)

if TYPE_CHECKING:
    from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlAgentRegistry


class NixlPullConnector(KVConnectorBase_V1, SupportsHMA):
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
        self.connector_scheduler: Optional[NixlPullConnectorScheduler] = None
        self.connector_worker = None
        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler = NixlPullConnectorScheduler(
                engine_id, block_size, kv_lease_steps
            )
        else:
            if registry is None:
                raise ValueError("the worker half needs the registry of the engines it reaches")
            # torch: the worker role only, so the scheduler half stays free of it
            from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import (
                NixlPullConnectorWorker,
            )

            self.connector_worker = NixlPullConnectorWorker(engine_id, registry)

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


# vLLM's default NIXL connector is the pull one
NixlConnector = NixlPullConnector
