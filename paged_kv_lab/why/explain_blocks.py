"""The life of a block and two requests side by side, from a recorded run only.

``life_of_block`` replays every event that touched one physical block (allocations, hits,
hashes it got and lost, frees) and keeps its state at the end of each step: the states are
what the recorded snapshots say (tests/lab/test_explain.py checks it on random runs).
``compare_requests`` aligns two requests' hash chains block by block and finds the blocks they
shared and for how long. Sentences for both live in ``paged_kv_lab.why.explain_text``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from paged_kv_lab.recording import events as E
from paged_kv_lab.recording.snapshot import Snapshot
from paged_kv_lab.text.i18n import Text
from paged_kv_lab.why.explain import (
    EXTRA_KEYS,
    SALT,
    TOKENS_DIFFER,
    CacheHistory,
    ExplainError,
    RecordedSteps,
    all_tokens,
    block_keys,
    chain_of,
    has_hashes,
    request_list,
    salt_key,
)


# -- 2. the life of a block -------------------------------------------------------------------
@dataclass(frozen=True)
class BlockMoment:
    """One event that touched the block, with its state right after: ``ref_cnt``, the hash it
    carries (``block_hash``, hex) and the hash it lost (``lost_hash``, evictions and resets).
    ``logical_index`` is its place in ``request_id``'s block table (allocations, hits);
    ``queue_pos`` where it left the free queue (0 = head) or, freed, whether it joined at the
    head ("head") or the tail ("tail")."""

    step: int
    kind: str
    request_id: Optional[str]
    ref_cnt: int
    block_hash: Optional[str]
    group: Optional[int] = None
    logical_index: Optional[int] = None
    lost_hash: Optional[str] = None
    queue_pos: Optional[int] = None
    joined: str = ""
    reason: str = ""
    prefix_text: Optional[str] = None
    token_ids: tuple[int, ...] = ()
    num_tokens: Optional[int] = None  # cached_partial: the boundary it is keyed at
    entry_hash: Optional[str] = None  # cached_partial: the entry's hash (maybe not its first)
    source_block_id: Optional[int] = None  # copied: the block it copies
    copy_block_id: Optional[int] = None  # copy_source: the block that copies it


@dataclass(frozen=True)
class BlockState:
    """The block at the end of a step, as the events say (ref_cnt, hash, owners) and where the
    recorded snapshot put it in the free queue (``queue_pos``, None while in use)."""

    step: int
    ref_cnt: int
    block_hash: Optional[str]
    owners: tuple[str, ...]
    queue_pos: Optional[int]


@dataclass(frozen=True)
class BlockLife:
    block_id: int
    is_null: bool
    moments: tuple[BlockMoment, ...]
    states: tuple[BlockState, ...]  # one per step, step 0 = before step 1 (when recorded)


def _index_in_table(
    snap: Snapshot, rid: Optional[str], bid: int, group: Optional[int]
) -> Optional[int]:
    rv = next((r for r in snap.requests if r.request_id == rid), None)
    if rv is None:
        return None
    tables = rv.block_tables if group is None else rv.block_tables[group : group + 1]
    for t in tables:
        if bid in t:
            return t.index(bid)
    return None


def _place_in_table(run: RecordedSteps, step: int, ev, block_id: int) -> Optional[int]:
    """A block's logical index when given (hit or allocated): the request's table length before
    the step, plus the blocks it got (hits, then new ones) in this group earlier in the step, plus
    its place in ``ev``."""
    before = run.snapshot_before(step)
    rv = (
        next((r for r in before.requests if r.request_id == ev.request_id), None)
        if before
        else None
    )
    g = ev.group or 0
    start = len(rv.block_tables[g]) if rv is not None and g < len(rv.block_tables) else 0
    earlier = 0
    for e in run.records[step - 1].events:
        if e is ev:
            break
        if (
            e.kind in (E.ALLOCATED, E.TOUCHED)
            and e.request_id == ev.request_id
            and (e.group or 0) == g
        ):
            earlier += len(e.block_ids)
    return start + earlier + ev.block_ids.index(block_id)


def life_of_block(run: RecordedSteps, block_id: int) -> BlockLife:
    """The block's story, replayed from the events; its states agree with every snapshot."""
    snap0 = run.initial or (run.records[0].snapshot if run.records else None)
    if snap0 is None or not 0 <= block_id < len(snap0.blocks):
        n = len(snap0.blocks) if snap0 else 0
        raise ExplainError(Text("why.error.no_block", {"b": block_id, "last": n - 1}))
    if run.initial is None:
        raise ExplainError(Text("why.error.no_header"))
    b0 = run.initial.blocks[block_id]
    ref, h, owners = b0.ref_cnt, b0.block_hash, list(b0.owners)
    moments: list[BlockMoment] = []
    states = [BlockState(0, ref, h, tuple(sorted(owners)), b0.queue_pos)]
    views = run.request_views()
    bs = run.block_size()
    index_of: dict[Optional[str], Optional[int]] = {}  # request -> this block's place in its table
    for rec in run.records:
        snap = rec.snapshot
        for ev in rec.events:
            source = ev.kind == E.COPIED and ev.source_block_id == block_id
            if b0.is_null or (block_id not in ev.block_ids and ev.kind != E.RESET and not source):
                continue
            rid, kw = ev.request_id, {}
            kind = ev.kind.value
            if source:
                # the copy holds the block until the worker ran it: a reference of its own, or
                # (a hit) the one the request's table gave up to the copy
                kind, kw = "copy_source", dict(reason=ev.reason, copy_block_id=ev.block_ids[0])
                if ev.reason == "keep_cached":
                    ref += 1
                    h = None  # its entries move to the copy
                elif rid in owners:
                    owners.remove(rid)
            elif ev.kind == E.COPIED:
                kw = dict(reason=ev.reason, source_block_id=ev.source_block_id)
                if ev.reason == "keep_cached":
                    h = ev.block_hashes[0] if ev.block_hashes else h
                    if rid in owners:
                        owners.remove(rid)  # allocated for the copy, not for the request's table
                else:
                    ref += 1
            elif ev.kind == E.CACHED_PARTIAL:
                h = h or ev.block_hash
                kw = dict(num_tokens=ev.num_tokens, entry_hash=ev.block_hash)
            elif rid is None and ev.kind in (E.TOUCHED, E.FREED):
                # the CPU tier pins a block while it copies it, and releases it after (a block
                # several of the step's tail-block copies held is released once per copy)
                ref += 1 if ev.kind == E.TOUCHED else -ev.block_ids.count(block_id)
                kw = dict(reason=getattr(ev, "reason", "offload") or "offload")
            elif ev.kind in (E.ALLOCATED, E.TOUCHED):
                ref += 1
                owners.append(rid)
                # its place in the table after the step; a request that finished in this step
                # has no table left, so the place is counted from the allocation itself
                idx = _index_in_table(snap, rid, block_id, ev.group)
                if idx is None:
                    idx = _place_in_table(run, rec.step, ev, block_id)
                index_of[rid] = idx
                left = ev.block_ids if ev.kind == E.ALLOCATED else ev.from_queue
                qp = dict(zip(left, ev.queue_positions)).get(block_id)
                kw = dict(logical_index=idx, queue_pos=qp)
            elif ev.kind == E.CACHED:
                h = ev.block_hashes[ev.block_ids.index(block_id)]
                idx = index_of.get(rid)
                toks = all_tokens(views[rid]) if rid in views else ()
                prefix = toks[: (idx + 1) * bs] if idx is not None else ()
                kw = dict(
                    logical_index=idx, prefix_text=run.text(prefix), token_ids=tuple(prefix[-bs:])
                )
            elif ev.kind == E.EVICTED:
                kw, h = dict(lost_hash=h, reason=ev.reason), None
            elif ev.kind == E.RESET:
                if not ev.ok or h is None:
                    continue
                kw, h = dict(lost_hash=h, reason="reset"), None
            elif ev.kind == E.FREED:
                ref -= 1
                if rid in owners:
                    owners.remove(rid)
                joined = (
                    "head" if block_id in ev.to_head else "tail" if block_id in ev.to_tail else ""
                )
                kw = dict(joined=joined, reason=ev.reason)
            elif ev.kind == E.WINDOW_SKIPPED:
                kw = dict(reason="window")
            else:
                continue
            moments.append(
                BlockMoment(
                    step=rec.step,
                    kind=kind,
                    request_id=rid,
                    ref_cnt=ref,
                    block_hash=h,
                    group=ev.group,
                    **kw,
                )
            )
        states.append(
            BlockState(rec.step, ref, h, tuple(sorted(owners)), snap.blocks[block_id].queue_pos)
        )
    return BlockLife(block_id, b0.is_null, tuple(moments), tuple(states))


