"""Answers to "why?", computed from a recorded run only (the state before step 1 + StepRecords).

Three questions: why a request's prefix-cache hit stopped where it did (``explain_hit``), the
life of one physical block (``life_of_block``) and two requests' hash chains side by side
(``compare_requests``; both in ``why.explain_blocks``). Nothing here touches a live engine:
the cache's history is replayed from the recorded events (Cached / Evicted / PrefixCacheReset),
and a request's chain is the one the engine computed, kept in every snapshot's RequestView.
``paged_kv_lab.why.explain_text`` turns the answers into sentences (catalogue keys, any language).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from paged_kv_lab.recording import events as E
from paged_kv_lab.recording.snapshot import RequestView, Snapshot, StepRecord
from paged_kv_lab.run.scenario import EngineSettings, load_scenario
from paged_kv_lab.text.i18n import Text, tr

Decode = Callable[[Sequence[int]], str]
Pos = tuple[int, int]  # (step, index of the event in that step): a moment of the run


class ExplainError(ValueError):
    """The question cannot be answered from this run (unknown request, block, step...).
    ``text`` says why in any language (a ``why.error.*`` entry); ``str()`` is its English."""

    def __init__(self, text: Text) -> None:
        self.text = text
        super().__init__(tr(text, "en"))


@dataclass(frozen=True)
class RecordedSteps:
    """A recorded run as explain reads it. ``records[i].step == i + 1``; ``initial`` is the state
    before step 1 (None for a trace without a header); ``settings`` the engine settings it ran
    with (None when unknown: then only the life of a block can be told)."""

    initial: Optional[Snapshot]
    records: tuple[StepRecord, ...]
    settings: Optional[EngineSettings]
    decode: Optional[Decode] = None

    @staticmethod
    def from_trace(trace, decode: Optional[Decode] = None) -> "RecordedSteps":
        settings = load_scenario(trace.scenario).engine if trace.scenario is not None else None
        return RecordedSteps(trace.initial, tuple(trace.records), settings, decode)

    def snapshot_before(self, step: int) -> Optional[Snapshot]:
        return self.initial if step <= 1 else self.records[step - 2].snapshot

    def last_snapshot(self) -> Optional[Snapshot]:
        return self.records[-1].snapshot if self.records else self.initial

    def groups(self) -> tuple[dict, ...]:
        snap = self.last_snapshot()
        return snap.groups if snap is not None else ({"kind": "full", "sliding_window": None},)

    def primary_group(self) -> int:
        """The group whose hit every other group must agree with: the first full-attention one."""
        kinds = [g.get("kind") for g in self.groups()]
        return kinds.index("full") if "full" in kinds else 0

    def block_size(self) -> int:
        snap = self.last_snapshot()
        if snap is not None:
            return snap.block_size
        return self.settings.block_size if self.settings else 16

    def hash_unit(self) -> int:
        """Tokens per hash (``prefix_match_unit``; the block size unless finer)."""
        unit = self.settings.prefix_match_unit if self.settings else None
        return unit or self.block_size()

    def request_views(self) -> dict[str, RequestView]:
        """Each request's last recorded view (its tokens only grow, so the last holds them all)."""
        out: dict[str, RequestView] = {}
        for snap in ([self.initial] if self.initial else []) + [r.snapshot for r in self.records]:
            for rv in snap.requests:
                out[rv.request_id] = rv
        return out

    def text(self, token_ids: Sequence[int]) -> Optional[str]:
        if self.decode is None or not token_ids:
            return None
        try:
            return self.decode(list(token_ids))
        except Exception:  # a decoder that cannot read these ids: show ids instead
            return None


def all_tokens(rv: RequestView) -> tuple[int, ...]:
    return tuple(rv.prompt_token_ids) + tuple(rv.output_token_ids)


def salt_key(s: Optional[str]) -> Optional[str]:
    return s or None  # an empty salt is no salt (block_hash.cache_salt_extra_keys)


# -- the cache's history ------------------------------------------------------------------
@dataclass(frozen=True)
class CacheEntry:
    """One change of the prefix cache for one key ("hash@group"): a block got the key
    ("cached"), lost it ("evicted", by ``request_id`` when reused for it; "moved" to a copy of
    the block) or every key went ("reset")."""

    pos: Pos
    action: str
    block_id: Optional[int]
    request_id: Optional[str]
    reason: str = ""


