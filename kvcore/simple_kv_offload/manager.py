"""The scheduler's half of SimpleCPUOffloadConnector: a second, CPU-side block pool (vLLM:
v1/simple_kv_offload/manager.py).

The CPU pool is a whole ``BlockPool`` of its own, built by a KV cache coordinator over the GPU's
KV cache groups with ``num_cpu_blocks`` blocks: its own free queue (LRU), its own hash map, its own
lazy eviction. What it does, step by step:

- **store** (GPU -> CPU). Eager mode (the default): every full, hashed GPU block a request has
  *confirmed* computed (its tokens were computed in an earlier step) is copied once to a fresh CPU
  block, and a finished request's remaining blocks are flushed when it finishes. Lazy mode
  (``lazy_offload``): only the hashed blocks near the head of the GPU free queue, those the GPU
  pool will evict next, are copied, up to a target count per step. While a copy runs both blocks
  are pinned (ref_cnt + 1); when the worker reports it done, the CPU block gets the GPU block's
  hash and both are released: the CPU block joins its queue's tail as a cached block.
- **lookup**. After the GPU prefix cache stopped at ``num_computed_tokens``, the remaining block
  hashes are looked up in the CPU pool; the hit is pinned until the scheduler allocates.
- **load** (CPU -> GPU). The scheduler allocates GPU blocks for the hit as *external computed
  tokens*; the copies into them are asynchronous, so the request waits in
  ``WAITING_FOR_REMOTE_KVS`` for one step, then runs from the end of the hit.
- **KV events** of the CPU pool say ``medium="CPU"``.

What is not modelled: the disk backend, fine-grained hashes (hash block size = block size
here), boundary hand-offs of Mamba states, several workers, reset of the CPU cache, the stats
hooks. Sliding-window groups are refused by the engine (kvcore's offloading is full attention
only).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field, replace
from enum import Enum, auto
from typing import Any, Callable, Optional, TypeVar

from kvcore.core.block_pool import BlockPool
from kvcore.core.kv_cache_coordinator import KVCacheCoordinator, get_kv_cache_coordinator
from kvcore.core.kv_cache_observer import FREE_OFFLOAD, KVCacheObserver, call_for_request
from kvcore.core.kv_cache_utils import KVCacheBlock, get_block_hash, get_group_id
from kvcore.distributed.kv_events import (
    MEDIUM_CPU,
    BlockStored,
    KVCacheEvent,
)
from kvcore.distributed.kv_transfer.kv_connector.utils import yield_req_data
from kvcore.kv_cache_interface import (
    KVCacheConfig,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcore.simple_kv_offload.metadata import (
    INVALID_JOB_ID,
    SimpleCPUOffloadMetadata,
    SimpleCPUOffloadWorkerMetadata,
)
from kvcore.utils.math_utils import cdiv

_R = TypeVar("_R")


@dataclass
class BlockStoreMeta:
    """What a stored block's BlockStored event says about it, captured while the request is at
    hand (the copy completes later)."""

    token_ids: list[int]
    parent_block_hash: Optional[bytes]
    extra_keys: Optional[tuple]


@dataclass
class TransferMeta:
    """One copy job: ``gpu_block_ids[i]`` <-> ``cpu_block_ids[i]``."""

    gpu_block_ids: list[int]
    cpu_block_ids: list[int]
    block_meta: Optional[list[Optional[BlockStoreMeta]]] = None
    req_ids: tuple[str, ...] = ()


@dataclass
class LoadRequestState:
    request: Any
    transfer_meta: TransferMeta
    load_event: Optional[int] = None
    finished: bool = False


@dataclass
class StoreRequestState:
    """Eager mode: a request's block table as the scheduler outputs revealed it, and per group
    how many of its blocks were already stored or skipped."""

    request: Any
    block_ids: tuple[list[int], ...]
    num_stored_blocks: list[int]
    store_events: set[int] = field(default_factory=set)
    finished: bool = False


class _StoreAdmission(Enum):
    READY = auto()
    NULL_BLOCK = auto()
    NOT_HASHED = auto()
    IN_FLIGHT = auto()
    ALREADY_CACHED = auto()


class _CPUPoolEvictions(KVCacheObserver):
    """The CPU pool's metrics collector: tells the GPU pool's observer (the recorder, if any)
    when the CPU pool evicts a cached block, the one CPU-pool decision nobody else reports."""

    def __init__(self, manager: "SimpleCPUOffloadScheduler") -> None:
        self.manager = manager

    def on_block_evicted(self, block: KVCacheBlock) -> None:
        key = block.block_hash
        self.manager._emit(
            "cpu_evicted",
            None,
            block_ids=(block.block_id,),
            group=get_group_id(key),
            block_hash=get_block_hash(key).hex(),
        )


def _offload_scope(method: Callable[..., _R]) -> Callable[..., _R]:
    """Declares ``method`` a connector entry point: the GPU-pool calls it makes (pinning and
    releasing blocks around copies) are the offload's own, so the GPU pool's observer hears
    them in a scope for no request, group 0, reason "offload"."""

    @functools.wraps(method)
    def in_scope(self: "SimpleCPUOffloadScheduler", *args: Any, **kwargs: Any) -> _R:
        pool = self._gpu_block_pool
        observer = pool.observer if pool is not None else None
        return call_for_request(
            observer, None, 0, FREE_OFFLOAD, functools.partial(method, self, *args, **kwargs)
        )

    return in_scope


class SimpleCPUOffloadScheduler:
    """The CPU tier's bookkeeping on the scheduler side.

    Invariants: a CPU block is in the CPU free queue exactly when no copy uses it and no hit is
    pinned on it; a CPU block carries a hash only once the copy into it completed; a GPU block
    being copied (either way) holds one extra reference, so it cannot be reused mid-copy; each
    GPU block is in at most one store job at a time.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        num_cpu_blocks: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        lazy_offload: bool = False,
        enable_kv_cache_events: bool = False,
    ) -> None:
        if not isinstance(num_cpu_blocks, int) or num_cpu_blocks < 2:
            raise ValueError(
                f"num_cpu_blocks must be an integer >= 2 (block 0 is the CPU pool's null block); "
                f"got {num_cpu_blocks!r}"
            )
        if any(g.kind != "full" for g in kv_cache_config.kv_cache_groups):
            raise ValueError("CPU offloading here supports full-attention KV cache groups only")
        self.kv_cache_config = kv_cache_config
        self.enable_kv_cache_events = enable_kv_cache_events
        self.block_size = kv_cache_config.block_size
        self.cpu_kv_cache_config = replace(kv_cache_config, num_blocks=num_cpu_blocks)
        self.num_cpu_blocks = num_cpu_blocks
        self.kv_event_medium = MEDIUM_CPU
        self.cpu_coordinator: KVCacheCoordinator = get_kv_cache_coordinator(
            self.cpu_kv_cache_config,
            max_model_len,
            max_num_batched_tokens,
            True,
            enable_kv_cache_events=enable_kv_cache_events,
        )
        self.cpu_block_pool: BlockPool = self.cpu_coordinator.block_pool
        self.cpu_block_pool.medium = MEDIUM_CPU  # its BlockRemoved events name the CPU
        self.cpu_block_pool.metrics_collector = _CPUPoolEvictions(self)
        self.num_groups = len(self.cpu_kv_cache_config.kv_cache_groups)
        self._gpu_block_pool: Optional[BlockPool] = None

        self._reqs_to_load: dict[str, LoadRequestState] = {}
        self._load_event_to_reqs: dict[int, list[str]] = {}
        # request id -> (CPU hit blocks per group, hit tokens, local tokens it starts after),
        # pinned between get_num_new_matched_tokens and update_state_after_alloc
        self._pending_cpu_hits: dict[str, tuple[tuple[list[KVCacheBlock], ...], int, int]] = {}

        # Eager mode (vLLM 0.34): the local (GPU) hit a lookup found, by request: once the
        # request is allocated, the CPU copies of those blocks move to the CPU pool's MRU end
        self._pending_local_hits: dict[str, int] = {}

        self._lazy_mode = lazy_offload
        self._target_free = (
            self._estimate_lazy_target_blocks(kv_cache_config, max_num_batched_tokens)
            if lazy_offload
            else 0
        )
        self._store_event_to_blocks: dict[int, TransferMeta] = {}
        self._reqs_to_store: dict[str, StoreRequestState] = {}
        self._store_event_to_reqs: dict[int, list[str]] = {}
        self._in_flight_store_gpu_blocks: set[int] = set()
        self._pending_finished_stores: list[TransferMeta] = []

        self._load_event_counter = 0
        self._store_event_counter = 0
        self._expected_worker_count = 1
        self._store_event_pending_counts: dict[int, int] = {}

    @staticmethod
    def _estimate_lazy_target_blocks(
        kv_cache_config: KVCacheConfig, max_num_batched_tokens: int
    ) -> int:
        """GPU blocks lazy mode keeps stored (free or offloaded) per step: twice one step's
        worth of new blocks per group."""
        target = sum(
            cdiv(max_num_batched_tokens, g.kv_cache_spec.block_size)
            for g in kv_cache_config.kv_cache_groups
        )
        return 2 * target

    def bind_gpu_block_pool(self, gpu_block_pool: BlockPool) -> None:
        """The GPU pool, so that blocks being copied can be pinned there (the scheduler binds
        it once its KV cache manager exists)."""
        self._gpu_block_pool = gpu_block_pool

    def _emit(self, kind: str, request_id: Optional[str], **fields: Any) -> None:
        pool = self._gpu_block_pool
        observer = pool.observer if pool is not None else None
        if observer is not None:
            observer.on_decision(kind, request_id, **fields)

    # -- lookup ---------------------------------------------------------------------------
    def get_num_new_matched_tokens(
        self, request, num_computed_tokens: int
    ) -> tuple[Optional[int], bool]:
        """(tokens the CPU pool holds right after the GPU hit, True: they load asynchronously).

        The CPU hit continues the GPU hit block by block, and like it stops before the last
        token (whose logits are needed). Its blocks are pinned until update_state_after_alloc.
        """
        if stale := self._pending_cpu_hits.pop(request.request_id, None):
            self._free_pending_cpu_hit(stale)
        self._pending_local_hits.pop(request.request_id, None)
        if request.skip_reading_prefix_cache:
            return 0, False
        if num_computed_tokens and not self._lazy_mode:
            # refreshed at admission (a request waiting for blocks looks up every step)
            self._pending_local_hits[request.request_id] = num_computed_tokens
        if num_computed_tokens % self.block_size != 0:
            return 0, False  # copies are whole blocks
        remaining_hashes = request.block_hashes[num_computed_tokens // self.block_size :]
        if not remaining_hashes:
            return 0, False
        max_hit_len = request.num_tokens - 1 - num_computed_tokens
        if max_hit_len <= 0:
            return 0, False
        cpu_hit_blocks, hit_length, _ = self.cpu_coordinator.find_longest_cache_hit(
            remaining_hashes, max_hit_len
        )
        if hit_length > 0:
            pin = [b for group in cpu_hit_blocks for b in group if not b.is_null]
            self.cpu_block_pool.touch(pin)
            self._pending_cpu_hits[request.request_id] = (
                cpu_hit_blocks,
                hit_length,
                num_computed_tokens,
            )
            self._emit(
                "cpu_hit",
                request.request_id,
                block_ids=tuple(b.block_id for b in pin),
                num_tokens=hit_length,
                num_local_tokens=num_computed_tokens,
            )
            return hit_length, True
        return 0, False

    # -- load -----------------------------------------------------------------------------
    @_offload_scope
    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        """The scheduler allocated GPU blocks for the request: plan the load of the CPU hit's
        blocks into the GPU blocks that follow the local hit (both sides pinned until done)."""
        req_id = request.request_id
        block_ids_by_group = blocks.get_block_ids()
        num_groups = len(block_ids_by_group)
        if not self._lazy_mode and req_id not in self._reqs_to_store:
            self._reqs_to_store[req_id] = StoreRequestState(
                request=request,
                block_ids=tuple([] for _ in range(num_groups)),
                num_stored_blocks=[0] * num_groups,
            )
        if num_local_tokens := self._pending_local_hits.pop(req_id, None):
            # vLLM 0.34: the eager CPU pool holds what the GPU hit holds too, and eager stores
            # skip those blocks, so their CPU copies move to the MRU end here
            prefix_hit, _, _ = self.cpu_coordinator.find_longest_cache_hit(
                request.block_hashes, num_local_tokens
            )
            prefix_blocks = [b for group in prefix_hit for b in group if not b.is_null]
            self.cpu_block_pool.touch(prefix_blocks)
            self.cpu_block_pool.free_blocks(reversed(prefix_blocks))
        pending = self._pending_cpu_hits.pop(req_id, None)
        if num_external_tokens == 0:
            if pending is not None:
                self._free_pending_cpu_hit(pending)
            return
        if pending is None:
            return
        cpu_hit_blocks_full, _, num_computed_tokens = pending
        assert num_computed_tokens % self.block_size == 0
        gpu_block_ids: list[int] = []
        cpu_block_ids: list[int] = []
        cpu_blocks_to_touch: list[KVCacheBlock] = []
        for g in range(num_groups):
            # the scheduler may have taken fewer tokens than were found
            cpu_blocks_g = cpu_hit_blocks_full[g][: cdiv(num_external_tokens, self.block_size)]
            gpu_ext_start = num_computed_tokens // self.block_size
            for i, cpu_blk in enumerate(cpu_blocks_g):
                if cpu_blk.is_null:
                    continue
                gpu_block_ids.append(block_ids_by_group[g][gpu_ext_start + i])
                cpu_block_ids.append(cpu_blk.block_id)
                cpu_blocks_to_touch.append(cpu_blk)
        self.cpu_block_pool.touch(cpu_blocks_to_touch)
        self._free_pending_cpu_hit(pending)
        assert self._gpu_block_pool is not None
        self._gpu_block_pool.touch([self._gpu_block_pool.blocks[b] for b in gpu_block_ids])
        assert req_id not in self._reqs_to_load
        self._reqs_to_load[req_id] = LoadRequestState(
            request=request, transfer_meta=TransferMeta(gpu_block_ids, cpu_block_ids)
        )
        self._emit(
            "cpu_load",
            req_id,
            block_ids=tuple(gpu_block_ids),
            cpu_block_ids=tuple(cpu_block_ids),
            num_tokens=num_external_tokens,
        )

    # -- the step's jobs ----------------------------------------------------------------------
    @_offload_scope
    def build_connector_meta(self, scheduler_output) -> SimpleCPUOffloadMetadata:
        """This step's store job (newly confirmed blocks, plus the flushes of requests that
        finished) and load job (every planned load not yet sent)."""
        store_event = INVALID_JOB_ID
        store_gpu, store_cpu, store_req_ids, store_meta = self.prepare_store_specs(scheduler_output)
        for transfer in self._pending_finished_stores:
            store_gpu.extend(transfer.gpu_block_ids)
            store_cpu.extend(transfer.cpu_block_ids)
            store_meta.extend(transfer.block_meta or [None] * len(transfer.gpu_block_ids))
            store_req_ids.extend(r for r in transfer.req_ids if r not in store_req_ids)
        self._pending_finished_stores.clear()
        if store_gpu:
            store_event = self._store_event_counter
            self._store_event_counter += 1
            self._store_event_to_blocks[store_event] = TransferMeta(
                store_gpu, store_cpu, store_meta, tuple(store_req_ids)
            )
            if not self._lazy_mode and store_req_ids:
                self._store_event_to_reqs[store_event] = list(store_req_ids)
                for req_id in store_req_ids:
                    state = self._reqs_to_store.get(req_id)
                    if state is not None:
                        state.store_events.add(store_event)

        load_event = INVALID_JOB_ID
        load_gpu: list[int] = []
        load_cpu: list[int] = []
        load_req_ids: list[str] = []
        for req_id, load_state in self._reqs_to_load.items():
            if load_state.load_event is not None:
                continue
            load_gpu.extend(load_state.transfer_meta.gpu_block_ids)
            load_cpu.extend(load_state.transfer_meta.cpu_block_ids)
            load_req_ids.append(req_id)
        if load_req_ids:
            load_event = self._load_event_counter
            self._load_event_counter += 1
            for req_id in load_req_ids:
                self._reqs_to_load[req_id].load_event = load_event
            self._load_event_to_reqs[load_event] = load_req_ids

        return SimpleCPUOffloadMetadata(
            load_event=load_event,
            load_gpu_blocks=load_gpu,
            load_cpu_blocks=load_cpu,
            load_event_to_reqs={e: list(r) for e, r in self._load_event_to_reqs.items()},
            store_event=store_event,
            store_gpu_blocks=store_gpu,
            store_cpu_blocks=store_cpu,
            need_flush=bool(scheduler_output.preempted_req_ids),
        )

    def prepare_store_specs(
        self, scheduler_output
    ) -> tuple[list[int], list[int], list[str], list[Optional[BlockStoreMeta]]]:
        """(GPU blocks, their CPU destinations, requests served, event metadata) to store."""
        if self._lazy_mode:
            return self._prepare_lazy_store_specs()
        return self._prepare_eager_store_specs(scheduler_output)

    def _prepare_lazy_store_specs(self):
        """Walk the GPU free queue from where the last walk stopped: the hashed blocks the CPU
        pool lacks are stored, until ``_target_free`` queue blocks were passed or the CPU pool
        has no more free blocks."""
        gpu_pool = self._gpu_block_pool
        if gpu_pool is None or self._target_free <= 0:
            return [], [], [], []
        cpu_pool = self.cpu_block_pool
        num_cpu_free = cpu_pool.get_num_free_blocks()
        gpu_ids: list[int] = []
        # vLLM 0.34: from the queue's head every time (0.33 went on from a cursor)
        for covered, node in enumerate(gpu_pool.free_block_queue.iter_blocks_after(None)):
            if covered >= self._target_free or len(gpu_ids) >= num_cpu_free:
                break
            if (
                node.block_hash is not None
                and not node.is_null
                and cpu_pool.cached_block_hash_to_block.get_one_block(node.block_hash) is None
            ):
                gpu_ids.append(node.block_id)
        if not gpu_ids:
            return [], [], [], []
        cpu_ids = [b.block_id for b in cpu_pool.get_new_blocks(len(gpu_ids))]
        gpu_pool.touch([gpu_pool.blocks[b] for b in gpu_ids])
        return gpu_ids, cpu_ids, [], [None] * len(gpu_ids)

    def _prepare_eager_store_specs(self, scheduler_output):
        """For each request of the step, its blocks confirmed computed since the last store
        (computed in an earlier step: their K/V is in the GPU pool by now)."""
        merged_gpu: list[int] = []
        merged_cpu: list[int] = []
        req_ids: list[str] = []
        merged_meta: list[Optional[BlockStoreMeta]] = []
        gpu_pool = self._gpu_block_pool
        if gpu_pool is None:
            return merged_gpu, merged_cpu, req_ids, merged_meta
        for req_id in scheduler_output.preempted_req_ids or ():
            # its blocks were freed; it comes back with a whole new table
            state = self._reqs_to_store.get(req_id)
            if state is not None:
                state.block_ids = tuple([] for _ in range(self.num_groups))
                state.num_stored_blocks = [0] * self.num_groups
        for req_id, block_id_groups, is_full_table in yield_req_data(scheduler_output):
            state = self._reqs_to_store.get(req_id)
            if state is None or state.finished:
                continue
            if is_full_table:
                state.block_ids = tuple([] for _ in range(self.num_groups))
            if block_id_groups:
                for g in range(min(self.num_groups, len(block_id_groups))):
                    if block_id_groups[g] is not None:
                        state.block_ids[g].extend(block_id_groups[g])
            if scheduler_output.num_scheduled_tokens.get(req_id, 0) == 0:
                continue
            gpu_ids, advanced, meta = self._select_eager_blocks_to_store(state, state.block_ids)
            if gpu_ids:
                cpu_ids = [b.block_id for b in self.cpu_block_pool.get_new_blocks(len(gpu_ids))]
                req_ids.append(req_id)
                merged_gpu.extend(gpu_ids)
                merged_cpu.extend(cpu_ids)
                merged_meta.extend(meta)
                self._in_flight_store_gpu_blocks.update(gpu_ids)
                gpu_pool.touch([gpu_pool.blocks[b] for b in gpu_ids])
            for g in range(self.num_groups):
                state.num_stored_blocks[g] += advanced[g]
        return merged_gpu, merged_cpu, list(dict.fromkeys(req_ids)), merged_meta

    def _select_eager_blocks_to_store(self, state: StoreRequestState, block_ids_by_group):
        """(GPU blocks to store, per group how far the cursor moves, their event metadata):
        the request's full blocks past its cursor whose tokens are computed, that are hashed,
        not being stored and not in the CPU pool yet; at most as many as the CPU pool has free
        blocks (a store may evict the CPU pool's least recently used cached blocks)."""
        assert self._gpu_block_pool is not None
        gpu_block_ids: list[int] = []
        advanced = [0] * self.num_groups
        meta: list[Optional[BlockStoreMeta]] = []
        request = state.request
        confirmed_tokens = request.num_computed_tokens
        num_free = self.cpu_block_pool.get_num_free_blocks()
        bs = self.block_size
        for g, group_gpu_ids in enumerate(block_ids_by_group):
            if len(gpu_block_ids) >= num_free:
                break
            ready = min(len(group_gpu_ids), confirmed_tokens // bs)
            start = state.num_stored_blocks[g]
            for i, gpu_block_id in enumerate(group_gpu_ids[start:ready], start=start):
                gpu_block = self._gpu_block_pool.blocks[gpu_block_id]
                if self._classify_store_candidate(gpu_block) is not _StoreAdmission.READY:
                    advanced[g] += 1
                    continue
                if len(gpu_block_ids) >= num_free:
                    break
                gpu_block_ids.append(gpu_block_id)
                advanced[g] += 1
                meta.append(
                    BlockStoreMeta(
                        token_ids=list(request.all_token_ids[i * bs : (i + 1) * bs]),
                        parent_block_hash=request.block_hashes[i - 1] if i else None,
                        extra_keys=request.extra_keys_for_block(i),
                    )
                )
        return gpu_block_ids, advanced, meta

    def _classify_store_candidate(self, gpu_block: KVCacheBlock) -> _StoreAdmission:
        if gpu_block.is_null:
            return _StoreAdmission.NULL_BLOCK
        if gpu_block.block_hash is None:
            return _StoreAdmission.NOT_HASHED
        if gpu_block.block_id in self._in_flight_store_gpu_blocks:
            return _StoreAdmission.IN_FLIGHT
        if self.cpu_block_pool.cached_block_hash_to_block.get_one_block(gpu_block.block_hash):
            return _StoreAdmission.ALREADY_CACHED
        return _StoreAdmission.READY

    # -- the worker's report ------------------------------------------------------------------
    @_offload_scope
    def update_connector_output(self, connector_output) -> None:
        """Finished loads release their pins; finished stores register their CPU blocks."""
        finished = connector_output.finished_recving or ()
        # vLLM walks the reported set as it comes (its order follows the process's hash seed);
        # the order the loads were planned in gives the same pins back, in a repeatable order.
        for req_id in [r for r in list(self._reqs_to_load) if r in finished]:
            self._cleanup_load_request(req_id)
        meta = connector_output.kv_connector_worker_meta
        if not isinstance(meta, SimpleCPUOffloadWorkerMetadata):
            return
        for event_idx, count in meta.completed_store_events.items():
            total = self._store_event_pending_counts.get(event_idx, 0) + count
            if total >= self._expected_worker_count:
                self._store_event_pending_counts.pop(event_idx, None)
                self._process_store_event(event_idx)
            else:
                self._store_event_pending_counts[event_idx] = total

    def _process_store_event(self, event_idx: int) -> None:
        transfer = self._store_event_to_blocks.pop(event_idx, None)
        if transfer is None:
            return
        if not self._lazy_mode:
            self._in_flight_store_gpu_blocks.difference_update(transfer.gpu_block_ids)
        self._process_store_completion(transfer)
        if not self._lazy_mode:
            for req_id in self._store_event_to_reqs.pop(event_idx, []):
                state = self._reqs_to_store.get(req_id)
                if state is None:
                    continue
                state.store_events.discard(event_idx)
                if state.finished and not state.store_events:
                    self._cleanup_store_request(req_id)

    def _process_store_completion(self, transfer: TransferMeta) -> None:
        """The copies are in the CPU pool: each CPU block takes its GPU block's hash (now a CPU
        hit can find it), a BlockStored event with medium CPU goes out, and both sides are
        released (the CPU blocks join their queue's tail, cached)."""
        gpu_pool = self._gpu_block_pool
        assert gpu_pool is not None
        cpu_pool = self.cpu_block_pool
        cpu_blocks = [cpu_pool.blocks[b] for b in transfer.cpu_block_ids]
        metas = transfer.block_meta or [None] * len(cpu_blocks)
        hashes = []
        groups = self.cpu_kv_cache_config.kv_cache_groups
        for gpu_block_id, cpu_block, meta in zip(transfer.gpu_block_ids, cpu_blocks, metas):
            gpu_block = gpu_pool.blocks[gpu_block_id]
            key = gpu_block.block_hash
            assert key is not None, "a stored GPU block keeps its hash while pinned"
            cpu_block.block_hash = key
            cpu_block.block_hash_num_tokens = gpu_block.block_hash_num_tokens
            cpu_pool.cached_block_hash_to_block.insert(key, cpu_block)
            hashes.append(get_block_hash(key).hex())
            if self.enable_kv_cache_events:
                spec = groups[get_group_id(key)].kv_cache_spec
                spec_kind = get_kv_cache_spec_kind(spec)
                spec_window = get_kv_cache_spec_sliding_window(spec)
                cpu_pool.kv_event_queue.append(
                    BlockStored(
                        block_hashes=[gpu_pool._external(get_block_hash(key))],
                        parent_block_hash=None
                        if meta is None or meta.parent_block_hash is None
                        else gpu_pool._external(meta.parent_block_hash),
                        token_ids=list(meta.token_ids) if meta is not None else [],
                        block_size=self.block_size,
                        lora_id=None,
                        medium=self.kv_event_medium,
                        lora_name=None,
                        extra_keys=None
                        if meta is None or meta.extra_keys is None
                        else [tuple(k[1:] if k[0] == "mm" else k[1] for k in meta.extra_keys)],
                        group_idx=get_group_id(key),
                        kv_cache_spec_kind=spec_kind,
                        kv_cache_spec_sliding_window=spec_window,
                    )
                )
        self._emit(
            "cpu_stored",
            None,
            block_ids=tuple(transfer.gpu_block_ids),
            cpu_block_ids=tuple(transfer.cpu_block_ids),
            block_hashes=tuple(hashes),
            mode="lazy" if self._lazy_mode else "eager",
            req_ids=tuple(transfer.req_ids),
        )
        cpu_pool.free_blocks(cpu_blocks)
        # vLLM 0.34: lazy stores came from the GPU queue's eviction end; they go back there
        gpu_pool.free_blocks(
            (gpu_pool.blocks[b] for b in transfer.gpu_block_ids), evict_first=self._lazy_mode
        )

    def gpu_block_refs(self) -> dict[int, int]:
        """GPU block id -> the references this manager holds on it (copies in flight or
        queued), for whoever checks that ref counts add up."""
        refs: dict[int, int] = {}
        transfers = [
            *self._store_event_to_blocks.values(),
            *self._pending_finished_stores,
            *(s.transfer_meta for s in self._reqs_to_load.values()),
        ]
        for t in transfers:
            for b in t.gpu_block_ids:
                refs[b] = refs.get(b, 0) + 1
        return refs

    def has_pending_stores(self) -> bool:
        return bool(self._pending_finished_stores or self._store_event_to_blocks)

    # -- a request finishes -------------------------------------------------------------------
    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, Optional[dict]]:
        """Drop the request's pins and plans; (False, None): the scheduler frees its blocks now
        (blocks still being copied are protected by their extra reference)."""
        req_id = request.request_id
        pending = self._pending_cpu_hits.pop(req_id, None)
        if pending is not None:
            self._free_pending_cpu_hit(pending)
        self._pending_local_hits.pop(req_id, None)
        load_state = self._reqs_to_load.get(req_id)
        if load_state is not None:
            if load_state.load_event is not None:
                load_state.finished = True  # in flight: cleaned up when it completes
            else:
                self._cleanup_load_request(req_id)
        if not self._lazy_mode:
            store_state = self._reqs_to_store.get(req_id)
            if store_state is not None:
                if store_state.store_events:
                    store_state.finished = True
                else:
                    self._cleanup_store_request(req_id)
        return False, None

    @_offload_scope
    def request_finished_all_groups(
        self, request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, Optional[dict]]:
        self._queue_finished_eager_store(request, block_ids)
        return self.request_finished(request, block_ids=[])

    def _queue_finished_eager_store(self, request, block_ids: tuple[list[int], ...]) -> None:
        """Eager mode: the blocks a finishing request computed in its last steps were never
        confirmed by a later step; queue them for the next store job and pin them, so freeing
        the request does not put them in the GPU free queue before the copy is done."""
        state = self._reqs_to_store.get(request.request_id)
        gpu_pool = self._gpu_block_pool
        if state is None or gpu_pool is None:
            return
        gpu_ids, _, block_meta = self._select_eager_blocks_to_store(state, block_ids)
        if not gpu_ids:
            return
        cpu_blocks = self.cpu_block_pool.get_new_blocks(len(gpu_ids))
        self._pending_finished_stores.append(
            TransferMeta(
                gpu_ids, [b.block_id for b in cpu_blocks], block_meta, (request.request_id,)
            )
        )
        self._in_flight_store_gpu_blocks.update(gpu_ids)
        gpu_pool.touch([gpu_pool.blocks[b] for b in gpu_ids])

    def _free_pending_cpu_hit(self, pending) -> None:
        cpu_hit_blocks, _, _ = pending
        blocks = [b for group in cpu_hit_blocks for b in group if not b.is_null]
        if blocks:
            self.cpu_block_pool.free_blocks(blocks)

    def _cleanup_load_request(self, req_id: str) -> int:
        """Release a load's pins on both sides; the number of blocks it loaded (0 if it was
        never sent to the worker)."""
        state = self._reqs_to_load.pop(req_id, None)
        if state is None:
            return 0
        if state.load_event is not None:
            reqs = self._load_event_to_reqs.get(state.load_event)
            if reqs is not None:
                with contextlib.suppress(ValueError):
                    reqs.remove(req_id)
                if not reqs:
                    self._load_event_to_reqs.pop(state.load_event, None)
        meta = state.transfer_meta
        self.cpu_block_pool.free_blocks(self.cpu_block_pool.blocks[b] for b in meta.cpu_block_ids)
        assert self._gpu_block_pool is not None
        self._gpu_block_pool.free_blocks(self._gpu_block_pool.blocks[b] for b in meta.gpu_block_ids)
        return 0 if state.load_event is None else len(meta.gpu_block_ids)

    def _cleanup_store_request(self, req_id: str) -> None:
        state = self._reqs_to_store.pop(req_id, None)
        if state is None:
            return
        for event_idx in list(state.store_events):
            reqs = self._store_event_to_reqs.get(event_idx)
            if reqs is not None:
                with contextlib.suppress(ValueError):
                    reqs.remove(req_id)
                if not reqs:
                    self._store_event_to_reqs.pop(event_idx, None)
        state.store_events.clear()

    def take_events(self) -> list[KVCacheEvent]:
        """The CPU pool's KV events since the last call (medium "CPU")."""
        return self.cpu_block_pool.take_events()
