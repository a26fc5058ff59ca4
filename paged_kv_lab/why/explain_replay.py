"""The "Why?" of a replayed trace: why did request 4711 hit 3 of its 9 shared blocks?

A replay keeps no snapshot per step; its CacheLog (recording/pool_frames.py) keeps every cache
change (a hash cached in a block, a block evicted and whom it went to) and every admission's
lookup (the request's chain of full-block hashes and the hit vLLM found). From those alone:

- *shared blocks*: the blocks of the request's chain that some earlier request had computed
  (their hash was cached at least once before the lookup);
- the hit: vLLM's longest cached prefix, so it stops at the first block of the chain whose hash
  is not in the cache at the lookup; why that block was missing: never computed before, or
  cached then evicted (by whom, when) or the prefix cache reset; or a rule: the hit must leave
  the last token to compute (``max_cache_hit_length = num_tokens - 1``), the last partial block
  is never cached.

Sentences from the catalogue (why.json, why.replay.*); request ids are trace indices, shown as
text only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from paged_kv_lab.recording.pool_frames import HASH_HEX, Admission, CacheChange, CacheLog
from paged_kv_lab.text.i18n import tr

NEVER_COMPUTED = "never_computed"
EVICTED = "evicted"
RESET = "reset"
CAPPED_LAST_TOKEN = "capped_last_token"
PARTIAL_BLOCK = "partial_block"
FULL_HIT = "full_hit"


@dataclass(frozen=True)
class ReplayHit:
    """One admission explained. ``shared``: chain indices an earlier request had computed;
    ``stop``: the first chain index not hit (None when every full block hit)."""

    request_id: str
    step: int
    resumed: bool
    num_tokens: int
    hit_tokens: int
    block_size: int
    num_blocks: int  # full blocks in the chain
    shared: tuple[int, ...]
    reason: str
    stop: Optional[int] = None
    block_hash: Optional[str] = None
    cached_by: Optional[str] = None
    cached_step: Optional[int] = None
    cached_block: Optional[int] = None
    lost_step: Optional[int] = None
    lost_to: Optional[str] = None  # the request that next filled the evicted block

    @property
    def hit_blocks(self) -> int:
        return self.hit_tokens // self.block_size


def _before(log: Sequence[CacheChange], seq: int) -> list[CacheChange]:
    return [c for c in log if c.seq < seq]


def _present(log: Sequence[CacheChange], seq: int) -> bool:
    held: set[Optional[int]] = set()
    for c in _before(log, seq):
        if c.action == "cached":
            held.add(c.block_id)
        elif c.action == "evicted":
            held.discard(c.block_id)
        else:
            held.clear()
    return bool(held)


def explain_admission(cache: CacheLog, a: Admission) -> ReplayHit:
    bs = cache.block_size
    chain = a.chain
    shared = tuple(
        i
        for i, h in enumerate(chain)
        if any(
            c.action == "cached" and c.request_id != a.request_id
            for c in _before(cache.changes.get(h, ()), a.seq)
        )
    )
    base = dict(
        request_id=a.request_id,
        step=a.step,
        resumed=a.resumed,
        num_tokens=a.num_tokens,
        hit_tokens=a.hit_tokens,
        block_size=bs,
        num_blocks=len(chain),
        shared=shared,
    )
    k = a.hit_tokens // bs
    if k >= len(chain):
        reason = PARTIAL_BLOCK if a.num_tokens % bs else FULL_HIT
        return ReplayHit(reason=reason, **base)
    h = chain[k].hex()[:HASH_HEX]
    log = cache.changes.get(chain[k], ())
    if _present(log, a.seq) or (k + 1) * bs > a.num_tokens - 1:
        return ReplayHit(reason=CAPPED_LAST_TOKEN, stop=k, block_hash=h, **base)
    got = [c for c in _before(log, a.seq) if c.action == "cached"]
    if not got:
        return ReplayHit(reason=NEVER_COMPUTED, stop=k, block_hash=h, **base)
    last = got[-1]
    lost = [c for c in _before(log, a.seq) if c.seq > last.seq and c.action != "cached"]
    end = lost[-1] if lost else None
    return ReplayHit(
        reason=RESET if end is not None and end.action == "reset" else EVICTED,
        stop=k,
        block_hash=h,
        cached_by=last.request_id,
        cached_step=last.step,
        cached_block=last.block_id,
        lost_step=end.step if end else None,
        lost_to=cache.reused_for(end.block_id, end.seq)
        if end and end.action == "evicted"
        else None,
        **base,
    )


def explain_replay_hit(cache: CacheLog, request_id: str) -> list[ReplayHit]:
    """Every admission of the request (the first and each resumption after a preemption); an
    empty list when it was never admitted."""
    return [explain_admission(cache, a) for a in cache.admissions.get(request_id, ())]


def replay_hit_sentences(
    x: ReplayHit,
    lang: str = "en",
    trace_block_size: Optional[int] = None,
    hash_ids: Sequence[int] = (),
) -> list[str]:
    """The headline (hit of shared blocks), then why the hit stopped where it did. With the
    trace's block size and the request's hash ids, the block is also named as the trace names
    it."""
    kw = dict(
        r=x.request_id,
        s=x.step,
        hit=x.hit_tokens,
        n=x.num_tokens,
        k=x.hit_blocks,
        m=len(x.shared),
        nb=x.num_blocks,
        bs=x.block_size,
        i=x.stop,
        h=x.block_hash,
        cb=x.cached_by,
        cs=x.cached_step,
        blk=x.cached_block,
        ls=x.lost_step,
        to=x.lost_to,
    )
    if x.resumed:
        out = [tr("why.replay.resumed", lang, **kw)]
    else:
        out = [tr("why.replay.admitted", lang, **kw)]
    where = ""
    if x.stop is not None and trace_block_size and hash_ids:
        j = x.stop * x.block_size // trace_block_size
        if j < len(hash_ids):
            where = tr("why.replay.where", lang, j=j, hid=hash_ids[j])
    kw["where"] = where
    stop = tr("why.replay.stop", lang, **kw)
    if x.reason == FULL_HIT:
        out.append(tr("why.replay.full_hit", lang))
    elif x.reason == PARTIAL_BLOCK:
        out.append(tr("why.replay.partial_block", lang))
    elif x.reason == CAPPED_LAST_TOKEN:
        out.append(stop + tr("why.replay.capped_last_token", lang, **kw))
    elif x.reason == NEVER_COMPUTED:
        out.append(stop + tr("why.replay.never_computed", lang, **kw))
    elif x.reason == EVICTED:
        lost = (
            tr("why.replay.lost_to", lang, **kw)
            if x.lost_to is not None
            else tr("why.replay.lost_head", lang, **kw)
        )
        out.append(stop + tr("why.replay.evicted", lang, lost=lost, **kw))
    elif x.reason == RESET:
        out.append(stop + tr("why.replay.reset", lang, **kw))
    return out
