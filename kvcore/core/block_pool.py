"""BlockPool: every physical block, the free queue and the prefix-cache map (vLLM:
v1/core/block_pool.py)."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from kvcore.core.kv_cache_observer import KVCacheObserver
from kvcore.core.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    resolve_block_hashes,
)
from kvcore.distributed.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
)

# vLLM 0.34's free order, as 0.33's (unhashed blocks to the head, hashed blocks to the tail). Its
# value is a setting scenario files and the playground use, named when kvcore followed 0.33: kept
FREE_ORDER_V033 = "v0.33"
FREE_ORDER_LEGACY = "legacy"  # every freed block to the tail (older releases)
# the one list of free orders (the scenario schema, the playground's form and the tests derive
# theirs from it)
FREE_ORDERS = (FREE_ORDER_V033, FREE_ORDER_LEGACY)


# The 4 bytes make_block_hash_with_group_id appends for a group id, packed once per id.
_GROUP_SUFFIX: dict[int, bytes] = {}


def _suffix(group_id: int) -> bytes:
    suffix = _GROUP_SUFFIX[group_id] = make_block_hash_with_group_id(b"", group_id)
    return suffix


def _as_list(token_ids: Sequence[int]) -> list[int]:
    """A slice of a request's tokens as a list: a list's slice is one already (no second copy);
    any other sequence is copied into one."""
    return token_ids if type(token_ids) is list else list(token_ids)


class BlockHashToBlockMap:
    """Cache key (block hash + group id) -> the block, or the blocks, holding that content.

    As vLLM 0.34 keeps it: ``_cache`` maps each key to one block id, the first inserted of the
    blocks still under it (the one ``get_one_block`` returns); only when two requests computed
    the same content at the same time does a key hold several blocks, and then ``_dup_ids``
    holds all of that key's block ids, in insertion order (vLLM keeps ``_cache`` a dict of only
    bytes and ints, which the garbage collector does not track). Blocks are never
    de-duplicated, so block tables stay append-only. A key keeps its place in ``_cache``'s
    order while any block remains under it.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._blocks = blocks
        self._cache: dict[bytes, int] = {}
        self._dup_ids: dict[bytes, dict[int, None]] = {}

    def get_one_block(self, key: bytes) -> Optional[KVCacheBlock]:
        block_id = self._cache.get(key)
        return None if block_id is None else self._blocks[block_id]

    def contain(self, key: bytes, block_id: int) -> bool:
        dup_ids = self._dup_ids.get(key)
        if dup_ids is not None:
            return block_id in dup_ids
        return self._cache.get(key) == block_id

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        block_id = self._cache.setdefault(key, block.block_id)
        if block_id != block.block_id:
            self._dup_ids.setdefault(key, {block_id: None})[block.block_id] = None

    def pop(self, key: bytes, block_id: int) -> Optional[KVCacheBlock]:
        dup_ids = self._dup_ids.get(key)
        if dup_ids is None:
            if self._cache.get(key) != block_id:
                return None
            del self._cache[key]
        else:
            if dup_ids.pop(block_id, False) is False:
                return None
            # assigning an existing key keeps its place in the dict's order
            self._cache[key] = next(iter(dup_ids))
            if len(dup_ids) == 1:
                del self._dup_ids[key]
        return self._blocks[block_id]

    def clear(self) -> None:
        self._cache.clear()
        self._dup_ids.clear()

    def num_blocks(self, key: bytes) -> int:
        """How many blocks hold ``key`` (0: none). Ours (the lab's inspection)."""
        dup_ids = self._dup_ids.get(key)
        if dup_ids is not None:
            return len(dup_ids)
        return 0 if key not in self._cache else 1

    def is_sole_block(self, key: bytes, block_id: int) -> bool:
        """Whether ``block_id`` is the one block under ``key``: the common case, in which
        popping it drops the key. Ours (the pool's eviction fast path)."""
        return self._cache.get(key) == block_id and key not in self._dup_ids

    def block_ids(self) -> Iterable[tuple[bytes, tuple[int, ...]]]:
        """(key, ids of the blocks holding it) for every key, in the map's order (for snapshots)."""
        dup = self._dup_ids
        for key, block_id in self._cache.items():
            yield key, tuple(dup[key]) if key in dup else (block_id,)

    def __len__(self) -> int:
        return len(self._cache)


