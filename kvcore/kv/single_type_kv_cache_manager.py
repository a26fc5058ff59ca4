"""Per-attention-type block bookkeeping (vLLM v1: single_type_kv_cache_manager)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Optional, Sequence

from kvcore import events
from kvcore.kv.block_pool import BlockPool
from kvcore.kv.free_queue import KVCacheBlock

SPARSE = "sparse"   # v0.33 sliding-window retention: hash only what a resend of the prompt can hit
DENSE = "dense"     # older releases: hash every full block
RETENTIONS = (SPARSE, DENSE)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SingleTypeKVCacheManager(ABC):
    """Block tables of one KV cache group.

    Invariant: ``req_to_blocks[r][i]`` is the physical block holding logical
    block i of request r (the null block where the tokens were skipped), and
    ``num_cached_block[r]`` counts the leading blocks already offered to the
    prefix cache. Only running requests appear here.
    """

    kind = "full"

    def __init__(self, block_pool: BlockPool, block_size: int, kv_cache_group_id: int,
                 enable_caching: bool) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.kv_cache_group_id = kv_cache_group_id
        self.enable_caching = enable_caching
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block

    def _enter(self) -> None:
        rec = self.block_pool.recorder
        if rec is not None:
            rec.group = self.kv_cache_group_id

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int,
                                   new_computed_blocks: Sequence[KVCacheBlock],
                                   total_computed_tokens: int) -> int:
        """Blocks this call would take from the free queue, hits sitting in the queue included."""
        num_required = cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            assert not new_computed_blocks
            return max(num_required - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local = len(new_computed_blocks) + num_req_blocks
        num_new = max(num_required - max(num_skipped_blocks, num_local), 0)
        skip_hits = max(0, num_skipped_blocks - num_req_blocks)
        evictable = sum(1 for b in new_computed_blocks[skip_hits:] if b.ref_cnt == 0 and not b.is_null)
        return num_new + evictable

    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock],
                                     num_local_computed_tokens: int) -> None:
        """Take the prefix-cache hits into the table (touching them); skipped ones become null."""
        if request_id in self.num_cached_block:
            assert not new_computed_blocks
            return
        self._enter()
        req_blocks = self.req_to_blocks[request_id]
        assert not req_blocks
        num_skipped_blocks = self.get_num_skipped_tokens(num_local_computed_tokens) // self.block_size
        hits = list(new_computed_blocks[num_skipped_blocks:])
        if self.enable_caching and hits:
            self.block_pool.touch(hits)
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(hits)
        self.num_cached_block[request_id] = len(req_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        req_blocks = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return []
        self._enter()
        new_blocks = self.block_pool.get_new_blocks(num_new)
        req_blocks.extend(new_blocks)
        return new_blocks

    def _retained(self, request) -> Optional[range]:
        return None

    def cache_blocks(self, request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self._enter()
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id], num_cached,
                                          num_full, self.block_size, self.kv_cache_group_id,
                                          keep=self._retained(request))
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str, reason: str = "") -> None:
        """Free in reverse order: a request's tail blocks reach the queue first, so shared
        prefix blocks (freed last) stay cached longest."""
        self._enter()
        req_blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(req_blocks), reason=reason)
        self.num_cached_block.pop(request_id, None)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        blocks = self.req_to_blocks[request_id]
        num_skipped_blocks = min(num_skipped_tokens // self.block_size, len(blocks))
        removed, slots = [], []
        for i in range(num_skipped_blocks - 1, -1, -1):
            if blocks[i] is self._null_block:
                break  # everything before it was nulled by an earlier call
            removed.append(blocks[i])
            slots.append(i)
            blocks[i] = self._null_block
        if removed:
            self._enter()
            rec = self.block_pool.recorder
            if rec is not None:
                rec.emit(events.WINDOW_SKIPPED, [b.block_id for b in removed], slots=slots,
                         num_computed_tokens=total_computed_tokens)
            self.block_pool.free_blocks(removed, reason="window")

    @abstractmethod
    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_length: int,
                               kv_cache_group_ids: list[int]) -> list[list[KVCacheBlock]]:
        """Cached blocks of the longest hit (per group in ``kv_cache_group_ids``), at most
        ``max_length`` tokens; each attention type defines its own search."""


class FullAttentionManager(SingleTypeKVCacheManager):
    kind = "full"

    def find_longest_cache_hit(self, block_hashes, max_length, kv_cache_group_ids):
        """Left to right; the chain means the first miss ends the hit."""
        out: list[list[KVCacheBlock]] = [[] for _ in kv_cache_group_ids]
        for block_hash in block_hashes[:max_length // self.block_size]:
            cached = self.block_pool.get_cached_block(block_hash, kv_cache_group_ids)
            if cached is None:
                break
            for dst, blk in zip(out, cached):
                dst.append(blk)
        return out


class SlidingWindowManager(SingleTypeKVCacheManager):
    kind = "sliding"

    def __init__(self, block_pool: BlockPool, block_size: int, kv_cache_group_id: int,
                 enable_caching: bool, sliding_window: int, retention: str = SPARSE) -> None:
        super().__init__(block_pool, block_size, kv_cache_group_id, enable_caching)
        if sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1; got {sliding_window}")
        if retention not in RETENTIONS:
            raise ValueError(f"sliding_retention must be one of {RETENTIONS}; got {retention!r}")
        self.sliding_window = sliding_window
        self.retention = retention
        # A token sees itself and the W-1 before it, so W-1 earlier tokens must be cached.
        self.contiguous_blocks = cdiv(sliding_window - 1, block_size)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def _retained(self, request) -> Optional[range]:
        if self.retention == DENSE:
            return None
        end = (request.num_prompt_tokens - 1) // self.block_size
        return range(max(0, end - self.contiguous_blocks), end)

    def find_longest_cache_hit(self, block_hashes, max_length, kv_cache_group_ids):
        """Right to left: the first run of ``contiguous_blocks`` cached blocks covers the
        window; blocks before it are outside the window and become null."""
        max_blocks = max_length // self.block_size
        null = self.block_pool.null_block
        out = [[null] * max_blocks for _ in kv_cache_group_ids]
        run = 0
        found = False
        for i in range(max_blocks - 1, -1, -1):
            cached = self.block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                run = 0
                continue
            for dst, blk in zip(out, cached):
                dst[i] = blk
            run += 1
            if run >= self.contiguous_blocks:
                for dst in out:
                    del dst[i + run:]
                found = True
                break
        if not found:
            # Fewer than a window's worth: only a run starting at block 0 counts.
            for dst in out:
                del dst[run:]
        return out
