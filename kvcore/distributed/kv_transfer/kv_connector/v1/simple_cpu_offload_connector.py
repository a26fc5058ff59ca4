"""SimpleCPUOffloadConnector: a CPU pool beside the GPU pool, found by block hash (vLLM:
distributed/kv_transfer/kv_connector/v1/simple_cpu_offload_connector.py).

One class, two roles: built with ``KVConnectorRole.SCHEDULER`` it holds the bookkeeping
(``SimpleCPUOffloadScheduler``: kvcore/simple_kv_offload/manager.py), with
``KVConnectorRole.WORKER`` the CPU tensors and the copies (``SimpleCPUOffloadWorker``:
kvcore/simple_kv_offload/worker.py, imported only in that role, so the scheduler stays free of
torch). vLLM reads the settings from ``kv_connector_extra_config``: ``num_cpu_blocks`` (or
``cpu_bytes_to_use``) and ``lazy_offload``; here the pool size is given in blocks.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

from kvcore.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from kvcore.kv_cache_interface import KVCacheConfig
from kvcore.simple_kv_offload.manager import SimpleCPUOffloadScheduler
from kvcore.simple_kv_offload.metadata import SimpleCPUOffloadMetadata


class SimpleCPUOffloadConnector(KVConnectorBase_V1, SupportsHMA):
    """CPU KV cache offloading: each call goes to the half of the role it was built for."""

    def __init__(
        self,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
        num_cpu_blocks: int,
        lazy_offload: bool = False,
        max_model_len: int = 1 << 30,
        max_num_batched_tokens: int = 2048,
        enable_kv_cache_events: bool = False,
    ) -> None:
        super().__init__(role)
        self.scheduler_manager: Optional[SimpleCPUOffloadScheduler] = None
        self.worker_handler = None
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler_manager = SimpleCPUOffloadScheduler(
                kv_cache_config,
                num_cpu_blocks,
                max_model_len,
                max_num_batched_tokens,
                lazy_offload=lazy_offload,
                enable_kv_cache_events=enable_kv_cache_events,
            )
        else:
            from kvcore.simple_kv_offload.worker import SimpleCPUOffloadWorker

            self.worker_handler = SimpleCPUOffloadWorker(num_cpu_blocks)

    # -- worker side --------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: Any) -> None:
        if self.worker_handler is not None:
            self.worker_handler.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.worker_handler is not None:
            assert isinstance(connector_metadata, SimpleCPUOffloadMetadata)
            self.worker_handler.bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        if self.worker_handler is not None:
            self.worker_handler.clear_connector_metadata()

    def start_load_kv(self, forward_context: Any = None, **kwargs: Any) -> None:
        if self.worker_handler is not None:
            self.worker_handler.start_load_kv()

    def wait_for_save(self) -> None:
        if self.worker_handler is not None:
            self.worker_handler.wait_for_save()

    def get_finished(
        self, finished_req_ids: set[str]
    ) -> tuple[Optional[set[str]], Optional[set[str]]]:
        if self.worker_handler is not None:
            return self.worker_handler.get_finished(finished_req_ids)
        return None, None

    def build_connector_worker_meta(self):
        if self.worker_handler is not None:
            return self.worker_handler.build_connector_worker_meta()
        return None

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self.worker_handler is not None:
            return self.worker_handler.get_block_ids_with_load_errors()
        return set()

    # -- scheduler side -----------------------------------------------------------------
    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        if self.scheduler_manager is not None:
            self.scheduler_manager.bind_gpu_block_pool(gpu_block_pool)

    def get_num_new_matched_tokens(
        self, request, num_computed_tokens: int
    ) -> tuple[Optional[int], bool]:
        if self.scheduler_manager is not None:
            return self.scheduler_manager.get_num_new_matched_tokens(request, num_computed_tokens)
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if self.scheduler_manager is not None:
            self.scheduler_manager.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        if self.scheduler_manager is not None:
            return self.scheduler_manager.build_connector_meta(scheduler_output)
        return SimpleCPUOffloadMetadata()

    def update_connector_output(self, connector_output) -> None:
        if self.scheduler_manager is not None:
            self.scheduler_manager.update_connector_output(connector_output)

    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, Optional[dict]]:
        if self.scheduler_manager is not None:
            return self.scheduler_manager.request_finished(request, block_ids)
        return False, None

    def request_finished_all_groups(
        self, request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, Optional[dict]]:
        if self.scheduler_manager is not None:
            return self.scheduler_manager.request_finished_all_groups(request, block_ids)
        return False, None

    def has_pending_push_work(self) -> bool:
        return self.scheduler_manager is not None and self.scheduler_manager.has_pending_stores()

    def take_events(self) -> Iterable[Any]:
        if self.scheduler_manager is not None:
            return self.scheduler_manager.take_events()
        return []
