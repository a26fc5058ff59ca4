"""Read-only views of the block manager's state, for code above kvcore (ours; vLLM's own
readers are its tests and its metrics collector).

The observer (``kv_cache_observer.py``) is told what kvcore decides as it decides; this module
answers what the state *is* between decisions: the free queue's order, a request's block tables,
a block's cache keys, the prefix cache's entries, the CPU tier's mode. vLLM's classes keep
vLLM's names and signatures; what a reader needs and vLLM gives no public name for is written
here, once, so no reader walks kvcore's linked lists or per-group maps itself.

Rules every function keeps:

- it only reads: nothing here assigns to a kvcore object or calls a method that does;
- it returns ints, bools, bytes and tuples or fresh lists of them, never a structure kvcore
  keeps (a caller cannot change kvcore through what it gets back);
- it builds nothing per block beyond its answer, and costs O(answer) unless it says otherwise
  (the model-free replay asks some of these every step).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Iterator, Optional

if TYPE_CHECKING:
    from kvcore.core.block_pool import BlockPool
    from kvcore.core.kv_cache_manager import KVCacheManager
    from kvcore.core.kv_cache_utils import KVCacheBlock
    from kvcore.core.sched.scheduler import Scheduler
    from kvcore.simple_kv_offload.manager import SimpleCPUOffloadScheduler


# -- the free queue (FreeKVCacheBlockQueue) ------------------------------------------------------
def free_queue_block_ids(pool: "BlockPool") -> list[int]:
    """The free queue's block ids, head -> tail: the head is the next block ``get_new_blocks``
    hands out (so the next cached block to lose its hash), the tail the last.

    Invariant: exactly the non-null blocks with ref_cnt 0, each once, so its length is
    ``pool.get_num_free_blocks()``. O(free blocks)."""
    q = pool.free_block_queue
    tail = q.fake_free_list_tail
    out = []
    node = q.fake_free_list_head.next_free_block
    while node is not None and node is not tail:
        out.append(node.block_id)
        node = node.next_free_block
    return out


def free_queue_ends(pool: "BlockPool", n: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the first ``n`` block ids from the head, the last ``n`` up to the tail), both in queue
    order (head -> tail); each holds every free block when fewer than ``n`` are free. O(n)."""
    q = pool.free_block_queue
    head_sentinel, tail_sentinel = q.fake_free_list_head, q.fake_free_list_tail
    head: list[int] = []
    node = head_sentinel.next_free_block
    while node is not None and node is not tail_sentinel and len(head) < n:
        head.append(node.block_id)
        node = node.next_free_block
    tail: list[int] = []
    node = tail_sentinel.prev_free_block
    while node is not None and node is not head_sentinel and len(tail) < n:
        tail.append(node.block_id)
        node = node.prev_free_block
    tail.reverse()
    return tuple(head), tuple(tail)


def free_queue_head(pool: "BlockPool") -> Optional[int]:
    """The id of the block at the free queue's head (the next one handed out); None when no
    block is free. O(1)."""
    q = pool.free_block_queue
    node = q.fake_free_list_head.next_free_block
    return None if node is None or node is q.fake_free_list_tail else node.block_id


def free_queue_next(pool: "BlockPool", block_id: int) -> Optional[int]:
    """The id of the block right after ``block_id`` in the free queue (towards the tail); None
    when ``block_id`` is the tail or not in the queue. O(1)."""
    node = pool.blocks[block_id].next_free_block
    if node is None or node is pool.free_block_queue.fake_free_list_tail:
        return None
    return node.block_id


def in_free_queue(block: "KVCacheBlock") -> bool:
    """Whether ``block`` stands in its pool's free queue (is linked there). A block is in the
    queue exactly while its ref_cnt is 0, except while ``get_new_blocks`` pops it: the queue
    unlinks the blocks it hands out before their evictions are reported, so a block with
    ref_cnt 0 outside the queue is one being handed out. O(1)."""
    return block.prev_free_block is not None


def free_queue_problem(pool: "BlockPool") -> Optional[str]:
    """What is wrong with the free queue, or None when it keeps its invariant: the blocks
    between the sentinels are exactly the non-null blocks with ref_cnt 0, each once, every link
    pointing back, ``num_free_blocks`` their count, and no block outside the queue keeping a
    link. For invariant checks: O(blocks), and safe on a corrupted queue (it stops at the
    first problem, a cycle included)."""
    q = pool.free_block_queue
    seen: set[int] = set()
    prev = q.fake_free_list_head
    curr = prev.next_free_block
    while curr is not q.fake_free_list_tail:
        if curr is None:
            return "free queue broken: a link is None before the tail"
        if curr.prev_free_block is not prev:
            return f"free queue: block {curr.block_id}.prev does not point back"
        if curr.block_id in seen:
            return f"free queue: block {curr.block_id} appears twice"
        if curr.is_null:
            return "free queue holds the null block"
        seen.add(curr.block_id)
        prev, curr = curr, curr.next_free_block
    if q.fake_free_list_tail.prev_free_block is not prev:
        return "free queue: tail sentinel does not point at the last block"
    expected = {b.block_id for b in pool.blocks if not b.is_null and b.ref_cnt == 0}
    if seen != expected:
        return f"free queue holds {sorted(seen)} but the free blocks are {sorted(expected)}"
    if q.num_free_blocks != len(seen):
        return f"num_free_blocks is {q.num_free_blocks} but the queue holds {len(seen)}"
    for blk in pool.blocks:
        if blk.block_id not in seen and (
            blk.prev_free_block is not None or blk.next_free_block is not None
        ):
            return f"block {blk.block_id} is outside the queue but keeps queue links"
    return None