class BlockPool:
    """All KV blocks of one engine.

    Invariants: block 0 is the null block, taken out of the queue at start and
    never freed, evicted or counted as free; a non-null block is in the free
    queue exactly when its ref_cnt is 0; every key in the hash map points at
    blocks whose ``block_hash`` is that key. Eviction is lazy: a free block
    keeps its hash (and can still be hit) until ``get_new_blocks`` pops it.

    ``observer`` and ``metrics_collector`` (None: nobody) are ``KVCacheObserver``s, told
    each block decision once it is made (see kvcore/core/kv_cache_observer.py for what each
    hook means): the observer hears every hook, and the managers and scheduler over this
    pool reach it through ``observer`` too; the metrics collector (vLLM's name and place)
    hears only allocation, touch, eviction and reset. Neither changes what the pool does.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        medium: str = MEDIUM_GPU,
        *,
        free_order: str = FREE_ORDER_V033,
        use_int_block_hashes: bool = True,
        metrics_collector: Optional[KVCacheObserver] = None,
    ) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 2:
            raise ValueError(
                "num_gpu_blocks must be an integer >= 2 (block "
                f"0 is the null block); got {num_gpu_blocks!r}"
            )
        if free_order not in FREE_ORDERS:
            raise ValueError(f"free_order must be one of {FREE_ORDERS}; got {free_order!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.medium = medium
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        # Ours: the free order of older releases, kept to show what 0.33 changed (0.34 keeps
        # 0.33's order).
        self.free_order = free_order
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap(self.blocks)
        # A block's keys besides its primary one (``block.block_hash``): partial entries
        # (``cache_partial_block``), so eviction and reset can drop every key of a block.
        self.cached_block_hashes_by_block: dict[int, set[bytes]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES: hashes go out as uint64 (True) or 32 bytes.
        self.use_int_block_hashes = use_int_block_hashes
        self.metrics_collector = metrics_collector
        # Ours: the recorder's door (None: nothing is recorded); see the class docstring.
        self.observer: Optional[KVCacheObserver] = None

    # -- prefix cache -----------------------------------------------------------------
    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> Optional[list[KVCacheBlock]]:
        """The first-inserted block for the hash in every given group, or None if any group
        misses."""
        # get_one_block and make_block_hash_with_group_id, inlined with each group's key suffix
        # packed once: the prefix-cache lookup runs for a prompt's blocks up to its first miss,
        # and the two calls and the packing were most of its time.
        cache = self.cached_block_hash_to_block
        table = cache._cache
        out = []
        for group_id in kv_cache_group_ids:
            block_id = table.get(block_hash + (_GROUP_SUFFIX.get(group_id) or _suffix(group_id)))
            if block_id is None:
                return None
            out.append(cache._blocks[block_id])
        return out

    def cache_full_blocks(
        self,
        request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Optional[list[bool]] = None,
    ) -> None:
        """Give blocks[num_cached_blocks:num_full_blocks] their hashes and register them.

        ``block_mask`` (aligned with those blocks) leaves out the blocks no hit can ever use
        (sliding-window sparse retention): they stay unhashed for good, as null blocks do.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        assert len(hashes) >= num_full_blocks, "request hashes lag behind its tokens"
        events = self.enable_kv_cache_events
        observer = self.observer
        if not events and observer is None and block_mask is None:
            # The common case (nothing recorded or published, every block kept) in one tight
            # loop: the key is make_block_hash_with_group_id's, the map insert is insert's.
            suffix = kv_cache_group_id.to_bytes(4, "big", signed=False)
            cache = self.cached_block_hash_to_block
            table = cache._cache
            for i in range(num_cached_blocks, num_full_blocks):
                blk = blocks[i]
                if blk.is_null:
                    continue
                key = hashes[i] + suffix
                if blk.block_hash == key:
                    continue  # cached already (a hit)
                if blk.block_hash is not None:
                    # Keyed at a boundary inside the block (a partial entry): it is full now.
                    assert blk.block_hash_num_tokens < (i + 1) * block_size
                    self._remove_cached_block_hashes(blk)
                blk.block_hash = key
                blk.block_hash_num_tokens = (i + 1) * block_size
                if key in table:
                    cache.insert(key, blk)
                else:
                    table[key] = blk.block_id
            return
        new_hashes: list[bytes] = []
        new_extra_keys: list = []
        extra_keys_for_block = self._extra_keys_for_block(request, block_size)
        cached: Optional[list[KVCacheBlock]] = [] if observer is not None else None
        cache = self.cached_block_hash_to_block
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                continue
            key = make_block_hash_with_group_id(hashes[i], kv_cache_group_id)
            if blk.block_hash == key:
                continue  # cached already (a hit)
            if blk.block_hash is not None:
                # Keyed at a boundary inside the block (a partial entry): it is full now.
                assert blk.block_hash_num_tokens < (i + 1) * block_size
                self._rekey(blk)
            self._insert_block_hash(key, blk, (i + 1) * block_size)
            if events:
                new_hashes.append(hashes[i])
                new_extra_keys.append(extra_keys_for_block(i))
            if cached is not None:
                cached.append(blk)
        if events:
            # As vLLM: one event per call even when no block was kept (sparse sliding
            # window); parent and token_ids describe the whole range, hashes only the kept.
            self.kv_event_queue.append(
                self._block_stored_event(
                    request,
                    new_hashes,
                    new_extra_keys,
                    hashes[num_cached_blocks - 1] if num_cached_blocks else None,
                    num_cached_blocks * block_size,
                    num_full_blocks * block_size,
                    block_size,
                    kv_cache_group_id,
                )
            )
        if cached:
            observer.on_blocks_cached(request, cached, block_size)

    def _extra_keys_for_block(self, request, block_size: int):
        """The extra keys of the request's i-th block of ``block_size`` tokens, as a function
        of i (a cache block may be wider than a hash block)."""
        if block_size == self.hash_block_size:
            return request.extra_keys_for_block

        def extra_keys_for_block(i: int):
            return request.extra_keys_for_range(i * block_size, (i + 1) * block_size)

        return extra_keys_for_block

    def emit_cached_block_events(
        self, request, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """One BlockStored for the request's first ``num_cached_blocks`` blocks, hit in the
        prefix cache (the request's ``kv_cache_report_mode`` "full"): the blocks are cached
        already and stay as they are; only consumers learn that this request holds them."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        extra_keys_for_block = self._extra_keys_for_block(request, block_size)
        self.kv_event_queue.append(
            self._block_stored_event(
                request,
                hashes[:num_cached_blocks],
                [extra_keys_for_block(i) for i in range(num_cached_blocks)],
                None,  # a hit is a prefix: it starts at block 0
                0,
                num_cached_blocks * block_size,
                block_size,
                kv_cache_group_id,
            )
        )

    def _external(self, block_hash: bytes):
        return maybe_convert_block_hash(block_hash, self.use_int_block_hashes)

    def _block_stored_event(
        self,
        request,
        block_hashes: list[bytes],
        extra_keys: list,
        parent: Optional[bytes],
        start: int,
        end: int,
        block_size: int,
        group_id: int,
    ) -> BlockStored:
        # Events carry extra keys untagged: ("cache_salt", s) is published as s.
        untagged = [
            None if keys is None else tuple(k[1:] if k[0] == "mm" else k[1] for k in keys)
            for keys in extra_keys
        ]
        lora = getattr(request, "lora_request", None)
        return BlockStored(
            block_hashes=[self._external(h) for h in block_hashes],
            parent_block_hash=None if parent is None else self._external(parent),
            token_ids=_as_list(request.all_token_ids[start:end]),
            block_size=block_size,
            lora_id=lora.adapter_id if lora else None,
            medium=self.medium,
            lora_name=lora.name if lora else None,
            extra_keys=untagged or None,
            group_idx=group_id,
            session_id=getattr(request, "session_id", None),
        )

    # -- allocation -------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop blocks from the queue head; any hash they still carry is evicted now."""
        queue = self.free_block_queue
        if num_blocks > queue.num_free_blocks:
            raise ValueError(
                f"Cannot get {num_blocks} free blocks from the pool "
                f"(only {queue.num_free_blocks} free)"
            )
        if not self.enable_caching:
            ret = queue.popleft_n(num_blocks)
            for block in ret:
                assert block.ref_cnt == 0
                block.ref_cnt = 1
        elif (
            self.observer is None
            and self.metrics_collector is None
            and not self.cached_block_hashes_by_block
        ):
            return self._get_new_blocks_unobserved(num_blocks)
        else:
            ret = queue.popleft_n(num_blocks)
            for block in ret:
                if block.block_hash is not None:
                    self._maybe_evict_cached_block(block)
                assert block.ref_cnt == 0
                block.ref_cnt = 1
        if ret:
            if self.metrics_collector is not None:
                self.metrics_collector.on_blocks_allocated(ret)
            if self.observer is not None:
                self.observer.on_blocks_allocated(ret)
        return ret

    def _get_new_blocks_unobserved(self, num_blocks: int) -> list[KVCacheBlock]:
        """get_new_blocks in the common case (caching on, nobody to tell, no block with a
        partial entry), in one pass over the queue's head: the free queue's popleft_n and the
        loop over the popped blocks, fused (each allocated block paid for two loops, which made
        allocating slower than vLLM's). A block whose key maps to it alone is evicted right
        here, as _maybe_evict_cached_block would, without a call per block (the calls and
        lists per block that partial entries brought had made eviction slower than vLLM's);
        any other cached block goes through _maybe_evict_cached_block. The caller has checked
        that ``num_blocks`` blocks are free."""
        queue = self.free_block_queue
        table = self.cached_block_hash_to_block._cache
        dup_ids = self.cached_block_hash_to_block._dup_ids
        kv_events = self.kv_event_queue if self.enable_kv_cache_events else None
        head = queue.fake_free_list_head
        block = head.next_free_block
        ret: list = [None] * num_blocks  # filled by index: cheaper than append
        for i in range(num_blocks):
            ret[i] = block
            next_block = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            if block.block_hash is not None:
                key = block.block_hash
                if table.get(key) == block.block_id and key not in dup_ids:
                    del table[key]
                    block.block_hash = None
                    block.block_hash_num_tokens = None
                    if kv_events is not None:
                        kv_events.append(self._block_removed_event(key))
                else:
                    self._maybe_evict_cached_block(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
            block = next_block
        if num_blocks:
            head.next_free_block = block
            block.prev_free_block = head
            queue.num_free_blocks -= num_blocks
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        key = block.block_hash
        if key is None:
            return False
        hash_map = self.cached_block_hash_to_block
        # The common case (the key maps to this block alone), tested first.
        sole = hash_map.is_sole_block(key, block.block_id)
        if not sole and not self.cached_block_hash_to_block.contain(key, block.block_id):
            return False
        # before the hash is gone
        if self.metrics_collector is not None:
            self.metrics_collector.on_block_evicted(block)
        if self.observer is not None:
            self.observer.on_block_evicted(block)
        if sole and block.block_id not in self.cached_block_hashes_by_block:
            # The block's one key (no partial entry): what _remove_cached_block_hashes and
            # _emit_block_removed_events do for it, without their lists and calls.
            del hash_map._cache[key]
            block.block_hash = None
            block.block_hash_num_tokens = None
            if self.enable_kv_cache_events:
                self.kv_event_queue.append(self._block_removed_event(key))
        else:
            self._emit_block_removed_events(self._remove_cached_block_hashes(block))
        return True

    # -- keys inside a block (prefix_match_unit finer than the block) -------------------
    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[bytes]:
        """Drop every key of the block from the map; -> the keys that were there."""
        keys = [block.block_hash] if block.block_hash is not None else []
        keys.extend(self.cached_block_hashes_by_block.pop(block.block_id, ()))
        removed = [k for k in keys if self.cached_block_hash_to_block.pop(k, block.block_id)]
        block.reset_hash()
        return removed

    def _emit_block_removed_events(self, keys: list[bytes]) -> None:
        if self.enable_kv_cache_events:
            for key in keys:
                self.kv_event_queue.append(self._block_removed_event(key))

    def _block_removed_event(self, key: bytes) -> BlockRemoved:
        return BlockRemoved(
            block_hashes=[self._external(get_block_hash(key))],
            medium=self.medium,
            group_idx=get_group_id(key),
        )

    def _rekey(self, block: KVCacheBlock) -> None:
        """Drop the block's keys before it is keyed anew, telling the events and the observer."""
        removed = self._remove_cached_block_hashes(block)
        self._emit_block_removed_events(removed)
        if removed and self.observer is not None:
            self.observer.on_block_rekeyed(block, removed)

    def _insert_block_hash(self, key: bytes, block: KVCacheBlock, num_tokens: int) -> None:
        """The first key of a block is its primary hash; later ones are partial entries."""
        if block.block_hash == key or self.cached_block_hash_to_block.contain(key, block.block_id):
            return
        if block.block_hash is None:
            block.block_hash = key
            block.block_hash_num_tokens = num_tokens
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, set()).add(key)
        self.cached_block_hash_to_block.insert(key, block)

    def cache_partial_block(
        self,
        request,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> Optional[bytes]:
        """Make ``block`` reachable from the prefix boundary ``num_tokens`` inside it (a
        multiple of ``hash_block_size``): the key is the request's chained hash there. A block
        keyed at an earlier boundary is re-keyed; -> the key, None for the null block."""
        if block.is_null:
            return None
        assert block_size % self.hash_block_size == 0
        n = num_tokens // self.hash_block_size
        key = make_block_hash_with_group_id(request.block_hashes[n - 1], kv_cache_group_id)
        already = block.block_hash == key or self.cached_block_hash_to_block.contain(
            key, block.block_id
        )
        if replace_existing_hashes:
            self._rekey(block)
            already = False
        elif (
            not already
            and block.block_hash is not None
            and block.block_hash_num_tokens < n * self.hash_block_size
        ):
            self._rekey(block)
        self._insert_block_hash(key, block, n * self.hash_block_size)
        if not already and self.observer is not None:
            self.observer.on_block_cached_partial(
                request, block, key, n * self.hash_block_size, block_size
            )
        if self.enable_kv_cache_events and not already:
            start = (n - 1) * self.hash_block_size
            parent = request.block_hashes[n - 2] if n > 1 else None
            event = self._block_stored_event(
                request,
                [request.block_hashes[n - 1]],
                [request.extra_keys_for_block(n - 1)],
                parent,
                start,
                num_tokens,
                num_tokens - start,
                kv_cache_group_id,
            )
            self.kv_event_queue.append(event)
        return key

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        """Re-point ``src_block``'s keys to ``dst_block`` (its private copy): the request
        owning ``src_block`` keeps writing into it. No events: the entries stay live."""
        assert dst_block.block_hash is None
        num_tokens = src_block.block_hash_num_tokens
        for key in self._remove_cached_block_hashes(src_block):
            self._insert_block_hash(key, dst_block, num_tokens)

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """ref_cnt += 1; a block that was free (ref_cnt 0) leaves the free queue."""
        if blocks:  # before: where in the queue they were
            if self.metrics_collector is not None:
                self.metrics_collector.on_blocks_touched(blocks)
            if self.observer is not None:
                self.observer.on_blocks_touched(blocks)
        # The free queue's remove, inlined (a prefix hit touches each block it reuses, and each
        # free one leaves the queue: a call per such block was most of touch's time); the count
        # is settled even if a block turns out not to be in the queue, as remove's own would be.
        queue = self.free_block_queue
        num_removed = 0
        try:
            for block in blocks:
                if block.ref_cnt == 0 and not block.is_null:
                    prev_block, next_block = block.prev_free_block, block.next_free_block
                    if prev_block is None or next_block is None:
                        raise RuntimeError(  # remove's own error, word for word
                            f"remove() called on {block!r}, which is not in the free queue"
                        )
                    prev_block.next_free_block = next_block
                    next_block.prev_free_block = prev_block
                    block.prev_free_block = block.next_free_block = None
                    num_removed += 1
                block.ref_cnt += 1
        finally:
            queue.num_free_blocks -= num_removed

    def free_blocks(
        self, ordered_blocks: Iterable[KVCacheBlock], evict_first: bool = False
    ) -> None:
        """ref_cnt -= 1 in the given order; blocks reaching 0 join the queue in that order.

        vLLM 0.34 (free order "v0.33", as 0.33): blocks without a hash can never be hit, so
        they go to the head (reused first) and hashed blocks go to the tail (LRU).
        ``evict_first`` (new in 0.34): hashed blocks go to the head too, for blocks another
        tier already holds (the CPU tier's lazy stores).
        """
        to_head: list[KVCacheBlock] = []
        to_tail: list[KVCacheBlock] = []
        head_ok = self.free_order == FREE_ORDER_V033
        observer = self.observer
        if observer is not None:
            ordered_blocks = list(ordered_blocks)  # the observer reads them after the loop
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if (block.block_hash is None and head_ok) or evict_first:
                    to_head.append(block)
                else:
                    to_tail.append(block)
        if to_head:
            self.free_block_queue.prepend_n(to_head)
        if to_tail:
            self.free_block_queue.append_n(to_tail)
        if observer is not None and ordered_blocks:
            observer.on_blocks_freed(ordered_blocks, to_head, to_tail)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the hashes of these blocks (in use or not); nothing is freed."""
        blocks = self.blocks
        num_blocks = len(blocks)
        for block_id in block_ids:
            if not 0 <= block_id < num_blocks:
                raise ValueError(f"block id {block_id} is outside the pool (0..{num_blocks - 1})")
            self._maybe_evict_cached_block(blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """Forget every hash; refused (False) while any block other than the null block is in
        use."""
        num_used = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used != 1:
            self._tell_reset(False, num_used - 1)
            return False
        # in place, as vLLM 0.34 (a new map made after the engine's gc.freeze() at start-up
        # would not be frozen)
        self.cached_block_hash_to_block.clear()
        self.cached_block_hashes_by_block.clear()
        for block in self.blocks:  # reset_hash, inlined: a call per block was most of the time
            block.block_hash = None
            block.block_hash_num_tokens = None
        self._tell_reset(True, 0)
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def _tell_reset(self, ok: bool, blocks_in_use: int) -> None:
        for observer in (self.metrics_collector, self.observer):
            if observer is not None:
                observer.on_prefix_cache_reset(ok, blocks_in_use)

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        total = self.num_gpu_blocks - 1
        return 0.0 if not total else 1.0 - self.get_num_free_blocks() / total

    def take_events(self) -> list[KVCacheEvent]:
        """Every KV event queued since the last call, in order; the queue is left empty."""
        if not self.enable_kv_cache_events:
            return []
        taken, self.kv_event_queue = self.kv_event_queue, []
        return taken
