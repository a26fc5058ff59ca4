"""Myths some articles tell about vLLM's block manager, checked against the live pool.

The myths are data (``myths.yaml``: id, seed article, vLLM 0.34.0 sources) and their sentences are
catalogue entries (``myth.<id>.claim`` / ``.truth`` / ``.live…``). What stays here is the live
check of each myth: a computation on the run's snapshots (and records), keyed by the myth's id in
``LIVE``, that returns the catalogue sentences for its outcome with their fields (``Text``)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field

from paged_kv_lab.content.datafile import fail, load
from paged_kv_lab.content.sources import Source
from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.text.i18n import Text, catalogue, tr

MYTHS_FILE = Path(__file__).with_name("myths.yaml")


@dataclass(frozen=True)
class LruContrast:
    vllm_order: tuple[int, ...]  # the real free queue, head first
    timestamp_order: tuple[int, ...]  # what a last-access-timestamp LRU would evict first
    last_used: dict[int, int]  # block -> last step it was held (-1: never)


def lru_contrast(snaps: Sequence[Snapshot]) -> LruContrast:
    """Compare the real queue with a 'timestamp LRU' over the same history."""
    last: dict[int, int] = {}
    for s in snaps:
        for b in s.blocks:
            if b.ref_cnt > 0 and not b.is_null:
                last[b.block_id] = s.step
    now = snaps[-1]
    q = tuple(now.free_queue)
    ts = tuple(sorted(q, key=lambda bid: (last.get(bid, -1), bid)))
    return LruContrast(q, ts, {bid: last.get(bid, -1) for bid in q})


def free_runs(snap: Snapshot) -> list[tuple[int, int]]:
    """Free blocks grouped into runs of consecutive ids: what a 'fragmentation' metric would
    count."""
    ids = sorted(snap.free_queue)
    runs: list[tuple[int, int]] = []
    for bid in ids:
        if runs and runs[-1][1] == bid - 1:
            runs[-1] = (runs[-1][0], bid)
        else:
            runs.append((bid, bid))
    return runs


def internal_waste(snap: Snapshot) -> tuple[int, int]:
    """(reserved token slots not holding a computed token, reserved slots) over running requests."""
    nulls = {b.block_id for b in snap.blocks if b.is_null}
    held = waste = 0
    for r in snap.requests:
        if r.request_id not in snap.running:
            continue
        for table in r.block_tables:
            real = [b for b in table if b not in nulls]
            if not real:
                continue
            slots = len(table) * snap.block_size
            held += len(real) * snap.block_size
            waste += max(0, slots - r.num_computed_tokens)
    return waste, held


@dataclass(frozen=True)
class WriteTargets:
    shared: tuple[int, ...]  # blocks with ref_cnt > 1 (several block tables point at them)
    shared_unhashed: tuple[int, ...]  # of those, blocks without a hash (v1 never has one)
    written: tuple[int, ...]  # the block each running request writes its next token into
    # of those, blocks with ref_cnt > 1: what copy-on-write would copy
    written_shared: tuple[int, ...]


def write_targets(snap: Snapshot) -> WriteTargets:
    """Which blocks are shared and which are written next: copy-on-write would need the two to
    meet."""
    ref = {b.block_id: b for b in snap.blocks if not b.is_null}
    shared = tuple(sorted(bid for bid, b in ref.items() if b.ref_cnt > 1))
    written = []
    for r in snap.requests:
        if r.request_id not in snap.running:
            continue
        for table in r.block_tables:
            i = r.num_computed_tokens // snap.block_size
            if i < len(table) and table[i] in ref:
                written.append(table[i])
    written = tuple(sorted(set(written)))
    return WriteTargets(
        shared,
        tuple(b for b in shared if ref[b].block_hash is None),
        written,
        tuple(b for b in written if ref[b].ref_cnt > 1),
    )


def hash_map_summary(snap: Snapshot) -> tuple[int, int, Optional[tuple[str, tuple[int, ...]]]]:
    """(hashes, blocks they map to, one entry) of the block pool's flat hash -> blocks map."""
    entries = list(snap.hash_map.items())
    return (
        len(entries),
        sum(len(v) for v in snap.hash_map.values()),
        (entries[0] if entries else None),
    )