# -- block tables (SingleTypeKVCacheManager.req_to_blocks, one per KV cache group) -----------------
def block_tables(
    kv_cache_manager: "KVCacheManager", request_id: str
) -> tuple[tuple[int, ...], ...]:
    """``request_id``'s block table in each KV cache group, in group order: entry i is the id of
    the physical block holding its logical block i (the null block's id where the group skipped
    those tokens); () in a group that holds nothing for it (waiting, finished, preempted).
    Like ``KVCacheManager.get_block_ids`` without building its lists of lists. O(table)."""
    return tuple(
        tuple([b.block_id for b in m.req_to_blocks.get(request_id, ())])
        for m in kv_cache_manager.coordinator.single_type_managers
    )


def all_block_tables(
    kv_cache_manager: "KVCacheManager",
) -> Iterator[tuple[int, str, tuple[int, ...]]]:
    """(group, request id, block table) for every table each group keeps, group by group, each
    group's requests in the order it took them in (a table may be empty). O(tables held)."""
    for group, m in enumerate(kv_cache_manager.coordinator.single_type_managers):
        for request_id, blocks in m.req_to_blocks.items():
            yield group, request_id, tuple([b.block_id for b in blocks])


def num_blocks_held(kv_cache_manager: "KVCacheManager", request_id: str, group: int = 0) -> int:
    """How many slots ``request_id``'s block table in ``group`` has (null blocks included):
    its tokens fit in that many blocks before it needs a new one. O(1)."""
    blocks = kv_cache_manager.coordinator.single_type_managers[group].req_to_blocks.get(request_id)
    return len(blocks) if blocks else 0


def num_cached_blocks(kv_cache_manager: "KVCacheManager", request_id: str, group: int = 0) -> int:
    """How many leading blocks of ``request_id``'s table in ``group`` were already offered to
    the prefix cache (vLLM's ``num_cached_block``); the next one is cached when it fills. O(1)."""
    return kv_cache_manager.coordinator.single_type_managers[group].num_cached_block.get(
        request_id, 0
    )


# -- the prefix cache (BlockPool.cached_block_hash_to_block) -------------------------------------
def cached_block_ids(pool: "BlockPool") -> Iterable[tuple[bytes, tuple[int, ...]]]:
    """(cache key, ids of the blocks holding it) for every key in the prefix cache, in the
    map's order. Invariant: each of those blocks carries the key (as its ``block_hash``, or,
    with hashes finer than the block, among ``block_cache_keys``). O(keys), lazily."""
    return pool.cached_block_hash_to_block.block_ids()


def num_blocks_cached_under(pool: "BlockPool", key: bytes) -> int:
    """How many blocks the prefix cache holds under ``key`` (0: none). More than one when
    requests computed the same content at the same time: vLLM never merges them. O(1)."""
    return pool.cached_block_hash_to_block.num_blocks(key)


def block_cache_keys(pool: "BlockPool", block_id: int) -> tuple[bytes, ...]:
    """Every cache key ``block_id`` is listed under: its ``block_hash`` first, then (hashes
    finer than the block) the keys of its partial entries, sorted; () when it is not cached.
    O(keys of the block)."""
    primary = pool.blocks[block_id].block_hash
    if primary is None:
        return ()
    more = pool.cached_block_hashes_by_block.get(block_id)
    return (primary, *sorted(more)) if more else (primary,)


# -- the waiting queues (Scheduler) --------------------------------------------------------------
def waiting_request_ids(scheduler: "Scheduler") -> tuple[str, ...]:
    """Every waiting request's id, in the order ``schedule()`` takes the queues: those holding KV
    blocks (``kv_holding_waiting``), the plain queue (``waiting``), and those a connector may
    load asynchronously (``async_kv_waiting``, with ``max_num_inflight_kv_loads`` set); each
    queue in its own order. O(waiting requests)."""
    return tuple(
        r.request_id
        for q in (scheduler.kv_holding_waiting, scheduler.waiting, scheduler.async_kv_waiting)
        for r in q.ordered()
    )


def waiting_request_queues(scheduler: "Scheduler") -> tuple[str, ...]:
    """For each id ``waiting_request_ids`` gives, in its order, the name of the queue the request
    waits in: ``"kv_holding_waiting"``, ``"waiting"`` or ``"async_kv_waiting"`` (vLLM 0.34's
    attribute names). O(waiting requests)."""
    return tuple(
        name
        for name in ("kv_holding_waiting", "waiting", "async_kv_waiting")
        for _ in getattr(scheduler, name).ordered()
    )


# -- the CPU tier (SimpleCPUOffloadScheduler) ----------------------------------------------------
def offload_is_lazy(manager: "SimpleCPUOffloadScheduler") -> bool:
    """Whether the CPU tier stores lazily (the hashed blocks near the GPU free queue's head,
    before they are reused) rather than eagerly (each request's blocks once computed): its
    ``lazy_offload`` setting, fixed when it was built. O(1)."""
    return manager._lazy_mode
