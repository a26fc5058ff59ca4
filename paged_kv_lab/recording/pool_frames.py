"""A large pool's steps recorded as keyframes plus deltas, for the large-pool player.

A lesson's StepRecord holds a whole Snapshot per step (recording/snapshot.py): fine for 32 blocks,
not for a replayed trace on a pool of 10,000. ``FrameRecorder`` records, after each step, only
what the large view draws and only what changed: the blocks whose ref_cnt, hash or owners moved,
the requests whose state moved, a summary of the free queue (a window at its head and one at its
tail, counts by kind) and the step's scalars. Every ``keyframe_every`` steps (and at the first
recorded step) the frame holds every block that is not plain free, and every request shown, so
any step is the nearest keyframe at or before it plus the deltas after it.

Invariant (tests/lab/test_workloads_frames.py): applying the frames in order from a keyframe gives,
for every block, the ref_cnt, hash and owners that ``take_snapshot`` reads from the live engine
at that step (and, for a block a request holds, the tokens it holds there, at most its own KV
cache group's block size), and for every shown request its status, counters and block table.
Where the groups' block sizes differ, each block also carries its group (the table holding it,
else its cached hash's), and that group's size is the one its tokens are counted against. A
block's parent shows from the first frame after a shown request held a cached block of its hash,
past its table's first position, at a step since the recorder's first (``follow``ed or
captured), in keyframes and deltas alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Optional

from kvcore.core.kv_cache_inspect import (
    block_tables,
    free_queue_ends,
    waiting_request_ids,
    waiting_request_queues,
)
from kvcore.core.kv_cache_observer import KVCacheObserver
from kvcore.core.kv_cache_utils import get_block_hash, get_group_id
from paged_kv_lab.recording import events as E
from paged_kv_lab.recording.events import AnyEvent

HASH_HEX = 16  # hex digits of a block hash the large view keeps (the first 64 bits)
QUEUE_WINDOW = 16  # blocks shown at each end of the free queue


@dataclass(frozen=True)
class BlockState:
    """One block as the large view shows it. A block not listed in a keyframe is plain free:
    ref_cnt 0, no hash, no owners."""

    block_id: int
    ref_cnt: int
    block_hash: Optional[str]  # first HASH_HEX hex digits; None if not cached
    parent_hash: Optional[str]  # the parent's, when known (a block cached while recorded)
    num_tokens: int  # tokens whose K/V it holds
    owners: tuple[str, ...]
    # the KV cache group it serves (the table holding it, else its hash's group), kept only where
    # the groups' block sizes differ (``FrameRecorder.sizes_differ``); None otherwise
    group: Optional[int] = None


@dataclass(frozen=True)
class RequestState:
    """A request as the large view's tables show it (per KV cache group: its block table)."""

    request_id: str
    status: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    block_tables: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class QueueSummary:
    """The free queue (head = next to be reused) without listing it: its two ends and counts."""

    head: tuple[int, ...]
    tail: tuple[int, ...]
    num_free: int
    num_cached_free: int  # free blocks that still hold a hash (evictable cache)


@dataclass(frozen=True)
class PoolFrame:
    """One recorded step. ``keyframe``: ``blocks`` / ``requests`` are the whole state (blocks not
    listed are plain free); otherwise they are what changed since the step before, and ``gone``
    the requests no longer shown."""

    step: int
    keyframe: bool
    scheduled: dict[str, int]
    events: tuple[AnyEvent, ...]
    blocks: tuple[BlockState, ...]
    requests: tuple[RequestState, ...]
    gone: tuple[str, ...]
    queue: QueueSummary
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    usage: float
    prefix_cache: dict[str, Any] = field(default_factory=dict)
    # Snapshot.waiting_queues: beside ``waiting``, the vLLM 0.34 queue of each; empty where
    # every waiting request is in plain "waiting"
    waiting_queues: tuple[str, ...] = ()


def _hex(block_hash) -> Optional[str]:
    return None if block_hash is None else get_block_hash(block_hash).hex()[:HASH_HEX]


