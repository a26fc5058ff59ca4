"""The Recorder: kvcore's decisions, as they are made, turned into typed events (record.events).

kvcore keeps vLLM's method signatures, so its calls do not say whom the pool is working for.
Instead kvcore tells one declared observer (``kvcore.core.kv_cache_observer.KVCacheObserver``,
as vLLM's pool tells its metrics collector), and the Recorder is one: set once as the pool's
``observer`` by :meth:`Recorder.attach`, it hears

- the block hooks from ``BlockPool`` (allocated, evicted, touched, freed, cached, reset);
- the request scopes the KV cache managers and the CPU tier open around the pool calls they
  make for a request (``on_request_begin``/``on_request_end``), which name the request, the KV
  cache group and, for frees, the reason, so the block-level events name them too;
- ``on_decision(kind, request_id, **fields)`` from the scheduler, the KV cache manager, the
  connector and the engine, for decisions about a request (``kind`` is an ``EventKind`` value).

Nothing in kvcore is wrapped or patched; with no recorder attached kvcore calls nothing.

The recorder also keeps what the pool itself does not need: what each block hash stands for
(``hash_meta``: parent hash, tokens, extra keys), for the hash chains the player draws and the
invariant checks.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Optional, Sequence

from kvcore.core.kv_cache_inspect import (
    block_cache_keys,
    free_queue_block_ids,
    free_queue_head,
    free_queue_next,
    in_free_queue,
)
from kvcore.core.kv_cache_observer import KVCacheObserver
from kvcore.core.kv_cache_utils import KVCacheBlock, get_block_hash, get_group_id
from paged_kv_lab.recording.events import (
    EVENT_TYPES,
    Allocated,
    Cached,
    CachedPartial,
    Event,
    Evicted,
    Freed,
    PrefixCacheReset,
    Touched,
)

_BY_KIND: dict[str, type[Event]] = {k.value: cls for k, cls in EVENT_TYPES.items()}
_ID = attrgetter("block_id")


@dataclass
class HashMeta:
    """What a block hash stands for: parent hash, the tokens it hashes, extra keys. With hashes
    finer than the block (``prefix_match_unit``, or KV cache groups of different block sizes,
    whose hash unit is their greatest common divisor) those are one hash unit's, and
    ``blocks[block_size]`` says what the player draws for a block of that size keyed by this hash:
    (the key of the block before, the block's tokens up to the key's boundary). The same hash keys
    blocks of several sizes where the groups' sizes differ (each group its own), so each size has
    its own entry; a block whose size is the hash unit has none (the hash's own are its)."""

    parent: Optional[bytes]
    token_ids: tuple[int, ...]
    extra_keys: Optional[tuple] = None
    blocks: dict[int, tuple[Optional[bytes], tuple[int, ...]]] = field(default_factory=dict)


class Recorder(KVCacheObserver):
    """Collects the events of the current step, in the order the decisions were made.

    Invariant: ``events`` holds exactly the decisions since the last ``drain``, each naming its
    request and group as the innermost open request scope did (None outside any scope).
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.hash_meta: dict[bytes, HashMeta] = {}
        # Whom the pool works for right now: (request id, group, the reason a free gives), and
        # the enclosing scopes' (kvcore opens and closes them in nested order).
        self._context: tuple[Optional[str], Optional[int], str] = (None, None, "")
        self._outer: list[tuple[Optional[str], Optional[int], str]] = []
        self._evicted: list[tuple[int, bytes]] = []  # evicted by the allocation in progress
        self.block_pool = None
        # Where a revived block stood in the free queue, without walking it (on_blocks_touched):
        # each block entering the queue gets a key, increasing towards the tail; keys between the
        # head's and the tail's that are no longer in the queue were taken out of the middle.
        self._qkey: dict[int, int] = {}
        self._hi = -1  # the largest key given so far
        self._holes: list[int] = []

    # -- attaching ---------------------------------------------------------------------
    def attach(self, kv_cache_manager) -> "Recorder":
        """Observe a KVCacheManager: its pool, the managers over it, the scheduler over those
        and any connector bound to the pool all tell the pool's observer."""
        return self.attach_block_pool(kv_cache_manager.block_pool)

    def attach_block_pool(self, pool) -> "Recorder":
        """Observe a BlockPool (a lone one's events name no request)."""
        pool.observer = self
        self.block_pool = pool
        free = free_queue_block_ids(pool)
        self._qkey = {bid: k for k, bid in enumerate(free)}
        self._hi, self._holes = len(free) - 1, []
        return self

    # -- whom the pool works for ----------------------------------------------------------
    def on_request_begin(
        self, request_id: Optional[str], group: Optional[int], reason: Optional[str] = None
    ) -> None:
        outer = self._context
        if reason is None:
            reason = outer[2] if outer[0] == request_id else ""
        self._outer.append(outer)
        self._context = (request_id, group, reason)

    def on_request_end(self) -> None:
        self._context = self._outer.pop()

    # -- decisions about a request --------------------------------------------------------
    def on_decision(self, kind: str, request_id: Optional[str], **fields: Any) -> None:
        if kind == "copied" and self.block_pool is not None:
            # the cache entries a copy took over (none when the request's own table gets it)
            dst = self.block_pool.blocks[fields["block_ids"][0]]
            fields["block_hashes"] = tuple(k.hex() for k in self._keys_of(dst))
        self.events.append(_BY_KIND[kind](request_id=request_id, **fields))

    def _keys_of(self, block: KVCacheBlock) -> list[bytes]:
        """The raw hashes of every key the block carries, its primary one first."""
        return [get_block_hash(k) for k in block_cache_keys(self.block_pool, block.block_id)]

    # -- block-level hooks (BlockPool) -----------------------------------------------------
    def on_block_evicted(self, block: KVCacheBlock) -> None:
        keys = block_cache_keys(self.block_pool, block.block_id)
        if block.ref_cnt == 0 and not in_free_queue(block):
            # Popped from the queue head by get_new_blocks: reported with that allocation.
            bid = block.block_id
            self._evicted.extend((bid, k) for k in keys)
            return
        for k in keys:
            self.events.append(
                Evicted(
                    block_ids=(block.block_id,),
                    group=get_group_id(k),
                    block_hash=get_block_hash(k).hex(),
                    reason="evict_blocks",
                )
            )

    def on_block_rekeyed(self, block: KVCacheBlock, keys: Sequence[bytes]) -> None:
        request_id = self._context[0]
        for k in keys:
            self.events.append(
                Evicted(
                    request_id=request_id,
                    block_ids=(block.block_id,),
                    group=get_group_id(k),
                    block_hash=get_block_hash(k).hex(),
                    reason="rekeyed",
                )
            )

    def on_blocks_allocated(self, blocks: Sequence[KVCacheBlock]) -> None:
        request_id, group, _ = self._context
        evicted, self._evicted = self._evicted, []
        hexes: dict[int, str] = {}
        for bid, key in evicted:  # a block's primary key first (partial entries after it)
            hexes.setdefault(bid, get_block_hash(key).hex())
        for bid, key in evicted:
            self.events.append(
                Evicted(
                    request_id=request_id,
                    block_ids=(bid,),
                    group=get_group_id(key),
                    block_hash=get_block_hash(key).hex(),
                    reason="reused from queue head",
                )
            )
        self.events.append(
            Allocated(
                request_id=request_id,
                block_ids=tuple(map(_ID, blocks)),
                group=group,
                queue_positions=tuple(range(len(blocks))),
                evicted_hashes=hexes,
            )
        )

    def on_blocks_touched(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Called before the blocks leave the queue, so their positions can still be read.

        A block's position is how many free blocks stand before it: every key from the head's up
        to its own belongs to a block in the queue, except the keys of blocks taken out of the
        middle (``_holes``, sorted). So no walk along the queue: a lookup and a bisect per block.
        """
        request_id, group, _ = self._context
        from_queue = [b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null]
        positions: tuple[int, ...] = ()
        if from_queue:
            qkey, holes = self._qkey, self._holes
            lo = qkey[free_queue_head(self.block_pool)]
            if holes and holes[0] < lo:
                del holes[: bisect_left(holes, lo)]  # left behind by the head: forget them
            keys = list(map(qkey.__getitem__, from_queue))
            first, last = min(keys), max(keys)
            run = last - first == len(keys) - 1  # distinct keys: a run of consecutive ones
            at = bisect_left(holes, first)
            if run and at == bisect_left(holes, last):
                # The usual case (a request's blocks were freed together): no hole among them, so
                # the same number of holes stands before each, and they go in as one run.
                positions = tuple(map((lo + at).__rsub__, keys))
                holes[at:at] = range(first, last + 1)
            else:
                positions = tuple(k - lo - bisect_left(holes, k) for k in keys)
                holes.extend(keys)
                holes.sort()
        from_queue = tuple(from_queue)
        self.events.append(
            Touched(
                request_id=request_id,
                group=group,
                from_queue=from_queue,
                queue_positions=positions,
                block_ids=from_queue if len(from_queue) == len(blocks) else tuple(map(_ID, blocks)),
            )
        )

    def on_blocks_freed(
        self,
        blocks: Sequence[KVCacheBlock],
        to_head: Sequence[KVCacheBlock],
        to_tail: Sequence[KVCacheBlock],
    ) -> None:
        request_id, group, reason = self._context
        head_ids = tuple(map(_ID, to_head)) if to_head else ()
        tail_ids = tuple(map(_ID, to_tail)) if to_tail else ()
        if head_ids or tail_ids:
            self._key_new_queue_entries(head_ids, tail_ids)
        # the common case: every block joined the queue
        if len(head_ids) + len(tail_ids) == len(blocks):
            ids = (
                head_ids if not tail_ids else tail_ids if not head_ids else tuple(map(_ID, blocks))
            )
            still_used: tuple[int, ...] = ()
        else:
            ids = tuple(b.block_id for b in blocks if not b.is_null)
            still_used = tuple(b.block_id for b in blocks if b.ref_cnt > 0 and not b.is_null)
        self.events.append(
            Freed(
                request_id=request_id,
                block_ids=ids,
                group=group,
                to_head=head_ids,
                to_tail=tail_ids,
                still_used=still_used,
                reason=reason,
            )
        )

    def _key_new_queue_entries(self, head_ids: tuple[int, ...], tail_ids: tuple[int, ...]) -> None:
        """Keys for blocks that just joined the queue: the head's go just below the old head's key,
        the tail's above every key given so far (so the keys of blocks taken from the middle stay
        holes between them)."""
        qkey, holes = self._qkey, self._holes
        pool = self.block_pool
        if pool.get_num_free_blocks() == len(head_ids) + len(tail_ids):  # was empty: start anew
            holes.clear()
            base = self._hi + 1
            qkey.update(zip(head_ids + tail_ids, range(base, base + len(head_ids) + len(tail_ids))))
            self._hi = base + len(head_ids) + len(tail_ids) - 1
            return
        if head_ids:
            # the old head now stands right after the blocks put before it
            old_head = qkey[free_queue_next(pool, head_ids[-1])]
            del holes[: bisect_left(holes, old_head)]  # below the old head: stale
            qkey.update(zip(head_ids, range(old_head - len(head_ids), old_head)))
        if tail_ids:
            qkey.update(zip(tail_ids, range(self._hi + 1, self._hi + 1 + len(tail_ids))))
            self._hi += len(tail_ids)

    def _remember(self, request, raw: bytes, num_tokens: int, block_size: int) -> None:
        """What ``raw``, the request's hash at the prefix boundary ``num_tokens``, stands for."""
        hashes = request.block_hashes
        unit = self.block_pool.hash_block_size if self.block_pool is not None else block_size
        meta = self.hash_meta.get(raw)
        if meta is None:
            j = num_tokens // unit - 1
            meta = HashMeta(
                hashes[j - 1] if j else None,
                tuple(request.all_token_ids[j * unit : (j + 1) * unit]),
                request.extra_keys_for_block(j),
            )
            self.hash_meta[raw] = meta
        if unit != block_size and block_size not in meta.blocks:
            start = (num_tokens - 1) // block_size * block_size
            meta.blocks[block_size] = (
                hashes[start // unit - 1] if start else None,
                tuple(request.all_token_ids[start:num_tokens]),
            )

    def on_block_cached_partial(
        self, request, block: KVCacheBlock, key: bytes, num_tokens: int, block_size: int
    ) -> None:
        raw = get_block_hash(key)
        self._remember(request, raw, num_tokens, block_size)
        self.events.append(
            CachedPartial(
                request_id=request.request_id,
                block_ids=(block.block_id,),
                group=get_group_id(key),
                block_hash=raw.hex(),
                num_tokens=num_tokens,
            )
        )

    def on_blocks_cached(self, request, blocks: Sequence[KVCacheBlock], block_size: int) -> None:
        raws = []
        for blk in blocks:
            raw = get_block_hash(blk.block_hash)
            raws.append(raw)
            self._remember(request, raw, blk.block_hash_num_tokens, block_size)
        self.events.append(
            Cached(
                request_id=request.request_id,
                block_ids=tuple(b.block_id for b in blocks),
                group=get_group_id(blocks[0].block_hash),
                block_hashes=tuple(r.hex() for r in raws),
                num_tokens=len(blocks) * block_size,
            )
        )

    def on_prefix_cache_reset(self, ok: bool, blocks_in_use: int) -> None:
        if ok:
            # hash_meta stays: what a hash stands for never changes, and a hash seen again later
            # (the same tokens cached anew) finds its record.
            self.events.append(PrefixCacheReset(ok=True))
        else:
            self.events.append(PrefixCacheReset(ok=False, blocks_in_use=blocks_in_use))

    # -- reading -------------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        """Record an event made outside kvcore (the engine driver's own decisions)."""
        self.events.append(event)

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out
