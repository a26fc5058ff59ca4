"""The NIXL connector's scheduler half, pull mode (vLLM:
distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py). The flow: connector.py."""

from __future__ import annotations

from typing import Any, Optional

from kvcore.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    REMOTE_PARAMS,
    NixlConnectorMetadata,
    RemoteMeta,
    ReqMeta,
)
from kvcore.request import RequestStatus


class NixlPullConnectorScheduler:
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