@dataclass(frozen=True)
class HashLosses:
    """The cached blocks that lost their hash over a run's records, by the BlockPool call that
    dropped it: (step, block) for each ``get_new_blocks`` pop from the queue head (lazy eviction)
    and each ``evict_blocks`` by id, and the number of successful ``reset_prefix_cache`` calls;
    ``failed_loads``: (step, request) of each request a KV connector's failed load cut back."""

    popped: tuple[tuple[int, int], ...]
    by_id: tuple[tuple[int, int], ...]
    resets: int
    failed_loads: tuple[tuple[int, str], ...] = ()


def hash_losses(records: Sequence[StepRecord]) -> HashLosses:
    popped, by_id, resets, failed = [], [], 0, []
    for rec in records:
        for e in rec.events:
            if e.kind == "evicted" and e.block_ids:
                (by_id if e.reason == "evict_blocks" else popped).append((rec.step, e.block_ids[0]))
            elif e.kind == "reset" and getattr(e, "ok", False):
                resets += 1
            elif e.kind == "kv_load_failed":
                failed.append((rec.step, e.request_id))
    return HashLosses(tuple(popped), tuple(by_id), resets, tuple(failed))


def hit_lengths(snap: Snapshot) -> tuple[int, ...]:
    """Each request's prefix-cache hit (tokens, at its last admission), of those that hit."""
    return tuple(r.num_cached_tokens for r in snap.requests if r.num_cached_tokens > 0)


