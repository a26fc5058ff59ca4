"""The "Why?" of a replayed trace: why did request 4711 hit 3 of its 9 shared blocks?

A replay keeps no snapshot per step; its CacheLog (record/pool_frames.py) keeps every cache
change (a hash cached in a block, a block evicted and whom it went to) and every admission's
lookup (the request's chain of full-block hashes and the hit vLLM found). From those alone:

- *shared blocks*: the blocks of the request's chain that some earlier request had computed
  (their hash was cached at least once before the lookup);
- the hit: vLLM's longest cached prefix, so it stops at the first block of the chain whose hash
  is not in the cache at the lookup; why that block was missing: never computed before, or
  cached then evicted (by whom, when) or the prefix cache reset; or a rule: the hit must leave
  the last token to compute (``max_cache_hit_length = num_tokens - 1``), the last partial block
  is never cached.

Sentences in English and 中文; request ids are trace indices, shown as text only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from paged_kv_lab.record.pool_frames import HASH_HEX, Admission, CacheChange, CacheLog

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


def _t(lang: str, en: str, zh: str, **kw) -> str:
    return (zh if lang == "zh" else en).format(**kw)


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
    out = [
        _t(
            lang,
            ("Request {r} resumed" if x.resumed else "Request {r} was admitted")
            + " at step {s}: a prefix-cache hit of {hit} of its {n} tokens, {k} of its {nb} "
            "full blocks of {bs} tokens. {m} of those blocks had been computed by an earlier "
            "request (shared); it hit {k}.",
            ("请求 {r} 在第 {s} 步恢复" if x.resumed else "请求 {r} 在第 {s} 步被接纳")
            + "：前缀缓存命中其 {n} 个 token 中的 {hit} 个，即 {nb} 个满块（每块 {bs} 个 token）"
            "中的 {k} 个。其中 {m} 块此前由更早的请求算过（可共享）；它命中了 {k} 块。",
            **kw,
        )
    ]
    where = ""
    if x.stop is not None and trace_block_size and hash_ids:
        j = x.stop * x.block_size // trace_block_size
        if j < len(hash_ids):
            where = _t(
                lang,
                " (trace block {j}, hash id {hid})",
                "（轨迹块 {j}，hash id {hid}）",
                j=j,
                hid=hash_ids[j],
            )
    kw["where"] = where
    stop = _t(
        lang,
        "The hit stops at block {i}{where}, hash {h}: ",
        "命中停在第 {i} 块{where}，哈希 {h}：",
        **kw,
    )
    if x.reason == FULL_HIT:
        out.append(
            _t(
                lang,
                "every full block of its prompt was in the cache.",
                "提示词的每个满块都在缓存中。",
            )
        )
    elif x.reason == PARTIAL_BLOCK:
        out.append(
            _t(
                lang,
                "every full block hit; the last, partial block is never cached "
                "(vLLM caches full blocks only), so its tokens are computed.",
                "所有满块都命中；最后一个不满的块从不缓存（vLLM 只缓存满块），"
                "其 token 需重新计算。",
            )
        )
    elif x.reason == CAPPED_LAST_TOKEN:
        out.append(
            stop
            + _t(
                lang,
                "it was cached, but a hit may not cover the prompt's last "
                "token (vLLM computes at least one token to get logits).",
                "该块在缓存中，但命中不能覆盖提示词的最后一个 token（vLLM 至少要计算一个 "
                "token 以得到 logits）。",
                **kw,
            )
        )
    elif x.reason == NEVER_COMPUTED:
        out.append(
            stop
            + _t(
                lang,
                "no earlier request had computed this block after this "
                "prefix: it was never in the cache.",
                "此前没有请求在这个前缀之后算过这一块：它从未进入缓存。",
                **kw,
            )
        )
    elif x.reason == EVICTED:
        lost = (
            _t(
                lang,
                "evicted at step {ls}: its block was reused (request {to} filled it next).",
                "在第 {ls} 步被驱逐：它的块被复用（随后由请求 {to} 填充）。",
                **kw,
            )
            if x.lost_to is not None
            else _t(
                lang,
                "evicted at step {ls}: its block was reused from the free queue's head.",
                "在第 {ls} 步被驱逐：它的块从空闲队列头部被复用。",
                **kw,
            )
        )
        out.append(
            stop
            + _t(
                lang,
                "request {cb} cached it in block {blk} at step {cs}, and it was ",
                "请求 {cb} 在第 {cs} 步把它缓存在块 {blk} 中，之后",
                **kw,
            )
            + lost
        )
    elif x.reason == RESET:
        out.append(
            stop
            + _t(
                lang,
                "request {cb} cached it at step {cs}; the prefix cache was reset at step {ls}.",
                "请求 {cb} 在第 {cs} 步缓存了它；前缀缓存在第 {ls} 步被重置。",
                **kw,
            )
        )
    return out
