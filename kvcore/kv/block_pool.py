"""BlockPool: every physical block, the free queue and the prefix-cache map (vLLM v1: block_pool)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from kvcore import events
from kvcore.kv.block_hash import get_block_hash, get_group_id, make_block_hash_with_group_id
from kvcore.kv.free_queue import FreeKVCacheBlockQueue, KVCacheBlock

FREE_ORDER_V033 = "v0.33"    # unhashed blocks to the head, hashed blocks to the tail
FREE_ORDER_LEGACY = "legacy"  # every freed block to the tail (older releases)
FREE_ORDERS = (FREE_ORDER_V033, FREE_ORDER_LEGACY)


# KV cache events in vLLM's shapes (vllm.distributed.kv_events).
@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[bytes]
    parent_block_hash: Optional[bytes]
    token_ids: list[int]
    block_size: int


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[bytes]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


class BlockHashToBlockMap:
    """Cache key (block hash + group id) -> the blocks holding that content.

    Several blocks can carry one key when two requests computed the same
    content at the same time; blocks are never de-duplicated so that block
    tables stay append-only. Per key, blocks keep insertion order.
    """

    def __init__(self) -> None:
        self._cache: dict[bytes, dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: bytes) -> Optional[KVCacheBlock]:
        blocks = self._cache.get(key)
        if not blocks:
            return None
        return next(iter(blocks.values()))

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        self._cache.setdefault(key, {})[block.block_id] = block

    def pop(self, key: bytes, block_id: int) -> Optional[KVCacheBlock]:
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._cache[key]
        return block

    def items(self):
        return self._cache.items()

    def __len__(self) -> int:
        return len(self._cache)


@dataclass
class HashMeta:
    """What a block hash stands for: parent hash, the block's tokens, extra keys."""

    parent: Optional[bytes]
    token_ids: tuple[int, ...]
    extra_keys: Optional[tuple] = None