def cached_within_tokens(snap: Snapshot) -> list[tuple[str, int, int]]:
    """(request, blocks in its first table with a hash, full blocks of the tokens it really holds:
    prompt + output) for each request holding blocks: caching stops at ``request.num_tokens``."""
    out = []
    by_id = {b.block_id: b for b in snap.blocks}
    for r in snap.requests:
        if not r.block_tables or not r.block_tables[0]:
            continue
        hashed = sum(
            1
            for bid in r.block_tables[0]
            if not by_id[bid].is_null and by_id[bid].block_hash is not None
        )
        out.append(
            (r.request_id, hashed, (r.num_prompt_tokens + r.num_output_tokens) // snap.block_size)
        )
    return out


def delayed_for_transfer(snaps: Sequence[Snapshot]) -> Optional[tuple[int, str, list[int], int]]:
    """The first request seen waiting for remote K/V with blocks that have no hash: (step, request,
    those blocks, the step where the first of them got one; 0: not yet)."""
    for i, sn in enumerate(snaps):
        by_id = {b.block_id: b for b in sn.blocks}
        for r in sn.requests:
            if r.status != "waiting_for_remote_kvs" or not r.block_tables:
                continue
            bare = [b for b in r.block_tables[0] if by_id[b].block_hash is None]
            if bare:
                later = (
                    s.step
                    for s in snaps[i + 1 :]
                    for b in s.blocks
                    if b.block_id in bare and r.request_id in b.owners and b.block_hash
                )
                return sn.step, r.request_id, bare, next(later, 0)
    return None


def _ids(blocks) -> str:
    """Block ids as "3, 5" (no brackets: the page shows the live text inside a markdown
    directive)."""
    return ", ".join(str(b) for b in blocks)


# -- the myths as data ----------------------------------------------------------------------
class Myth(BaseModel):
    """One myth: ``id`` names its sentences (``myth.<id>.claim`` / ``.truth`` / ``.live…``) and its
    live check (``LIVE[id]``); ``seed`` is the seed article that makes the claim."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    seed: int = Field(ge=0)
    sources: tuple[Source, ...] = Field(min_length=1)

    @property
    def claim(self) -> Text:
        return Text(f"myth.{self.id}.claim")

    @property
    def truth(self) -> Text:
        return Text(f"myth.{self.id}.truth")


LiveCheck = Callable[[Sequence[Snapshot], Optional[Sequence[StepRecord]]], tuple[Text, ...]]
LIVE: dict[str, LiveCheck] = {}


def live_check(myth_id: str) -> Callable[[LiveCheck], LiveCheck]:
    """Register the live check of myth ``myth_id``: ``(snapshots up to now, the records that led
    there or None) -> the sentences it says, in order``."""

    def register(fn: LiveCheck) -> LiveCheck:
        LIVE[myth_id] = fn
        return fn

    return register


def load_myths(path: Path = MYTHS_FILE) -> tuple[Myth, ...]:
    """The myths of ``path``, in the order shown. Raises ValueError naming the file and field for
    a malformed entry, a repeated id, a myth without its sentences in the catalogue or without a
    live check, and a live check without its myth."""
    myths = tuple(load(path, list[Myth]))
    keys = catalogue()
    seen: set[str] = set()
    for i, m in enumerate(myths):
        if m.id in seen:
            raise fail(path, f"[{i}].id", f"{m.id!r} is repeated")
        seen.add(m.id)
        for t in (m.claim, m.truth):
            if t.key not in keys:
                raise fail(path, f"[{i}].id", f"the catalogue has no {t.key!r}")
        if m.id not in LIVE:
            raise fail(path, f"[{i}].id", f"no live check for {m.id!r} (lesson/myths.py, LIVE)")
    if set(LIVE) - seen:
        raise fail(path, "(top)", f"live checks without a myth: {sorted(set(LIVE) - seen)}")
    return myths


@lru_cache(maxsize=1)
def myths() -> tuple[Myth, ...]:
    return load_myths()


# -- the live checks ------------------------------------------------------------------------
@live_check("timestamp_lru")
def _timestamp_lru(snaps, records) -> tuple[Text, ...]:
    c = lru_contrast(snaps)
    if not c.vllm_order:
        return (Text("myth.timestamp_lru.live.empty"),)
    v, t = c.vllm_order[0], c.timestamp_order[0]
    lu = c.last_used.get(t, -1)
    idle = (
        Text("myth.timestamp_lru.live.idle.never")
        if lu < 0
        else Text("myth.timestamp_lru.live.idle.since", {"step": lu})
    )
    verdict = "agree" if v == t else "differ"
    return (
        Text(
            "myth.timestamp_lru.live",
            {
                "reused": v,
                "lru_pick": t,
                "idle": idle,
                "verdict": Text(f"myth.timestamp_lru.live.verdict.{verdict}"),
            },
        ),
    )


@live_check("defragmentation")
def _defragmentation(snaps, records) -> tuple[Text, ...]:
    snap = snaps[-1]
    waste, held = internal_waste(snap)
    fields = {
        "free": len(snap.free_queue),
        "runs": len(free_runs(snap)),
        "held": held,
        "waste": waste,
        "pct": (100 * waste / held) if held else 0.0,
    }
    return (Text("myth.defragmentation.live", fields),)


@live_check("swap")
def _swap(snaps, records) -> tuple[Text, ...]:
    """Preemptions so far, the blocks the preempted requests now waiting still hold, and the CPU
    tier's copies (when the run has one)."""
    snap = snaps[-1]
    pre = sum(r.num_preemptions for r in snap.requests)
    nulls = {b.block_id for b in snap.blocks if b.is_null}
    back = [r for r in snap.requests if r.num_preemptions and r.request_id in snap.waiting]
    if not back:
        out = [Text("myth.swap.live.none_waiting", {"preemptions": pre})]
    else:
        held = sum(1 for r in back for t in r.block_tables for b in t if b not in nulls)
        tail = "myth.swap.live.waiting.holding" if held else "myth.swap.live.waiting.freed"
        fields = {
            "preemptions": pre,
            "requests": _ids(r.request_id for r in back),
            "held": held,
            "tail": Text(tail),
        }
        out = [Text("myth.swap.live.waiting", fields)]
    cpu = snap.cpu_pool
    if cpu is not None:
        stored = sum(1 for h in cpu.block_hashes if h is not None)
        gpu = sum(1 for b in snap.blocks if b.block_hash is not None)
        out.append(Text("myth.swap.live.cpu_tier", {"stored": stored, "gpu": gpu}))
    return tuple(out)


@live_check("copy_on_write")
def _copy_on_write(snaps, records) -> tuple[Text, ...]:
    snap = snaps[-1]
    w = write_targets(snap)
    none = Text("myth.copy_on_write.live.no_blocks")
    now = Text(
        "myth.copy_on_write.live",
        {
            "shared": _ids(w.shared) or none,
            "unhashed": len(w.shared_unhashed),
            "written": _ids(w.written) or none,
            "written_shared": len(w.written_shared),
        },
    )
    hits = hit_lengths(snap)
    if not hits:
        return now, Text("myth.copy_on_write.live.no_hits")
    inside = [h for h in hits if h % snap.block_size]
    where = (
        Text("myth.copy_on_write.live.hits.inside", {"count": len(inside)})
        if inside
        else Text("myth.copy_on_write.live.hits.whole")
    )
    return now, Text("myth.copy_on_write.live.hits", {"hits": _ids(hits), "where": where})


@live_check("radix_tree")
def _radix_tree(snaps, records) -> tuple[Text, ...]:
    n_hash, n_blocks, first = hash_map_summary(snaps[-1])
    example = (
        ""
        if first is None
        else Text("myth.radix_tree.live.example", {"hash": first[0][:12], "blocks": _ids(first[1])})
    )
    return (
        Text("myth.radix_tree.live", {"hashes": n_hash, "blocks": n_blocks, "example": example}),
    )


@live_check("evict_blocks")
def _evict_blocks(snaps, records) -> tuple[Text, ...]:
    """Seed 003's evict_blocks claim: which BlockPool call took each cached block's hash, from the
    records (the snapshots alone say how many hashes went, not which call took them)."""
    if records is None:
        lost = sum(
            1
            for prev, cur in zip(snaps, snaps[1:])
            for a, b in zip(prev.blocks, cur.blocks)
            if a.block_hash is not None and b.block_hash != a.block_hash
        )
        return (Text("myth.evict_blocks.live.from_snapshots", {"lost": lost}),)
    h = hash_losses(records)
    first = (
        Text("myth.evict_blocks.live.first", {"step": h.popped[0][0], "block": h.popped[0][1]})
        if h.popped
        else ""
    )
    fields = {"popped": len(h.popped), "first": first, "by_id": len(h.by_id), "resets": h.resets}
    out = [Text("myth.evict_blocks.live", fields)]
    if not h.popped:
        out.append(Text("myth.evict_blocks.live.no_pop"))
    if h.failed_loads:
        step, rid = h.failed_loads[0]
        failed = {"count": len(h.failed_loads), "step": step, "request": rid}
        out.append(Text("myth.evict_blocks.live.failed_loads", failed))
    else:
        out.append(Text("myth.evict_blocks.live.no_failed_load"))
    return tuple(out)


@live_check("delay_cache_blocks")
def _delay_cache_blocks(snaps, records) -> tuple[Text, ...]:
    """Every request at every step so far: its blocks with a hash never outnumber the full blocks
    of the tokens it really holds (drafts are not among them)."""
    snap = snaps[-1]
    rows = [(sn.step, *row) for sn in snaps for row in cached_within_tokens(sn)]
    if not rows:
        return (Text("myth.delay_cache_blocks.live.no_blocks"),)
    over = [r for r in rows if r[2] > r[3]]
    if over:
        where = _ids(f"{rid}@{st}" for st, rid, _, _ in over)
        return (Text("myth.delay_cache_blocks.live.over", {"checks": len(rows), "where": where}),)
    now = ", ".join(f"{rid} {h} ≤ {f}" for st, rid, h, f in rows if st == snap.step and h <= f)
    now_text = Text("myth.delay_cache_blocks.live.now", {"rows": now}) if now else ""
    out = (Text("myth.delay_cache_blocks.live.never_over", {"checks": len(rows), "now": now_text}),)
    pd = delayed_for_transfer(snaps)
    if pd is not None:  # a P/D decode replica's pull: what delay_cache_blocks is for
        step, rid, bare, cached = pd
        fields = {"step": step, "req": rid, "blocks": _ids(bare), "cached": cached}
        key = "myth.delay_cache_blocks.live.pd" + ("" if cached else ".waiting")
        out += (Text(key, fields),)
    return out


@live_check("ext_comp")
def _ext_comp(snaps, records) -> tuple[Text, ...]:
    pc = snaps[-1].prefix_cache
    fields = {"hits": int(pc.get("hits", 0) or 0), "queries": int(pc.get("queries", 0) or 0)}
    return (Text("myth.ext_comp.live", fields),)


def first_block_twins(snap: Snapshot):
    """Two requests of the snapshot whose first full blocks hold the same token ids: a pair whose
    block 0 hashes differ if there is one, else a pair whose hashes agree, else None."""
    bs = snap.block_size
    by_tokens: dict[tuple[int, ...], list] = {}
    for r in snap.requests:
        if r.block_hashes:
            first = (r.prompt_token_ids + r.output_token_ids)[:bs]
            by_tokens.setdefault(tuple(first), []).append(r)
    same = None
    for group in by_tokens.values():
        for i, a in enumerate(group):
            for b in group[i + 1 :]:
                if a.block_hashes[0] != b.block_hashes[0]:
                    return a, b
                same = same or (a, b)
    return same


@live_check("token_ids_only")
def _token_ids_only(snaps, records) -> tuple[Text, ...]:
    twins = first_block_twins(snaps[-1])
    if twins is None:
        return (Text("myth.token_ids_only.live.none"),)
    a, b = twins
    fields = {"a": a.request_id, "b": b.request_id, "ha": a.block_hashes[0][:12]}
    if a.block_hashes[0] == b.block_hashes[0]:
        return (Text("myth.token_ids_only.live.same", fields),)
    salts = {"sa": a.cache_salt or "—", "sb": b.cache_salt or "—"}
    return (
        Text("myth.token_ids_only.live.differ", {**fields, **salts, "hb": b.block_hashes[0][:12]}),
    )


def myth_texts(
    snaps: Sequence[Snapshot], records: Optional[Sequence[StepRecord]] = None
) -> list[tuple[Text, Text, tuple[Text, ...]]]:
    """(claim, truth, the live check's sentences) of each myth, in no language yet."""
    return [(m.claim, m.truth, LIVE[m.id](snaps, records)) for m in myths()]


def myth_sections(
    snaps: Sequence[Snapshot],
    lang: str = "en",
    records: Optional[Sequence[StepRecord]] = None,
) -> list[tuple[str, str, str]]:
    """(myth, what vLLM does, what the live pool shows now) for each myth, in ``lang``;
    ``records`` (the steps that led to ``snaps[-1]``) name the call behind each eviction."""
    return [
        (tr(claim, lang), tr(truth, lang), "".join(tr(t, lang) for t in live))
        for claim, truth, live in myth_texts(snaps, records)
    ]


_SHOWN: "OrderedDict[tuple, list[tuple[str, str, str]]]" = OrderedDict()
_SHOWN_LOCK = threading.Lock()
SHOWN_MAX = 512


def myth_sections_at(
    run_key: str,
    step: int,
    snaps: Callable[[], Sequence[Snapshot]],
    lang: str = "en",
    records: Optional[Callable[[], Sequence[StepRecord]]] = None,
) -> list[tuple[str, str, str]]:
    """``myth_sections`` of a recorded run at ``step``, computed once per server process: every
    session at the same step of the same run (a class on one lesson) shares it, and a run's
    history is walked once per step, not once per cursor report. Bounded (LRU), thread-safe."""
    key = (run_key, step, lang, records is not None)
    with _SHOWN_LOCK:
        hit = _SHOWN.get(key)
        if hit is not None:
            _SHOWN.move_to_end(key)
            return hit
    out = myth_sections(snaps(), lang, records() if records is not None else None)
    with _SHOWN_LOCK:
        _SHOWN[key] = out
        while len(_SHOWN) > SHOWN_MAX:
            _SHOWN.popitem(last=False)
    return out