class CacheHistory:
    """Every key's entries in run order, replayed from the events. Invariant: a key is in the
    map at a moment iff some block got it before that moment and has not lost it since."""

    def __init__(self, run: RecordedSteps) -> None:
        self.entries: dict[str, list[CacheEntry]] = {}
        live: dict[str, set[int]] = {}
        if run.initial is not None:
            for key, bids in run.initial.hash_map.items():
                for b in bids:
                    self._add(live, key, CacheEntry((0, -1), "cached", b, None))
        for rec in run.records:
            for i, ev in enumerate(rec.events):
                pos = (rec.step, i)
                if ev.kind == E.CACHED:
                    for b, h in zip(ev.block_ids, ev.block_hashes):
                        self._add(
                            live,
                            f"{h}@{ev.group or 0}",
                            CacheEntry(pos, "cached", b, ev.request_id),
                        )
                elif ev.kind == E.CACHED_PARTIAL:
                    key = f"{ev.block_hash}@{ev.group or 0}"
                    self._add(live, key, CacheEntry(pos, "cached", ev.block_ids[0], ev.request_id))
                elif ev.kind == E.COPIED and ev.block_hashes:  # the entries move to the copy
                    for h in ev.block_hashes:
                        key = f"{h}@{ev.group or 0}"
                        live.get(key, set()).discard(ev.source_block_id)
                        self.entries.setdefault(key, []).append(
                            CacheEntry(pos, "moved", ev.source_block_id, ev.request_id)
                        )
                        self._add(
                            live, key, CacheEntry(pos, "cached", ev.block_ids[0], ev.request_id)
                        )
                elif ev.kind == E.EVICTED:
                    key = f"{ev.block_hash}@{ev.group or 0}"
                    live.get(key, set()).discard(ev.block_ids[0])
                    self.entries.setdefault(key, []).append(
                        CacheEntry(pos, "evicted", ev.block_ids[0], ev.request_id, ev.reason)
                    )
                elif ev.kind == E.RESET and ev.ok:
                    for key, bids in live.items():
                        if bids:
                            self.entries[key].append(CacheEntry(pos, "reset", None, None))
                        bids.clear()

    def _add(self, live: dict[str, set[int]], key: str, entry: CacheEntry) -> None:
        live.setdefault(key, set()).add(entry.block_id)
        self.entries.setdefault(key, []).append(entry)

    def before(self, key: str, pos: Pos) -> list[CacheEntry]:
        return [e for e in self.entries.get(key, ()) if e.pos < pos]

    def present(self, key: str, pos: Pos) -> bool:
        held: set[Optional[int]] = set()
        for e in self.before(key, pos):
            if e.action == "cached":
                held.add(e.block_id)
            elif e.action in ("evicted", "moved"):
                held.discard(e.block_id)
            else:
                held.clear()
        return bool(held)

    def ever_cached(self, key: str, pos: Pos) -> Optional[CacheEntry]:
        """The last time a block got ``key`` before ``pos``, or None."""
        got = [e for e in self.before(key, pos) if e.action == "cached"]
        return got[-1] if got else None


