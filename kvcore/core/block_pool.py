"""BlockPool: every physical block, the free queue and the prefix-cache map (vLLM v1: block_pool)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from record import events
from kvcore.core.kv_cache_utils import get_block_hash, get_group_id, make_block_hash_with_group_id
from kvcore.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock
from kvcore.distributed.kv_events import (MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored,
                              KVCacheEvent, maybe_convert_block_hash)

FREE_ORDER_V033 = "v0.33"    # unhashed blocks to the head, hashed blocks to the tail
FREE_ORDER_LEGACY = "legacy"  # every freed block to the tail (older releases)
FREE_ORDERS = (FREE_ORDER_V033, FREE_ORDER_LEGACY)


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
                 enable_kv_cache_events: bool = True, medium: str = MEDIUM_GPU,
                 use_int_block_hashes: bool = True) -> None:
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
        # KV events as vLLM queues them (kvcore.distributed.kv_events), drained by take_events each step.
        self.kv_event_queue: list[KVCacheEvent] = []
        self.medium = medium
        # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: hashes go out as uint64 (True) or 32 bytes.
        self.use_int_block_hashes = use_int_block_hashes

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
        new_ids, new_hashes, new_extra_keys = [], [], []
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null or (keep is not None and i not in keep):
                continue
            key = make_block_hash_with_group_id(hashes[i], kv_cache_group_id)
            if blk.block_hash is not None:
                assert blk.block_hash == key, "a hit block carries the wrong hash"
                continue
            blk.block_hash = key
            blk.block_hash_num_tokens = (i + 1) * block_size
            self.cached_block_hash_to_block.insert(key, blk)
            if hashes[i] not in self.hash_meta:
                self.hash_meta[hashes[i]] = HashMeta(
                    hashes[i - 1] if i else None,
                    tuple(request.all_token_ids[i * block_size:(i + 1) * block_size]),
                    request.extra_keys_for_block(i))
            new_ids.append(blk.block_id)
            new_hashes.append(hashes[i])
            new_extra_keys.append(request.extra_keys_for_block(i))
        if self.enable_kv_cache_events:
            # As vLLM: one event per call even when no block was kept (sparse sliding
            # window); parent and token_ids describe the whole range, hashes only the kept.
            self.kv_event_queue.append(self._block_stored_event(
                request, new_hashes, new_extra_keys,
                hashes[num_cached_blocks - 1] if num_cached_blocks else None,
                num_cached_blocks * block_size, num_full_blocks * block_size,
                block_size, kv_cache_group_id))
        if not new_ids:
            return
        if self.recorder is not None:
            self.recorder.emit(events.Cached(
                request_id=request.request_id, block_ids=tuple(new_ids), group=kv_cache_group_id,
                block_hashes=tuple(h.hex() for h in new_hashes), num_tokens=len(new_ids) * block_size))

    def _external(self, block_hash: bytes):
        return maybe_convert_block_hash(block_hash, self.use_int_block_hashes)

    def _block_stored_event(self, request, block_hashes: list[bytes], extra_keys: list,
                            parent: Optional[bytes], start: int, end: int, block_size: int,
                            group_id: int) -> BlockStored:
        # Events carry extra keys untagged: ("cache_salt", s) is published as s.
        untagged = [None if keys is None else tuple(k[1:] if k[0] == "mm" else k[1] for k in keys)
                    for keys in extra_keys]
        return BlockStored(
            block_hashes=[self._external(h) for h in block_hashes],
            parent_block_hash=None if parent is None else self._external(parent),
            token_ids=list(request.all_token_ids[start:end]), block_size=block_size,
            lora_id=None, medium=self.medium, lora_name=None,
            extra_keys=untagged or None, group_idx=group_id)

    # -- allocation -------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int, *, request_id: Optional[str] = None,
                       group: Optional[int] = None) -> list[KVCacheBlock]:
        """Pop blocks from the queue head; any hash they still carry is evicted now.

        ``request_id`` / ``group`` only name, in the step's record, whom the blocks are for.
        """
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool "
                             f"(only {self.get_num_free_blocks()} free)")
        ret = self.free_block_queue.popleft_n(num_blocks)
        evicted: dict[int, bytes] = {}
        for block in ret:
            if self.enable_caching and block.block_hash is not None:
                lost = block.block_hash
                if self._maybe_evict_cached_block(block):
                    evicted[block.block_id] = lost
            assert block.ref_cnt == 0
            block.ref_cnt += 1
        if self.recorder is not None and ret:
            for bid, key in evicted.items():
                self.recorder.emit(events.Evicted(
                    request_id=request_id, block_ids=(bid,), group=get_group_id(key),
                    block_hash=get_block_hash(key).hex(), reason="reused from queue head"))
            self.recorder.emit(events.Allocated(
                request_id=request_id, block_ids=tuple(b.block_id for b in ret), group=group,
                queue_positions=tuple(range(len(ret))),
                evicted_hashes={bid: get_block_hash(key).hex() for bid, key in evicted.items()}))
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        key = block.block_hash
        if key is None:
            return False
        if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            return False
        block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockRemoved(
                block_hashes=[self._external(get_block_hash(key))], medium=self.medium,
                group_idx=get_group_id(key)))
        return True

    def touch(self, blocks: Iterable[KVCacheBlock], *, request_id: Optional[str] = None,
              group: Optional[int] = None) -> None:
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
            self.recorder.emit(events.Touched(
                request_id=request_id, block_ids=tuple(b.block_id for b in blocks), group=group,
                from_queue=tuple(from_queue), queue_positions=tuple(positions[i] for i in from_queue)))

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

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock], reason: str = "", *,
                    request_id: Optional[str] = None, group: Optional[int] = None) -> None:
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
            self.recorder.emit(events.Freed(
                request_id=request_id, block_ids=tuple(b.block_id for b in blocks if not b.is_null),
                group=group, to_head=tuple(b.block_id for b in to_head),
                to_tail=tuple(b.block_id for b in to_tail),
                still_used=tuple(b.block_id for b in blocks if b.ref_cnt > 0 and not b.is_null),
                reason=reason))

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the hashes of these blocks (in use or not); nothing is freed."""
        for block_id in block_ids:
            if not 0 <= block_id < len(self.blocks):
                raise ValueError(f"block id {block_id} is outside the pool (0..{len(self.blocks) - 1})")
            block = self.blocks[block_id]
            key = block.block_hash
            if self._maybe_evict_cached_block(block) and self.recorder is not None:
                self.recorder.emit(events.Evicted(
                    block_ids=(block_id,), group=get_group_id(key),
                    block_hash=get_block_hash(key).hex(), reason="evict_blocks"))

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block other than the null block is in use."""
        num_used = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used != 1:
            if self.recorder is not None:
                self.recorder.emit(events.PrefixCacheReset(ok=False, blocks_in_use=num_used - 1))
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        self.hash_meta.clear()
        for block in self.blocks:
            block.reset_hash()
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        if self.recorder is not None:
            self.recorder.emit(events.PrefixCacheReset(ok=True))
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1
        return 0.0 if not total else 1.0 - self.get_num_free_blocks() / total

    def take_events(self) -> list[KVCacheEvent]:
        """Every KV event queued since the last call, in order; the queue is left empty."""
        taken, self.kv_event_queue = self.kv_event_queue, []
        return taken