# -- 3. two requests side by side -------------------------------------------------------------
@dataclass(frozen=True)
class SharedSpan:
    """Physical block ``block_id`` sat in both requests' tables (at ``index`` in the first's)
    from the end of ``first_step`` to the end of ``last_step``."""

    block_id: int
    index: Optional[int]
    first_step: int
    last_step: int


@dataclass(frozen=True)
class ChainRow:
    """Logical block ``index`` of both chains (None where a chain has no full block there)."""

    index: int
    hash_a: Optional[str]
    hash_b: Optional[str]
    tokens_a: tuple[int, ...]
    tokens_b: tuple[int, ...]
    shared: tuple[SharedSpan, ...] = ()
    lost_steps: tuple[int, ...] = ()  # same hash: steps where a block holding it lost it
    blocks_a: tuple[int, ...] = ()  # physical blocks that held this logical block of a, in order
    blocks_b: tuple[int, ...] = ()

    @property
    def same(self) -> bool:
        return self.hash_a is not None and self.hash_a == self.hash_b


@dataclass(frozen=True)
class Comparison:
    """Two requests' chains aligned; ``diverge_index`` is the first row whose hashes differ
    (None when one chain is a prefix of the other), for ``reason`` salt / extra_keys /
    tokens_differ."""

    a: str
    b: str
    rows: tuple[ChainRow, ...]
    diverge_index: Optional[int]
    reason: Optional[str]
    token_position: Optional[int]
    salt_a: Optional[str]
    salt_b: Optional[str]
    shared: tuple[SharedSpan, ...]
    text_before: Optional[str] = None
    text_a: Optional[str] = None
    text_b: Optional[str] = None
    keys_a: Optional[str] = None  # extra_keys: the diverging block's extra keys in each chain
    keys_b: Optional[str] = None