def chain_of(
    rv: RequestView, num_tokens: int, block_size: int, unit: Optional[int] = None
) -> list[str]:
    """The hashes (hex) of the full blocks among the request's first ``num_tokens`` tokens, as the
    engine computed them (the snapshot keeps them; a chain's first blocks depend only on them).
    With hashes every ``unit`` tokens (finer than the block) a block's key is the hash at its
    last unit boundary."""
    scale = block_size // (unit or block_size)
    return list(rv.block_hashes[scale - 1 : num_tokens // block_size * scale : scale])


def block_keys(rv: RequestView, index: int, block_size: int, unit: Optional[int] = None) -> str:
    """The extra keys (snapshot.keys_text) of the hash keying the request's block ``index``:
    "" when it has none beyond a salt, or the recording kept none."""
    scale = block_size // (unit or block_size)
    j = (index + 1) * scale - 1
    return rv.block_extra_keys[j] if j < len(rv.block_extra_keys) else ""


def has_hashes(views) -> bool:
    """False for a recording whose snapshots kept no block hashes (a trace from before they did)."""
    return any(rv.block_hashes for rv in views)


# -- 1. why this hit length -----------------------------------------------------------------
# Reasons. A miss: the first block of the chain whose key is not in the map, and why.
NEVER_COMPUTED = "never_computed"
EVICTED = "evicted"
RESET = "reset"
SALT = "salt"
EXTRA_KEYS = "extra_keys"  # same tokens and salt; a LoRA adapter, an image or embeddings differ
TOKENS_DIFFER = "tokens_differ"
# A rule, not a miss.
CACHING_OFF = "caching_off"
SKIP_READING_PREFIX_CACHE = "skip_reading_prefix_cache"
SHORTER_THAN_BLOCK = "shorter_than_block"
PARTIAL_BLOCK = "partial_block"
CAPPED_LAST_TOKEN = "capped_last_token"
MAX_CACHE_HIT_LENGTH = "max_cache_hit_length"
SLIDING_WINDOW = "sliding_window"
GROUPS_DISAGREE = "groups_disagree"
CANNOT_REHASH = "cannot_rehash"
PARTIAL_HIT = "partial_hit"  # prefix_match_unit: the hit ends inside a block
NO_PARTIAL_ENTRY = "no_partial_entry"  # prefix_match_unit: no entry inside the next block
MISS_REASONS = (NEVER_COMPUTED, EVICTED, RESET, SALT, EXTRA_KEYS, TOKENS_DIFFER)
RULE_REASONS = (
    CACHING_OFF,
    SKIP_READING_PREFIX_CACHE,
    SHORTER_THAN_BLOCK,
    PARTIAL_BLOCK,
    CAPPED_LAST_TOKEN,
    MAX_CACHE_HIT_LENGTH,
    SLIDING_WINDOW,
    GROUPS_DISAGREE,
    CANNOT_REHASH,
    PARTIAL_HIT,
    NO_PARTIAL_ENTRY,
)


@dataclass(frozen=True)
class HitExplanation:
    """Why request ``request_id``'s hit at its admission in ``step`` is ``hit_tokens`` long.

    For a miss, ``block_index`` is the first block of its chain whose key was not in the map
    and ``block_hash`` that key's hash; ``other_request`` is the request that computed the same
    tokens (evicted, salt) or the nearest cached chain (tokens_differ), which first differs
    from this one at token ``token_position``."""

    request_id: str
    step: int
    resumed: bool
    num_tokens: int
    hit_tokens: int
    block_size: int
    reason: str
    group: int = 0
    block_index: Optional[int] = None
    block_hash: Optional[str] = None
    token_position: Optional[int] = None
    other_request: Optional[str] = None
    cached_step: Optional[int] = None
    cached_block: Optional[int] = None
    lost_step: Optional[int] = None
    lost_reason: str = ""
    evicted_for: Optional[str] = None
    salt: Optional[str] = None
    other_salt: Optional[str] = None
    # extra_keys: the missed block's extra keys here and in other_request's chain (keys_text)
    extra_keys: Optional[str] = None
    other_extra_keys: Optional[str] = None
    cap: Optional[int] = None
    text_before: Optional[str] = None  # decoded text before token_position (both share it)
    text_here: Optional[str] = None  # this request's text from token_position on
    text_other: Optional[str] = None  # the other chain's text from token_position on
    ids_before: tuple[int, ...] = ()
    ids_here: tuple[int, ...] = ()
    ids_other: tuple[int, ...] = ()
    kept_blocks: tuple[int, ...] = ()  # sliding window: chain indices the window group still held
    unit: Optional[int] = None  # prefix_match_unit, where finer than the block
    copy_blocks: tuple[int, ...] = ()  # a partial hit: the private copies the request got

    @property
    def hit_blocks(self) -> int:
        return self.hit_tokens // self.block_size

    @property
    def is_miss(self) -> bool:
        return self.reason in MISS_REASONS


def admissions(run: RecordedSteps, request_id: str) -> list[tuple[int, int, E.Event]]:
    """(step, event index, Admitted/Resumed event) of each admission of the request."""
    return [
        (rec.step, i, ev)
        for rec in run.records
        for i, ev in enumerate(rec.events)
        if ev.kind in (E.ADMITTED, E.RESUMED) and ev.request_id == request_id
    ]


def request_list(ids) -> Text | str:
    """The request ids of a run, for a message (none: a word of the catalogue)."""
    return ", ".join(ids) or Text("why.error.none")


def explain_hit(
    run: RecordedSteps, request_id: str, step: Optional[int] = None
) -> list[HitExplanation]:
    """Every admission of the request (the first and each resumption), or with ``step`` the
    last one at or before it. ExplainError if the request was never admitted there."""
    views = run.request_views()
    if request_id not in views:
        raise ExplainError(
            Text("why.error.no_request", {"rid": request_id, "ids": request_list(views)})
        )
    found = admissions(run, request_id)
    if step is not None:
        found = [a for a in found if a[0] <= step][-1:]
    if not found:
        where = Text("why.error.by_step", {"step": step}) if step is not None else ""
        blocked = [
            (rec.step, ev.reason)
            for rec in run.records[:step]
            for ev in rec.events
            if ev.kind == E.BLOCKED and ev.request_id == request_id
        ]
        why = (
            Text("why.error.held_back", {"step": blocked[-1][0], "reason": blocked[-1][1]})
            if blocked
            else ""
        )
        raise ExplainError(
            Text("why.error.not_admitted", {"rid": request_id, "where": where, "why": why})
        )
    history = CacheHistory(run)
    return [_explain_admission(run, history, views, request_id, s, i, ev) for s, i, ev in found]


def _explain_admission(
    run, history: CacheHistory, views, rid: str, step: int, idx: int, ev
) -> HitExplanation:
    rec = run.records[step - 1]
    lookups = [
        i
        for i, e in enumerate(rec.events[:idx])
        if e.kind in (E.CACHE_HIT, E.CACHE_MISS) and e.request_id == rid
    ]
    pos: Pos = (step, lookups[-1] if lookups else idx)
    before = run.snapshot_before(step)
    rv_before = next((r for r in before.requests if r.request_id == rid), None) if before else None
    rv = rv_before or views[rid]
    tokens = all_tokens(rv) if rv_before is not None else tuple(rv.prompt_token_ids)
    n, bs, unit = len(tokens), run.block_size(), run.hash_unit()
    hit = ev.num_cached_tokens
    base = dict(
        request_id=rid,
        step=step,
        resumed=ev.kind == E.RESUMED,
        num_tokens=n,
        hit_tokens=hit,
        block_size=bs,
        salt=salt_key(views[rid].cache_salt),
        unit=unit if unit < bs else None,
    )
    s = run.settings
    if s is not None and not s.enable_prefix_caching:
        return HitExplanation(reason=CACHING_OFF, **base)
    lookup = rec.events[lookups[-1]] if lookups else None
    if lookup is not None and lookup.kind == E.CACHE_MISS and lookup.skip_reading_prefix_cache:
        return HitExplanation(reason=SKIP_READING_PREFIX_CACHE, **base)
    if n < bs and unit == bs:
        return HitExplanation(reason=SHORTER_THAN_BLOCK, **base)
    if not has_hashes(views.values()):
        return HitExplanation(reason=CANNOT_REHASH, **base)
    groups = run.groups()
    g = run.primary_group()
    chain = chain_of(views[rid], n, bs, unit)
    if hit % bs and unit < bs:  # a hit inside a block needs hashes finer than the block
        return _partial_hit(rec, history, views[rid], idx, pos, dict(base, group=g))
    present = [history.present(f"{h}@{g}", pos) for h in chain]
    k = hit // bs
    cap = n - 1
    if s.max_cache_hit_length is not None:
        cap = min(cap, s.max_cache_hit_length)
    base.update(group=g, cap=cap)
    if groups[g].get("kind") != "full":  # a sliding window alone: it hits where it kept blocks
        kept = tuple(i for i, p in enumerate(present) if p)
        if kept and k < len(chain) and (k + 1) * bs <= cap:
            return HitExplanation(reason=SLIDING_WINDOW, kept_blocks=kept, **base)
        m = next((i for i, p in enumerate(present) if not p), len(chain)) if not kept else None
    else:
        m = next((i for i, p in enumerate(present) if not p), len(chain))
    if m is not None and m == k and m < len(chain):
        return _miss(run, history, views, rid, tokens, chain, m, pos, base)
    if (k + 1) * bs > cap and k < len(chain):
        if s.max_cache_hit_length is not None and cap == s.max_cache_hit_length and cap < n - 1:
            return HitExplanation(reason=MAX_CACHE_HIT_LENGTH, **base)
        return HitExplanation(reason=CAPPED_LAST_TOKEN, block_index=k, **base)
    if k >= len(chain):
        rule = NO_PARTIAL_ENTRY if unit < bs else PARTIAL_BLOCK
        return HitExplanation(reason=rule, block_index=len(chain), **base)
    kept = tuple(
        i
        for i, h in enumerate(chain)
        for gg, d in enumerate(groups)
        if d.get("kind") != "full" and history.present(f"{h}@{gg}", pos)
    )
    return HitExplanation(
        reason=GROUPS_DISAGREE if len(groups) > 1 else SLIDING_WINDOW,
        block_index=k,
        kept_blocks=kept,
        **base,
    )


def _partial_hit(rec, history: CacheHistory, rv, idx: int, pos: Pos, base) -> HitExplanation:
    """The hit ends at a hash boundary inside a block: who keyed the block there, and the
    private copy the request got because it writes into that block."""
    hit, g = base["hit_tokens"], base["group"]
    h = rv.block_hashes[hit // base["unit"] - 1]
    got = history.ever_cached(f"{h}@{g}", pos)
    copies = tuple(
        e.block_ids[0]
        for e in rec.events[pos[1] : idx]
        if e.kind == E.COPIED and e.request_id == rv.request_id and (e.group or 0) == g
    )
    return HitExplanation(
        reason=PARTIAL_HIT,
        block_index=hit // base["block_size"],
        block_hash=h,
        other_request=got.request_id if got else None,
        cached_step=got.pos[0] if got else None,
        cached_block=got.block_id if got else None,
        copy_blocks=copies,
        **base,
    )


def _miss(
    run, history: CacheHistory, views, rid, tokens, chain, m: int, pos: Pos, base
) -> HitExplanation:
    g, bs = base["group"], base["block_size"]
    key = f"{chain[m]}@{g}"
    at = dict(block_index=m, block_hash=chain[m], **base)
    got = history.ever_cached(key, pos)
    if got is not None:
        lost = [e for e in history.before(key, pos) if e.pos > got.pos and e.action != "cached"]
        last = lost[-1] if lost else None
        return HitExplanation(
            reason=RESET if last and last.action == "reset" else EVICTED,
            other_request=got.request_id,
            cached_step=got.pos[0] or None,
            cached_block=got.block_id,
            lost_step=last.pos[0] if last else None,
            lost_reason=last.reason if last else "",
            evicted_for=last.request_id if last else None,
            **at,
        )
    end = (m + 1) * bs
    best = None  # (common prefix length, when cached, request id, its tokens, block)
    for qid, qv in views.items():
        if qid == rid:
            continue
        q_tokens, q_salt = all_tokens(qv), salt_key(qv.cache_salt)
        if len(q_tokens) < end:
            continue
        q_key = f"{qv.block_hashes[m]}@{g}"
        q_got = history.ever_cached(q_key, pos)
        if q_got is None:
            continue
        if q_salt != base["salt"] and q_tokens[:end] == tuple(tokens[:end]):
            return HitExplanation(
                reason=SALT,
                other_request=qid,
                other_salt=q_salt,
                cached_step=q_got.pos[0] or None,
                cached_block=q_got.block_id,
                **at,
            )
        if q_salt != base["salt"]:
            continue
        mine, theirs = (block_keys(v, m, bs, base["unit"]) for v in (views[rid], qv))
        if q_tokens[:end] == tuple(tokens[:end]) and mine != theirs:
            return HitExplanation(
                reason=EXTRA_KEYS,
                other_request=qid,
                extra_keys=mine,
                other_extra_keys=theirs,
                cached_step=q_got.pos[0] or None,
                cached_block=q_got.block_id,
                **at,
            )
        lcp = next(
            (i for i, (a, b) in enumerate(zip(tokens, q_tokens)) if a != b),
            min(len(tokens), len(q_tokens)),
        )
        if lcp >= m * bs and (m > 0 or lcp > 0) and (best is None or (lcp, q_got.pos) > best[:2]):
            best = (lcp, q_got.pos, qid, q_tokens, q_got.block_id)
    if best is None:
        return HitExplanation(reason=NEVER_COMPUTED, **at)
    p, q_pos, qid, q_tokens, q_block = best
    lo, hi = max(0, p - 8), p + 8
    return HitExplanation(
        reason=TOKENS_DIFFER,
        token_position=p,
        other_request=qid,
        cached_step=q_pos[0] or None,
        cached_block=q_block,
        text_before=run.text(tokens[lo:p]),
        text_here=run.text(tokens[p:hi]),
        text_other=run.text(q_tokens[p:hi]),
        ids_before=tuple(tokens[lo:p]),
        ids_here=tuple(tokens[p:hi]),
        ids_other=tuple(q_tokens[p:hi]),
        **at,
    )