class FrameRecorder:
    """Turns a live scheduler's steps into PoolFrames (call ``capture`` after each step).

    Keeps the last recorded state of every block and shown request, so each frame lists only
    what differs from it. The owners index is rebuilt from the requests' block tables each step
    (O(blocks held)); blocks are read only where an event or an owner change touched them."""

    def __init__(self, scheduler, keyframe_every: int = 32) -> None:
        self.scheduler = scheduler
        self.kvm = scheduler.kv_cache_manager
        self.pool = self.kvm.block_pool
        self.block_size = self.kvm.block_size
        # each group's own block size (the scheduler's block_size is their least common multiple)
        self.group_block_sizes = self.kvm.coordinator.group_block_sizes
        # the same rule as a Snapshot's group_block_sizes: only where a group's size is not the
        # scheduler's does a block carry its group (a run of one size records as before)
        self.sizes_differ = any(s != self.block_size for s in self.group_block_sizes)
        self.groups = tuple(g.to_dict() for g in self.kvm.kv_cache_config.kv_cache_groups)
        self.keyframe_every = max(1, keyframe_every)
        self.blocks: dict[int, BlockState] = {}
        self.requests: dict[str, RequestState] = {}
        self.parents: dict[str, str] = {}  # hash hex -> parent hash hex
        self.frames: list[PoolFrame] = []
        self._owners: dict[int, tuple[str, ...]] = {}
        self._held: dict[int, int] = {}  # the tokens held per block at the last capture
        self._group: dict[int, int] = {}  # held block -> its group (only where sizes differ)
        self._new_parents: set[str] = set()  # hashes whose parent was learned since then
        # (request id, group) -> how many leading positions of its block table were read with
        # their blocks cached, and that table (``_owners_now``)
        self._parented: dict[tuple[str, int], tuple[int, tuple[int, ...]]] = {}
        self._num_cached_free = 0

    # -- reading the live engine --------------------------------------------------------------
    def _shown(self, finished: dict) -> dict:
        """The requests the view lists: unfinished ones, and those that finished this step."""
        return {**self.scheduler.requests, **finished}

    def _owners_now(
        self, reqs: dict, tables: dict[str, tuple[tuple[int, ...], ...]]
    ) -> tuple[dict[int, tuple[str, ...]], dict[int, int]]:
        """Per block held by a shown request: its owners (in the requests' order) and the most
        tokens any of them holds in it (a position below the request's computed tokens' last
        block is full, that block holds the rest, any later one none)."""
        owners: dict[int, tuple[str, ...]] = {}
        held: dict[int, int] = {}
        group = self._group
        group.clear()
        null = self.pool.null_block.block_id
        for rid, req in reqs.items():
            hashes = req.block_hashes
            one = (rid,)
            for g, table in enumerate(tables[rid]):
                bs = self.group_block_sizes[g]
                full, part = divmod(req.num_computed_tokens, bs)
                if self.sizes_differ:
                    group.update(dict.fromkeys(table, g))
                known = len(owners)
                if null not in table and owners.keys().isdisjoint(table):
                    # blocks no request before holds (most): all at once
                    owners.update(zip(table, repeat(one)))
                    if len(owners) - known != len(table):  # a block twice in the table
                        for bid in set(table):
                            owners[bid] = one * table.count(bid)
                else:
                    for bid in table:
                        if bid != null:
                            owners[bid] = owners.get(bid, ()) + one
                if null in table:
                    for i, bid in enumerate(table):
                        n = bs if i < full else (part if i == full else 0)
                        if bid != null and n > held.get(bid, -1):
                            held[bid] = n
                else:
                    held.update(dict.fromkeys(table[:full], bs))
                    if full < len(table):
                        bid = table[full]
                        if part > held.get(bid, -1):
                            held[bid] = part
                        for bid in table[full + 1 :]:
                            held.setdefault(bid, 0)
                self._learn_parents(rid, g, table, hashes)
        group.pop(null, None)
        return owners, held

    def _learn_parents(self, rid: str, g: int, table: tuple[int, ...], hashes) -> None:
        """The parents of the cached blocks in ``rid``'s block table of group ``g``."""
        blocks, null, parents = self.pool.blocks, self.pool.null_block.block_id, self.parents
        # The first ``done`` positions of the table as last read held cached blocks: their
        # hashes are in ``parents`` already, which only grows (a request's hashes are fixed
        # once made), so where the table still starts with those blocks, reading them again
        # adds nothing.
        done, before = self._parented.get((rid, g), (0, ()))
        if done and table[:done] != before[:done]:
            done = 0
        for i in range(done, min(len(table), len(hashes))):
            bid = table[i]
            if bid == null or blocks[bid].block_hash is None:
                continue
            if i == done:
                done += 1
            h = hashes[i].hex()[:HASH_HEX]
            if i > 0 and h not in parents:
                parents[h] = hashes[i - 1].hex()[:HASH_HEX]
                self._new_parents.add(h)
        self._parented[(rid, g)] = (done, table)

    def _block(self, bid: int, owners, held) -> BlockState:
        blk = self.pool.blocks[bid]
        h = _hex(blk.block_hash)
        n = held.get(bid)
        if n is None:
            n = self.group_block_sizes[get_group_id(blk.block_hash)] if h is not None else 0
        g = None
        if self.sizes_differ:
            g = self._group.get(bid)
            if g is None and h is not None:
                g = get_group_id(blk.block_hash)
        return BlockState(
            bid,
            0 if blk.is_null else blk.ref_cnt,
            h,
            self.parents.get(h) if h is not None else None,
            n,
            owners.get(bid, ()),
            g,
        )

    def _request(self, req, tables: tuple[tuple[int, ...], ...]) -> RequestState:
        return RequestState(
            req.request_id,
            req.status.value,
            req.num_prompt_tokens,
            req.num_output_tokens,
            req.num_computed_tokens,
            max(req.num_cached_tokens, 0),
            req.num_preemptions,
            tables,
        )

    def _queue(self) -> QueueSummary:
        head, tail = free_queue_ends(self.pool, QUEUE_WINDOW)
        return QueueSummary(head, tail, self.pool.get_num_free_blocks(), self._num_cached_free)

    @staticmethod
    def _cached_free(b: BlockState) -> int:
        return 1 if b.ref_cnt == 0 and b.block_hash is not None and b.block_id != 0 else 0

    # -- recording ---------------------------------------------------------------------------
    def follow(self, finished: Optional[dict] = None) -> None:
        """Learn what ``capture`` would have learned of the blocks' parents after a step, without
        recording a frame (``finished`` as there). A block's parent is known only once a shown
        request held it cached, so the frames of a window that starts later but was followed
        from the same step are those of the window recorded from that step."""
        for rid, req in self._shown(finished or {}).items():
            for g, table in enumerate(block_tables(self.kvm, rid)):
                self._learn_parents(rid, g, table, req.block_hashes)

    def capture(
        self,
        step: int,
        scheduled: dict[str, int],
        events: tuple[AnyEvent, ...] = (),
        finished: Optional[dict] = None,
    ) -> PoolFrame:
        """Record the state after ``step``; ``finished``: request id -> Request for the requests
        that finished in it (the scheduler has already forgotten them)."""
        reqs = self._shown(finished or {})
        tables = {rid: block_tables(self.kvm, rid) for rid in reqs}
        owners, held = self._owners_now(reqs, tables)
        key = not self.frames or (len(self.frames) % self.keyframe_every == 0)
        if key:
            ids = set(owners) | {
                b.block_id for b in self.pool.blocks if b.block_hash is not None or b.ref_cnt
            }
            if not self.blocks:
                ids |= {0}
        else:
            ids = E.changed_block_ids(events)
            ids |= {b for b, _ in owners.items() ^ self._owners.items()}
            # a decode step fills a request's last block with no event and no owner moved; a
            # hash's parent can be learned after a block was cached with it, from a request
            # holding another block of the same hash (vLLM may cache a hash in two blocks)
            ids |= {b for b, _ in held.items() ^ self._held.items()}
            if self._new_parents:
                new = self._new_parents
                ids |= {bid for bid, b in self.blocks.items() if b.block_hash in new}
        changed = []
        for bid in sorted(ids):
            b = self._block(bid, owners, held)
            old = self.blocks.get(bid)
            if old != b or key:
                if old is not None:
                    self._num_cached_free -= self._cached_free(old)
                self._num_cached_free += self._cached_free(b)
                self.blocks[bid] = b
                if key or old != b:
                    changed.append(b)
        if key:
            changed = [
                b for b in changed if b.ref_cnt or b.block_hash or b.owners or b.block_id == 0
            ]
        states = {rid: self._request(r, tables[rid]) for rid, r in reqs.items()}
        gone = tuple(rid for rid in self.requests if rid not in states)
        moved = tuple(s for rid, s in states.items() if key or self.requests.get(rid) != s)
        self.requests = states
        self._owners, self._held = owners, held
        self._new_parents.clear()
        kvm = self.kvm
        queues = waiting_request_queues(self.scheduler)
        frame = PoolFrame(
            step=step,
            keyframe=key,
            scheduled=dict(scheduled),
            events=tuple(events),
            blocks=tuple(changed),
            requests=moved,
            gone=() if key else gone,
            queue=self._queue(),
            waiting=waiting_request_ids(self.scheduler),
            waiting_queues=queues if any(q != "waiting" for q in queues) else (),
            running=tuple(r.request_id for r in self.scheduler.running),
            usage=kvm.usage,
            prefix_cache={
                **kvm.prefix_cache_totals.to_dict(),
                "recent_hit_rate": kvm.caching_metrics.hit_rate,
            },
        )
        self.frames.append(frame)
        return frame