def compare_requests(run: RecordedSteps, a: str, b: str) -> Comparison:
    views = run.request_views()
    for rid in (a, b):
        if rid not in views:
            raise ExplainError(
                Text("why.error.no_request", {"rid": rid, "ids": request_list(views)})
            )
    if not has_hashes((views[a], views[b])):
        raise ExplainError(Text("why.error.no_hashes"))
    bs, g = run.block_size(), run.primary_group()
    ta, tb = all_tokens(views[a]), all_tokens(views[b])
    sa, sb = salt_key(views[a].cache_salt), salt_key(views[b].cache_salt)
    unit = run.hash_unit()
    ca = chain_of(views[a], len(ta), bs, unit)
    cb = chain_of(views[b], len(tb), bs, unit)
    spans: dict[int, list[int]] = {}
    index: dict[int, Optional[int]] = {}
    held: dict[tuple[str, int], list[int]] = {}  # (request, logical index) -> physical blocks
    for rec in run.records:
        for rv in rec.snapshot.requests:
            if rv.request_id in (a, b) and g < len(rv.block_tables):
                for i, bid in enumerate(rv.block_tables[g]):
                    seen = held.setdefault((rv.request_id, i), [])
                    if bid != 0 and (not seen or seen[-1] != bid):
                        seen.append(bid)
        for blk in rec.snapshot.blocks:
            if a in blk.owners and b in blk.owners:
                cur = spans.get(blk.block_id)
                if cur and cur[-1][1] == rec.step - 1:
                    cur[-1][1] = rec.step
                else:
                    spans.setdefault(blk.block_id, []).append([rec.step, rec.step])
                    index.setdefault(
                        blk.block_id, _index_in_table(rec.snapshot, a, blk.block_id, None)
                    )
    shared = tuple(
        sorted(
            (SharedSpan(bid, index.get(bid), s, e) for bid, ss in spans.items() for s, e in ss),
            key=lambda sp: (sp.index if sp.index is not None else 1 << 30, sp.first_step),
        )
    )
    history = CacheHistory(run)
    rows = []
    for i in range(max(len(ca), len(cb))):
        ha = ca[i] if i < len(ca) else None
        hb = cb[i] if i < len(cb) else None
        lost = ()
        if ha is not None and ha == hb:
            lost = tuple(
                e.pos[0] for e in history.entries.get(f"{ha}@{g}", ()) if e.action != "cached"
            )
        rows.append(
            ChainRow(
                i,
                ha,
                hb,
                tuple(ta[i * bs : (i + 1) * bs]) if ha else (),
                tuple(tb[i * bs : (i + 1) * bs]) if hb else (),
                tuple(sp for sp in shared if sp.index == i),
                lost,
                tuple(held.get((a, i), ())),
                tuple(held.get((b, i), ())),
            )
        )
    div = next((r.index for r in rows if r.hash_a and r.hash_b and r.hash_a != r.hash_b), None)
    reason = p = None
    texts: dict = {}
    if div is not None:
        lcp = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        if sa != sb and lcp >= (div + 1) * bs:
            reason = SALT
        elif lcp >= (div + 1) * bs:  # same tokens and salt: the extra keys differ
            reason = EXTRA_KEYS
            texts = dict(keys_a=block_keys(views[a], div, bs, unit))
            texts["keys_b"] = block_keys(views[b], div, bs, unit)
        else:
            reason, p = TOKENS_DIFFER, lcp
            lo, hi = max(0, p - 8), p + 8
            texts = dict(
                text_before=run.text(ta[lo:p]), text_a=run.text(ta[p:hi]), text_b=run.text(tb[p:hi])
            )
    return Comparison(a, b, tuple(rows), div, reason, p, sa, sb, shared, **texts)