class BlockPool:
    """All KV blocks of one engine.

    Invariants: block 0 is the null block, taken out of the queue at start and
    never freed, evicted or counted as free; a non-null block is in the free
    queue exactly when its ref_cnt is 0; every key in the hash map points at
    blocks whose ``block_hash`` is that key. Eviction is lazy: a free block
    keeps its hash (and can still be hit) until ``get_new_blocks`` pops it.
    """

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, block_size: int,
                 free_order: str = FREE_ORDER_V033,
                 recorder: Optional[events.Recorder] = None,
                 enable_kv_cache_events: bool = True) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks must be an integer >= 2 (block 0 is the null block); got {num_gpu_blocks!r}")
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {FREE_ORDERS}; got {free_order!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.block_size = block_size
        self.free_order = free_order
        self.recorder = recorder
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        # Content behind each block hash, for drawing chains and checking hashes.
        self.hash_meta: dict[bytes, HashMeta] = {}
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list = []

    # -- prefix cache -----------------------------------------------------------------
    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: Sequence[int]) -> Optional[list[KVCacheBlock]]:
        """The first-inserted block for the hash in every given group, or None if any group misses."""
        out = []
        for group_id in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(
                make_block_hash_with_group_id(block_hash, group_id))
            if block is None:
                return None
            out.append(block)
        return out

    def cache_full_blocks(self, request, blocks: list[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int, block_size: int, kv_cache_group_id: int,
                          keep: Optional[range] = None) -> None:
        """Give blocks[num_cached_blocks:num_full_blocks] their hashes and register them.

        ``keep`` (sliding-window sparse retention) limits which block indices get a
        hash; the others stay unhashed for good.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        assert len(hashes) >= num_full_blocks, "request hashes lag behind its tokens"
        new_ids, new_hashes = [], []
        first = -1                     # table index of the first block stored by this call
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null or (keep is not None and i not in keep):
                continue
            key = make_block_hash_with_group_id(hashes[i], kv_cache_group_id)
            if blk.block_hash is not None:
                assert blk.block_hash == key, "a hit block carries the wrong hash"
                continue
            if first < 0:
                first = i
            blk.block_hash = key
            self.cached_block_hash_to_block.insert(key, blk)
            if hashes[i] not in self.hash_meta:
                self.hash_meta[hashes[i]] = HashMeta(
                    hashes[i - 1] if i else None,
                    tuple(request.all_token_ids[i * block_size:(i + 1) * block_size]),
                    request.extra_keys_for_block(i))
            new_ids.append(blk.block_id)
            new_hashes.append(hashes[i])
        if not new_ids:
            return
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockStored(
                new_hashes, hashes[first - 1] if first else None,
                list(request.all_token_ids[first * block_size:(first + len(new_ids)) * block_size]),
                block_size))
        if self.recorder is not None:
            self.recorder.emit(events.CACHED, new_ids, group=kv_cache_group_id,
                               hashes=[h.hex() for h in new_hashes],
                               num_tokens=len(new_ids) * block_size)

    # -- allocation -------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop blocks from the queue head; any hash they still carry is evicted now."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool "
                             f"(only {self.get_num_free_blocks()} free)")
        ret = self.free_block_queue.popleft_n(num_blocks)
        evicted: dict[int, str] = {}
        for block in ret:
            if self.enable_caching and block.block_hash is not None:
                lost = block.block_hash
                if self._maybe_evict_cached_block(block):
                    evicted[block.block_id] = get_block_hash(lost).hex()
            assert block.ref_cnt == 0
            block.ref_cnt += 1
        if self.recorder is not None and ret:
            for bid, h in evicted.items():
                self.recorder.emit(events.EVICTED, [bid], reason="reused from queue head", hash=h)
            self.recorder.emit(events.ALLOCATED, [b.block_id for b in ret],
                               queue_positions=list(range(len(ret))),
                               evicted_hashes={str(k): v for k, v in evicted.items()})
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        key = block.block_hash
        if key is None:
            return False
        if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            return False
        block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockRemoved([get_block_hash(key)]))
        return True

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """ref_cnt += 1; a block that was free (ref_cnt 0) leaves the free queue."""
        blocks = list(blocks)
        positions = {}
        if self.recorder is not None:
            wanted = {b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null}
            if wanted:
                positions = self._queue_positions(wanted)
        from_queue = []
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
                from_queue.append(block.block_id)
            block.ref_cnt += 1
        if self.recorder is not None and blocks:
            self.recorder.emit(events.TOUCHED, [b.block_id for b in blocks], from_queue=from_queue,
                               queue_positions=[positions[i] for i in from_queue])

    def _queue_positions(self, wanted: set[int]) -> dict[int, int]:
        """Queue positions of some free blocks, for the record. Walks from the tail and stops
        once all are found: hits are usually recently freed hashed blocks, near the tail."""
        q = self.free_block_queue
        out: dict[int, int] = {}
        pos = q.num_free_blocks - 1
        curr = q.fake_free_list_tail.prev_free_block
        while curr is not q.fake_free_list_head and len(out) < len(wanted):
            if curr.block_id in wanted:
                out[curr.block_id] = pos
            curr = curr.prev_free_block
            pos -= 1
        return out

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock], reason: str = "") -> None:
        """ref_cnt -= 1 in the given order; blocks reaching 0 join the queue in that order.

        v0.33: blocks without a hash can never be hit, so they go to the head
        (reused first) and hashed blocks go to the tail (LRU).
        """
        blocks = list(ordered_blocks)
        for block in blocks:
            block.ref_cnt -= 1
        freeable = [b for b in blocks if b.ref_cnt == 0 and not b.is_null]
        if self.free_order == FREE_ORDER_LEGACY:
            to_head, to_tail = [], freeable
        else:
            to_head = [b for b in freeable if b.block_hash is None]
            to_tail = [b for b in freeable if b.block_hash is not None]
        if to_head:
            self.free_block_queue.prepend_n(to_head)
        if to_tail:
            self.free_block_queue.append_n(to_tail)
        if self.recorder is not None and blocks:
            self.recorder.emit(events.FREED, [b.block_id for b in blocks if not b.is_null],
                               to_head=[b.block_id for b in to_head],
                               to_tail=[b.block_id for b in to_tail],
                               still_used=[b.block_id for b in blocks if b.ref_cnt > 0 and not b.is_null],
                               reason=reason)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the hashes of these blocks (in use or not); nothing is freed."""
        for block_id in block_ids:
            if not 0 <= block_id < len(self.blocks):
                raise ValueError(f"block id {block_id} is outside the pool (0..{len(self.blocks) - 1})")
            block = self.blocks[block_id]
            key = block.block_hash
            if self._maybe_evict_cached_block(block) and self.recorder is not None:
                self.recorder.emit(events.EVICTED, [block_id], reason="evict_blocks",
                                   hash=get_block_hash(key).hex(), group=get_group_id(key))

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block other than the null block is in use."""
        num_used = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used != 1:
            if self.recorder is not None:
                self.recorder.emit(events.RESET, ok=False, blocks_in_use=num_used - 1)
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.hash_meta.clear()
        for block in self.blocks:
            block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        if self.recorder is not None:
            self.recorder.emit(events.RESET, ok=True)
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1
        return 0.0 if not total else 1.0 - self.get_num_free_blocks() / total

    def take_events(self) -> list:
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
