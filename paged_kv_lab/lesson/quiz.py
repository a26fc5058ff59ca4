"""'Predict the next step': a question about a step before it is revealed.

Pure functions of (the snapshot now, the record of the next step): the answer
is what the engine really did, the explanation quotes the rule that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass

from paged_kv_lab.record.snapshot import Snapshot, StepRecord
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.text.sentences import short_hash


@dataclass(frozen=True)
class Prediction:
    kind: str  # victim | hit | evict | alloc | free
    prompt: str
    options: tuple[str, ...]
    answer: int
    explain: str


def _first(rec: StepRecord, kind: str, pred=lambda e: True):
    return next((e for e in rec.events if e.kind == kind and pred(e)), None)


def _victim(snap: Snapshot, rec: StepRecord, lang: str) -> Prediction | None:
    e = _first(rec, "preempted")
    if e is None or e.request_id not in snap.running:
        return None
    opts = tuple(snap.running)
    pol = e.policy
    if lang == "zh":
        why = (
            "FCFS 策略抢占 running 列表中的最后一个请求"
            if pol == "fcfs"
            else "优先级策略抢占 (priority, arrival) 最大的请求"
        )
        expl = f"{why}：{e.request_id}。它的块被释放，它回到等待队列，之后重算。"
    else:
        why = (
            "FCFS preempts the last request in the running list"
            if pol == "fcfs"
            else "the priority policy preempts the running "
            "request with the largest (priority, arrival)"
        )
        expl = (
            f"{why}: {e.request_id}. Its blocks are freed "
            "and it returns to waiting to be recomputed."
        )
    return Prediction("victim", tr("quiz_q_victim", lang), opts, opts.index(e.request_id), expl)


def _hit(snap: Snapshot, rec: StepRecord, lang: str) -> Prediction | None:
    e = _first(rec, "cache_hit") or _first(rec, "cache_miss")
    if e is None or e.request_id is None:
        return None
    opts = (tr("yes", lang), tr("no", lang))
    hit = e.kind == "cache_hit"
    if hit:
        expl = (
            f"命中：{e.num_blocks} 个块（{e.num_tokens} 个 token）的链式哈希已在哈希表中。"
            if lang == "zh"
            else f"Hit: the chained hashes of {e.num_blocks} blocks ({e.num_tokens} tokens) "
            f"are in the hash map."
        )
    else:
        expl = _miss_why(snap, lang)
    return Prediction("hit", tr("quiz_q_hit", lang, req=e.request_id), opts, 0 if hit else 1, expl)


def _miss_why(snap: Snapshot, lang: str) -> str:
    """Why a lookup found nothing, by how its KV cache groups are searched: a full-attention group
    from the left (the chained hashes end the hit at the first missing block), a sliding-window
    group from the right (it needs a run of cached blocks as long as its window)."""
    kinds = {g.get("kind") for g in snap.groups} or {"full"}
    zh = lang == "zh"
    causes = (
        "（内容不同、加了盐、被驱逐，或提示词不足一整块）"
        if zh
        else " (different tokens, a cache_salt, evicted, or less than one full block)"
    )
    full = (
        f"全注意力组从左往右找：它第一个满块的哈希不在哈希表中{causes}。哈希是链式的，"
        "所以后面的块也都不会命中"
        if zh
        else "a full-attention group is searched from the left: the hash of its first full "
        f"block is not in the map{causes}, and as the hashes are chained, no later block "
        "can hit either"
    )
    sliding = (
        f"滑动窗口组从右往左找：没有找到窗口所需长度的一串连续的已缓存块{causes}"
        if zh
        else "a sliding-window group is searched from the right: no run of cached blocks as "
        f"long as its window needs was found{causes}"
    )
    if kinds == {"full"}:
        return ("未命中：" + full + "。") if zh else f"Miss: {full}."
    if "full" not in kinds:
        return ("未命中：" + sliding + "。") if zh else f"Miss: {sliding}."
    return (
        "未命中：命中长度必须在每个 KV cache 组里都成立，这里没有一个长度能同时成立。"
        "全注意力组从左往右找，停在第一个不在哈希表中的块（哈希是链式的）；"
        "滑动窗口组从右往左找，需要一串与窗口等长的连续已缓存块。"
        if zh
        else "Miss: a hit length must hold in every KV cache group, and here none held in all "
        "of them. A full-attention group is searched from the left and stops at its first "
        "block missing from the map (the hashes are chained); a sliding-window group is "
        "searched from the right and needs a run of cached blocks as long as its window."
    )


def _evict(snap: Snapshot, rec: StepRecord, lang: str) -> Prediction | None:
    e = _first(rec, "evicted", lambda e: e.reason == "reused from queue head")
    if e is None or not e.block_ids:
        return None
    blocks = {b.block_id: b for b in snap.blocks}
    cached = [bid for bid in snap.free_queue if blocks.get(bid) and blocks[bid].block_hash]
    ans = e.block_ids[0]
    if ans not in cached:
        return None
    opts = cached[:4] if ans in cached[:4] else cached[:3] + [ans]
    if len(opts) < 2:
        return None
    h = short_hash(e.block_hash)
    expl = (
        f"get_new_blocks 从队头取块；第一个带哈希的块是 {ans}，"
        f"它被取出时丢失了哈希 #{h}。驱逐不读时间戳，只看队列顺序。"
        if lang == "zh"
        else "get_new_blocks pops from the head; the first block there that carries a "
        f"hash is {ans}, and it loses #{h} when popped. Eviction reads no timestamp — only "
        "queue order."
    )
    return Prediction(
        "evict",
        tr("quiz_q_evict", lang),
        tuple(f"{tr('block', lang)} {b}" for b in opts),
        opts.index(ans),
        expl,
    )


def _alloc(snap: Snapshot, rec: StepRecord, lang: str) -> Prediction | None:
    e = _first(rec, "allocated")
    if e is None or not e.block_ids or len(snap.free_queue) < 2:
        return None
    ans = e.block_ids[0]
    q = list(snap.free_queue)
    cands = q[:3] + [q[-1]]
    if ans not in cands:
        cands = q[:2] + [ans] + [q[-1]]
    opts = list(dict.fromkeys(cands))
    if ans not in opts or len(opts) < 2:
        return None
    touched_first = any(
        x.kind == "touched" and x.from_queue
        for x in rec.events
        if rec.events.index(x) < rec.events.index(e)
    )
    if lang == "zh":
        expl = f"get_new_blocks 总是从空闲队列队头 popleft：块 {ans}。"
        if touched_first:
            expl += "（同一步里缓存命中的 touch 先从队列中取走了一些块。）"
    else:
        expl = f"get_new_blocks always pops from the head of the free queue: block {ans}."
        if touched_first:
            expl += " (A cache hit's touch took some blocks out of the queue first in this step.)"
    return Prediction(
        "alloc",
        tr("quiz_q_alloc", lang),
        tuple(f"{tr('block', lang)} {b}" for b in opts),
        opts.index(ans),
        expl,
    )


def _free(snap: Snapshot, rec: StepRecord, lang: str) -> Prediction:
    after = rec.snapshot.num_free_blocks
    now = snap.num_free_blocks
    opts = sorted(
        {after, now, max(0, after - 1), after + 1} | ({after + 2} if after + 2 != now else set())
    )[:4]
    if after not in opts:
        opts = opts[:3] + [after]
    alloc = sum(len(e.block_ids) for e in rec.events if e.kind == "allocated")
    taken = sum(len(e.from_queue) for e in rec.events if e.kind == "touched")
    back = sum(len(e.to_head) + len(e.to_tail) for e in rec.events if e.kind == "freed")
    expl = (
        f"{now} − {alloc}（分配）− {taken}（命中时被 touch 取出）+ {back}（释放回队列）= {after}。"
        if lang == "zh"
        else f"{now} − {alloc} allocated − {taken} taken out "
        f"by touch on a hit + {back} freed back = {after}."
    )
    return Prediction(
        "free", tr("quiz_q_free", lang), tuple(str(o) for o in opts), opts.index(after), expl
    )


MAKERS = {
    "preempted": _victim,
    "cache_hit": _hit,
    "cache_miss": _hit,
    "evicted": _evict,
    "allocated": _alloc,
    "touched": _hit,
}


def make_prediction(
    snap: Snapshot, rec: StepRecord, lang: str = "en", prefer: tuple[str, ...] = ()
) -> Prediction | None:
    """The most instructive question about ``rec``; None only for a step where nothing changes."""
    order = list(prefer) + ["preempted", "evicted", "cache_hit", "allocated"]
    for kind in order:
        maker = MAKERS.get(kind)
        if maker is not None:
            p = maker(snap, rec, lang)
            if p is not None:
                return p
    if rec.snapshot.num_free_blocks != snap.num_free_blocks or any(
        e.kind == "freed" for e in rec.events
    ):
        return _free(snap, rec, lang)
    return None
