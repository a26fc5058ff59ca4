"""KVCacheManager: the scheduler's single door to the paged cache (vLLM v1: kv_cache_manager)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from kvcore import events
from kvcore.kv.block_pool import FREE_ORDER_V033, BlockPool
from kvcore.kv.kv_cache_coordinator import KVCacheCoordinator, KVCacheGroupSpec
from kvcore.kv.free_queue import KVCacheBlock
from kvcore.kv.single_type_kv_cache_manager import SPARSE


@dataclass
class KVCacheBlocks:
    """Blocks per KV cache group: ``blocks[g][i]`` is group g's i-th block."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)


@dataclass
class PrefixCacheStats:
    """Token counts of prefix-cache lookups since the last reset."""

    requests: int = 0
    queries: int = 0
    hits: int = 0

    def record(self, num_tokens: int, num_hits: int) -> None:
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def to_dict(self) -> dict:
        return {"requests": self.requests, "queries": self.queries, "hits": self.hits,
                "hit_rate": self.hit_rate}


class KVCacheManager:
    def __init__(self, num_gpu_blocks: int, block_size: int,
                 groups: Sequence[KVCacheGroupSpec] = (KVCacheGroupSpec("full"),),
                 enable_caching: bool = True, max_model_len: int = 1 << 30,
                 free_order: str = FREE_ORDER_V033, sliding_retention: str = SPARSE,
                 recorder: Optional[events.Recorder] = None) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1; got {block_size!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.recorder = recorder
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, block_size, free_order, recorder)
        self.coordinator = KVCacheCoordinator(groups, self.block_pool, block_size, enable_caching,
                                              sliding_retention)
        self.num_kv_cache_groups = len(groups)
        self.prefix_cache_stats = PrefixCacheStats()
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in groups))

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def _for(self, request_id: Optional[str]) -> None:
        if self.recorder is not None:
            self.recorder.at(request_id)

    def get_computed_blocks(self, request) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix of the request, in full blocks.

        The hit stops at num_tokens - 1: the last token is always computed, because
        its logits are needed to sample the next one.
        """
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0
        self._for(request.request_id)
        max_hit = request.num_tokens - 1
        blocks, num_tokens = self.coordinator.find_longest_cache_hit(request.block_hashes, max_hit)
        self.prefix_cache_stats.record(request.num_tokens, num_tokens)
        if self.recorder is not None:
            if num_tokens:
                self.recorder.emit(events.CACHE_HIT, [b.block_id for g in blocks for b in g if not b.is_null],
                                   num_tokens=num_tokens, num_blocks=num_tokens // self.block_size,
                                   block_ids_per_group=[[b.block_id for b in g] for g in blocks],
                                   preempted_before=request.num_preemptions > 0)
            else:
                self.recorder.emit(events.CACHE_MISS, num_tokens=request.num_tokens,
                                   num_full_blocks=len(request.block_hashes))
        if not any(blocks):
            return self.empty_kv_cache_blocks, num_tokens
        return KVCacheBlocks(blocks), num_tokens

    def allocate_slots(self, request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None,
                       num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False) -> Optional[KVCacheBlocks]:
        """Give the request slots for ``num_new_tokens`` more tokens; None if they do not fit.

        Order, as in vLLM: (1) with ``full_sequence_must_fit`` refuse unless the whole
        request fits; (2) free blocks that left the sliding window — even if the call
        then fails; (3) capacity check, counting hit blocks that touching will pull out
        of the free queue; (4) touch the hits; (5) allocate; (6) cache the full blocks
        for min(computed + new, num_tokens) tokens — before the forward pass fills them.
        A None return leaves tables and ref counts as they were (apart from step 2).
        """
        if num_new_tokens <= 0:
            raise ValueError("num_new_tokens must be greater than 0")
        self._for(request.request_id)
        hits = (new_computed_blocks or self.empty_kv_cache_blocks).blocks
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed, self.max_model_len)

        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            need = self.coordinator.get_num_blocks_to_allocate(request.request_id, full, hits, total_computed)
            if need > self.block_pool.get_num_free_blocks():
                return None

        num_tokens_need_slot = min(total_computed + num_new_tokens + num_lookahead_tokens,
                                   self.max_model_len)
        self.coordinator.remove_skipped_blocks(request.request_id, total_computed)
        self._for(request.request_id)
        need = self.coordinator.get_num_blocks_to_allocate(request.request_id, num_tokens_need_slot,
                                                           hits, num_local_computed)
        if need > self.block_pool.get_num_free_blocks():
            return None

        if hits is not self.empty_kv_cache_blocks.blocks:
            self.coordinator.allocate_new_computed_blocks(request.request_id, hits, num_local_computed)
        new_blocks = self.coordinator.allocate_new_blocks(request.request_id, num_tokens_need_slot)
        if self.enable_caching:
            self.coordinator.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(new_blocks)

    def free(self, request, reason: str = "finished") -> None:
        """Free every group's table in reverse order (group 0 first)."""
        self._for(request.request_id)
        self.coordinator.free(request.request_id, reason)

    def evict_blocks(self, block_ids) -> None:
        self._for(None)
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        self._for(None)
        ok = self.block_pool.reset_prefix_cache()
        if ok:
            self.prefix_cache_stats = PrefixCacheStats()
        return ok

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def take_events(self) -> list:
        return self.block_pool.take_events()
