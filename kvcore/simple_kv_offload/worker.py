"""The worker's half of SimpleCPUOffloadConnector: real copies between the GPU KV pool and a CPU
tensor pool (vLLM: v1/simple_kv_offload/worker.py).

The CPU pool mirrors the model runner's KV tensors: per decoder layer one tensor of
``[num_cpu_blocks, 2 (K, V), num_kv_heads, block_size, head_dim]`` on the CPU. A store copies
whole blocks ``gpu[store_gpu_blocks[i]] -> cpu[store_cpu_blocks[i]]`` in every layer, a load the
other way. vLLM issues them on side CUDA streams and polls events; here each copy is done when
the call returns (the copies are synchronous), so every job is reported finished in the step that
issued it. With no KV tensors registered (the engine without a model) the jobs are only
reported, which is how vLLM's own tests drive the scheduler's half with a fake worker.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from kvcore.simple_kv_offload.metadata import (
    SimpleCPUOffloadMetadata,
    SimpleCPUOffloadWorkerMetadata,
)


class SimpleCPUOffloadWorker:
    """Owns the CPU tensor pool. Invariant: after ``wait_for_save`` / ``start_load_kv`` of a
    step, the destination blocks hold exactly the source blocks' K/V in every layer."""

    def __init__(self, num_cpu_blocks: int) -> None:
        self.num_cpu_blocks = int(num_cpu_blocks)
        self.gpu_kv_caches: Optional[list[torch.Tensor]] = None
        self.cpu_kv_caches: Optional[list[torch.Tensor]] = None
        self._connector_metadata: Optional[SimpleCPUOffloadMetadata] = None
        self._pending_load_event_indices: set[int] = set()
        self._pending_store_event_indices: set[int] = set()
        self._completed_store_events: dict[int, int] = {}
        self.num_blocks_stored = 0  # blocks copied GPU -> CPU so far
        self.num_blocks_loaded = 0  # blocks copied CPU -> GPU so far
        # Ours, for teaching (engine.cpu_offload.fail_loads): the first load job serving one of
        # these requests fails; its GPU blocks stay as they were and are reported invalid.
        self.fail_load_req_ids: set[str] = set()
        self._invalid_block_ids: set[int] = set()

    def register_kv_caches(self, kv_caches: Optional[Sequence[torch.Tensor]]) -> None:
        """The model runner's per-layer KV tensors (``[num_blocks, ...]``): a zeroed CPU tensor
        of the same layout, ``num_cpu_blocks`` long, is made beside each (None: no model, the
        jobs are only reported)."""
        if kv_caches is None:
            return
        self.gpu_kv_caches = list(kv_caches)
        self.cpu_kv_caches = [
            torch.zeros((self.num_cpu_blocks, *t.shape[1:]), dtype=t.dtype, device="cpu")
            for t in self.gpu_kv_caches
        ]

    def bind_connector_metadata(self, metadata: SimpleCPUOffloadMetadata) -> None:
        self._connector_metadata = metadata
        if metadata.load_event >= 0:
            self._pending_load_event_indices.add(metadata.load_event)
        if metadata.store_event >= 0:
            self._pending_store_event_indices.add(metadata.store_event)

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _copy(self, src_blocks: list[int], dst_blocks: list[int], is_store: bool) -> None:
        if self.gpu_kv_caches is None or not src_blocks:
            return
        with torch.inference_mode():
            for gpu, cpu in zip(self.gpu_kv_caches, self.cpu_kv_caches):
                src_t, dst_t = (gpu, cpu) if is_store else (cpu, gpu)
                src = torch.tensor(src_blocks, dtype=torch.long, device=src_t.device)
                dst = torch.tensor(dst_blocks, dtype=torch.long, device=dst_t.device)
                dst_t.index_copy_(0, dst, src_t.index_select(0, src).to(dst_t.device))

    def start_load_kv(self) -> None:
        """CPU -> GPU for this step's load job (not copied if the job is one made to fail)."""
        md = self._connector_metadata
        if md is not None and md.load_cpu_blocks:
            served = md.load_event_to_reqs.get(md.load_event, ())
            failing = self.fail_load_req_ids.intersection(served)
            if failing:
                self.fail_load_req_ids -= failing
                self._invalid_block_ids.update(md.load_gpu_blocks)
                return
            self._copy(md.load_cpu_blocks, md.load_gpu_blocks, is_store=False)
            self.num_blocks_loaded += len(md.load_cpu_blocks)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """The GPU blocks of the failed load jobs since the last call."""
        invalid, self._invalid_block_ids = self._invalid_block_ids, set()
        return invalid

    def wait_for_save(self) -> None:
        """GPU -> CPU for this step's store job (after the forward: the blocks are written)."""
        md = self._connector_metadata
        if md is not None and md.store_gpu_blocks:
            self._copy(md.store_gpu_blocks, md.store_cpu_blocks, is_store=True)
            self.num_blocks_stored += len(md.store_gpu_blocks)

    def get_finished(
        self, finished_req_ids: set[str]
    ) -> tuple[Optional[set[str]], Optional[set[str]]]:
        """(None, the requests whose loads are done): every job issued so far is done."""
        md = self._connector_metadata
        finished_recving: set[str] = set()
        for j in sorted(self._pending_load_event_indices):
            req_ids = md.load_event_to_reqs.get(j) if md is not None else None
            if req_ids:
                finished_recving.update(req_ids)
        self._pending_load_event_indices.clear()
        for j in sorted(self._pending_store_event_indices):
            self._completed_store_events[j] = 1
        self._pending_store_event_indices.clear()
        return None, finished_recving or None

    def build_connector_worker_meta(self) -> Optional[SimpleCPUOffloadWorkerMetadata]:
        if not self._completed_store_events:
            return None
        meta = SimpleCPUOffloadWorkerMetadata(completed_store_events=self._completed_store_events)
        self._completed_store_events = {}
        return meta