def state_at(
    frames: list[PoolFrame], i: int
) -> tuple[dict[int, BlockState], dict[str, RequestState]]:
    """The blocks (those not plain free) and shown requests after ``frames[i]``: the keyframe at or
    before it plus the deltas after it (what the browser does)."""
    k = max(j for j in range(i + 1) if frames[j].keyframe)
    blocks = {b.block_id: b for b in frames[k].blocks}
    reqs = {r.request_id: r for r in frames[k].requests}
    for f in frames[k + 1 : i + 1]:
        for b in f.blocks:
            blocks[b.block_id] = b
        for rid in f.gone:
            reqs.pop(rid, None)
        for r in f.requests:
            reqs[r.request_id] = r
    return blocks, reqs


# -- a whole replay's cache history, for "why?" -------------------------------------------------
@dataclass(frozen=True, slots=True)
class CacheChange:
    """A hash (the block hash's bytes, as ``Request.block_hashes`` holds them) got cached in
    ``block_id`` for ``request_id``, or lost
    ("evicted": the block was reused, for ``request_id`` when known; "reset": every hash went).
    ``seq`` orders changes and lookups within a step."""

    seq: int
    step: int
    action: str
    block_id: Optional[int]
    request_id: Optional[str]


@dataclass(frozen=True)
class Admission:
    """A request's prefix-cache lookup that admitted it: ``chain`` is the hashes of its full
    blocks at that moment, ``hit_tokens`` what the lookup found (vLLM's num_computed_tokens)."""

    request_id: str
    seq: int
    step: int
    resumed: bool
    num_tokens: int
    hit_tokens: int
    chain: tuple[bytes, ...]


