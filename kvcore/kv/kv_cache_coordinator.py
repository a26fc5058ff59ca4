"""KV cache coordinator: one single-type manager per KV cache group, one shared BlockPool.

A uniform model has one group; a model mixing full and sliding-window layers
has two (group 0 = full attention, group 1 = sliding window). Every request
has one block table per group, all drawn from the same free queue.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from kvcore.kv.block_pool import BlockPool
from kvcore.kv.free_queue import KVCacheBlock
from kvcore.kv.single_type_kv_cache_manager import (FullAttentionManager, SingleTypeKVCacheManager,
                                           SlidingWindowManager, SPARSE)


@dataclass(frozen=True)
class KVCacheGroupSpec:
    kind: str                          # "full" | "sliding"
    sliding_window: Optional[int] = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "sliding_window": self.sliding_window}


class KVCacheCoordinator:
    """Fans each call out to the groups in group order and sums what they need."""

    def __init__(self, groups: Sequence[KVCacheGroupSpec], block_pool: BlockPool, block_size: int,
                 enable_caching: bool, sliding_retention: str = SPARSE) -> None:
        if not groups:
            raise ValueError("at least one KV cache group is needed")
        self.block_pool = block_pool
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.groups = tuple(groups)
        self.single_type_managers: list[SingleTypeKVCacheManager] = []
        for gid, spec in enumerate(groups):
            if spec.kind == "full":
                mgr = FullAttentionManager(block_pool, block_size, gid, enable_caching)
            elif spec.kind == "sliding":
                mgr = SlidingWindowManager(block_pool, block_size, gid, enable_caching,
                                           spec.sliding_window, sliding_retention)
            else:
                raise ValueError(f"unknown KV cache group kind {spec.kind!r}")
            self.single_type_managers.append(mgr)

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
                                   total_computed_tokens: int) -> int:
        return sum(m.get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks[i],
                                                total_computed_tokens)
                   for i, m in enumerate(self.single_type_managers))

    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks,
                                     num_local_computed_tokens: int) -> None:
        for i, m in enumerate(self.single_type_managers):
            m.allocate_new_computed_blocks(request_id, new_computed_blocks[i], num_local_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers)

    def cache_blocks(self, request, num_tokens: int) -> None:
        for m in self.single_type_managers:
            m.cache_blocks(request, num_tokens)

    def free(self, request_id: str, reason: str = "") -> None:
        for m in self.single_type_managers:
            m.free(request_id, reason)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        for m in self.single_type_managers:
            m.remove_skipped_blocks(request_id, total_computed_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.single_type_managers)

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes],
                               max_cache_hit_length: int) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        n = len(self.single_type_managers)
        if not self.enable_caching:
            return tuple([] for _ in range(n)), 0
        if n == 1:
            m = self.single_type_managers[0]
            hit = m.find_longest_cache_hit(block_hashes, max_cache_hit_length, [0])[0]
            return (hit,), len(hit) * self.block_size
        return self._hybrid_hit(block_hashes, max_cache_hit_length)

    def _hybrid_hit(self, block_hashes, max_length):
        """Fixed point over the groups: each one accepts the candidate length or shortens it.

        Full attention scans first (its hit is downward closed, so later rounds just
        trim it); the sliding-window search is capped at the current length. A hit
        that holds in one group only is therefore no hit.
        """
        order = sorted(range(len(self.single_type_managers)),
                       key=lambda g: self.single_type_managers[g].kind != "full")
        hits: list[Optional[list[KVCacheBlock]]] = [None] * len(order)
        hit_length = max_length
        simple = len(order) == 2 and self.single_type_managers[order[0]].kind == "full"
        while True:
            curr = hit_length
            for g in order:
                m = self.single_type_managers[g]
                if m.kind == "full" and hits[g] is not None:
                    curr = (curr // self.block_size) * self.block_size
                    continue
                hits[g] = m.find_longest_cache_hit(block_hashes, curr, [g])[0]
                curr = len(hits[g]) * self.block_size
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break  # one full + one other group: the first round is already final
        num_blocks = hit_length // self.block_size
        for g in order:
            if self.single_type_managers[g].kind == "full" and hits[g] is not None:
                del hits[g][num_blocks:]
        return tuple(h if h is not None else [] for h in hits), hit_length