class CacheLog(KVCacheObserver):
    """An observer for a whole replay (the pool's ``observer``): every cache change and every
    admission, nothing per step, so it costs little on a long trace. Set ``step`` before each
    step."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.block_size = scheduler.kv_cache_manager.block_size
        self.step = 0
        self.seq = 0
        self.changes: dict[str, list[CacheChange]] = {}
        self.admissions: dict[str, list[Admission]] = {}
        self._lookup: dict[str, tuple[int, Any]] = {}
        self._cached_in: dict[int, list[tuple[int, str]]] = {}  # block id -> (seq, request)

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def on_blocks_cached(self, request, blocks, block_size: int) -> None:
        rid, step, changes, cached_in = request.request_id, self.step, self.changes, self._cached_in
        for b in blocks:
            self.seq += 1
            changes.setdefault(get_block_hash(b.block_hash), []).append(
                CacheChange(self.seq, step, "cached", b.block_id, rid)
            )
            cached_in.setdefault(b.block_id, []).append((self.seq, rid))

    def on_block_evicted(self, block) -> None:
        self.changes.setdefault(get_block_hash(block.block_hash), []).append(
            CacheChange(self._next(), self.step, "evicted", block.block_id, None)
        )

    def on_prefix_cache_reset(self, ok: bool, blocks_in_use: int) -> None:
        if ok:
            for h, log in self.changes.items():
                log.append(CacheChange(self._next(), self.step, "reset", None, None))

    def on_decision(self, kind: str, request_id: Optional[str], **fields: Any) -> None:
        if kind in ("cache_hit", "cache_miss"):
            req = self.scheduler.requests.get(request_id)
            if req is not None:
                self._lookup[request_id] = (self._next(), req)
        elif kind in ("admitted", "resumed"):
            seq, req = self._lookup.pop(request_id, (self._next(), None))
            n = req.num_tokens if req is not None else 0
            # the tokens at the lookup: a step's own sampled token comes after admission
            chain = tuple(req.block_hashes[: n // self.block_size]) if req is not None else ()
            self.admissions.setdefault(request_id, []).append(
                Admission(
                    request_id,
                    seq,
                    self.step,
                    kind == "resumed",
                    n,
                    int(fields.get("num_cached_tokens", 0)),
                    chain,
                )
            )

    def end_step(self) -> None:
        """Kept for callers that mark step ends; whom an evicted block went to is read lazily
        (``reused_for``)."""

    def reused_for(self, block_id: Optional[int], seq: int) -> Optional[str]:
        """The request that next cached a hash in ``block_id`` after ``seq`` (whom the block was
        evicted for, when that request filled it), else None."""
        for s, rid in self._cached_in.get(block_id, ()):
            if s > seq:
                return rid
        return None
