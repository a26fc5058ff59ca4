"""Events as sentences, with their reasons, in English and Chinese.

Every function reads ``Event.data`` defensively (``.get``): a missing key makes
a shorter sentence, never an error.
"""
from __future__ import annotations

from typing import Callable, Sequence

from kvcore.events import Event

from .figures.common import short_hash

Decode = Callable[[Sequence[int]], str]

ICONS = {
    "arrived": "📥", "scheduled": "🗓", "admitted": "✅", "resumed": "↩️", "blocked": "⛔",
    "cache_hit": "🎯", "cache_miss": "🔍", "touched": "👆", "allocated": "🧱", "evicted": "🗑",
    "cached": "🔒", "freed": "♻️", "window_skipped": "🪟", "preempted": "⚠️", "finished": "🏁",
    "reset": "🧹", "sampled": "✍️",
}

REASONS = {
    "max_num_seqs": ("max_num_seqs running requests already", "运行中的请求数已达 max_num_seqs"),
    "no_free_blocks": ("not enough free blocks for its whole sequence", "空闲块不足以容纳它的完整序列"),
    "token_budget": ("this step's token budget is used up", "本步的 token 预算已用完"),
    "finished": ("finished", "请求完成"),
    "preempted": ("preempted", "被抢占"),
    "window": ("left the sliding window", "滑出了滑动窗口"),
    "eos": ("end-of-sequence token", "生成了结束符"),
    "length": ("max_tokens reached", "达到 max_tokens"),
    "stop": ("stop token", "停止符"),
    "reused from queue head": ("its block was reused from the queue head", "它的块被从队头取出复用"),
    "evict_blocks": ("evict_blocks was called", "调用了 evict_blocks"),
    "prefill": ("prefill", "预填充"),
    "chunk": ("a prefill chunk", "一段分块预填充"),
    "decode": ("decode", "解码"),
    "recompute": ("recomputing after preemption", "抢占后重新计算"),
    "preempted_this_step": ("no admissions in a step that preempted", "本步发生了抢占，不接纳新请求"),
    "never_fits": ("its prompt can never fit in this pool, so it is aborted", "它的提示词永远放不进这个块池，因此被中止"),
    "aborted": ("aborted", "已中止"),
    "fcfs": ("FCFS: the last request in running", "FCFS：running 队列中的最后一个"),
    "priority": ("priority: the largest (priority, arrival)", "优先级：(priority, arrival) 最大者"),
}


def reason(key, lang: str) -> str:
    if key is None:
        return ""
    pair = REASONS.get(str(key))
    if pair is None:
        return str(key)
    return pair[1] if lang == "zh" else pair[0]


def ids(xs) -> str:
    xs = list(xs or ())
    return "[" + ", ".join(str(x) for x in xs) + "]" if xs else "[]"


def _hash_map(d) -> dict[int, str]:
    out = {}
    for k, v in (d or {}).items():
        try:
            out[int(k)] = str(v)
        except (TypeError, ValueError):
            continue
    return out


def sentence(e: Event, lang: str = "en", decode: Decode | None = None, multi_group: bool = False) -> str:
    """One event as one sentence (markdown-safe, no HTML)."""
    zh = lang == "zh"
    d = e.data or {}
    r = e.request_id or "?"
    b = list(e.block_ids)
    grp = f" (g{e.group})" if multi_group and e.group is not None else ""
    k = e.kind
    if k == "arrived":
        n = d.get("num_prompt_tokens", d.get("num_tokens"))
        extra = (f"（{n} 个提示 token）" if zh else f" ({n} prompt tokens)") if n is not None else ""
        return f"{r} 到达{extra}，进入等待队列。" if zh else f"{r} arrived{extra} and joined the waiting queue."
    if k == "scheduled":
        n, kind = d.get("num_tokens", "?"), reason(d.get("kind"), lang)
        return f"{r} 本步调度 {n} 个 token（{kind}）。" if zh else f"{r} is scheduled for {n} tokens ({kind})."
    if k == "admitted":
        c = d.get("num_cached_tokens", 0)
        return (f"{r} 从等待转为运行；其中 {c} 个 token 来自前缀缓存。" if zh
                else f"{r} admitted from waiting to running; {c} of its tokens come from the prefix cache.")
    if k == "resumed":
        c = d.get("num_cached_tokens", 0)
        if not c:
            return (f"{r} 在被抢占后恢复运行：它的块都已被复用，必须全部重新计算。" if zh
                    else f"{r} resumed after preemption: none of its blocks survived, so everything is recomputed.")
        return (f"{r} 在被抢占后恢复运行：它自己的 {c} 个 token 仍在缓存中，不用重算。" if zh
                else f"{r} resumed after preemption: {c} of its own tokens were still cached, so they are not recomputed.")
    if k == "blocked":
        why = reason(d.get("reason"), lang)
        return f"{r} 继续等待：{why}。" if zh else f"{r} stays waiting: {why}."
    if k == "cache_hit":
        nb, nt = d.get("num_blocks", len(b)), d.get("num_tokens", "?")
        per = d.get("block_ids_per_group") or [b]
        blocks = " + ".join(ids(g) for g in per if g) or ids(b)
        return (f"{r} 命中了 {nb} 个已缓存块（{nt} 个 token）：{blocks}。" if zh
                else f"{r} hit {nb} cached blocks ({nt} tokens): {blocks}.")
    if k == "cache_miss":
        n = d.get("num_tokens", "?")
        return (f"{r} 用 {n} 个提示 token 查询前缀缓存：没有命中。" if zh
                else f"{r} looked up its {n} prompt tokens in the prefix cache: no hit.")
    if k == "touched":
        fq, pos = list(d.get("from_queue", [])), list(d.get("queue_positions", []))
        base = (f"touch {ids(b)}{grp}：ref_cnt 加 1" if zh else f"touch {ids(b)}{grp}: ref_cnt + 1")
        if fq:
            where = f"（队列位置 {ids(pos)}）" if pos else ""
            where_en = f" (queue positions {ids(pos)})" if pos else ""
            return (base + f"；{ids(fq)} 原本空闲，被从空闲队列中间取出{where}，它们的缓存得以保住。" if zh
                    else base + f"; {ids(fq)} were free and leave the free queue{where_en} — rescued before eviction.")
        return base + ("；这些块正被其他请求使用，现在被共享。" if zh else "; they were in use by others and are now shared.")
    if k == "allocated":
        pos = list(d.get("queue_positions", []))
        ev = _hash_map(d.get("evicted_hashes"))
        s = (f"{r} 从队头分配了块 {ids(b)}{grp}" if zh else f"{r} got blocks {ids(b)}{grp} from the free-queue head")
        if pos:
            s += f"（队列位置 {ids(pos)}）" if zh else f" (queue positions {ids(pos)})"
        if ev:
            lost = ", ".join(f"{bid} ← #{short_hash(h)}" for bid, h in ev.items())
            s += (f"；这些块被复用时丢失了哈希：{lost}" if zh else f"; reusing them dropped cached hashes: {lost}")
        return s + "。" if zh else s + "."
    if k == "evicted":
        h = d.get("hash")
        why = reason(d.get("reason"), lang)
        return (f"块 {ids(b)} 丢失了哈希 #{short_hash(h)}（{why}）：这段前缀不能再被命中。" if zh
                else f"block {ids(b)} lost hash #{short_hash(h)} ({why}): that prefix can no longer be hit.")
    if k == "cached":
        hs = [short_hash(h) for h in d.get("hashes", [])]
        n = d.get("num_tokens")
        hs_txt = ", ".join(f"{bid}=#{h}" for bid, h in zip(b, hs)) if hs else ids(b)
        extra = (f"（{n} 个 token）" if zh else f" ({n} tokens)") if n else ""
        return (f"{r} 的满块被缓存{grp}：{hs_txt}{extra}。" if zh
                else f"{r}'s full blocks were cached{grp}: {hs_txt}{extra}.")
    if k == "freed":
        why = reason(d.get("reason"), lang)
        tail, head, used = d.get("to_tail", []), d.get("to_head", []), d.get("still_used", [])
        parts = []
        if tail:
            parts.append(f"{ids(tail)} 带哈希，放到队尾（保留以供复用）" if zh
                         else f"{ids(tail)} carry a hash and go to the tail (kept for reuse)")
        if head:
            parts.append(f"{ids(head)} 没有哈希，放到队头（最先被复用）" if zh
                         else f"{ids(head)} have no hash and go to the head (reused first)")
        if used:
            parts.append(f"{ids(used)} 仍被其他请求使用" if zh else f"{ids(used)} are still used by others")
        detail = ("；".join(parts) if zh else "; ".join(parts))
        return (f"{r} 按逆序释放块 {ids(b)}{grp}（{why}）" + (f"：{detail}" if detail else "") + "。" if zh
                else f"{r} freed {ids(b)}{grp} in reverse order ({why})" + (f": {detail}" if detail else "") + ".")
    if k == "window_skipped":
        slots = d.get("slots", [])
        bl = d.get("block_ids", b)
        return (f"{r}：逻辑块 {ids(slots)} 滑出了窗口{grp}；块 {ids(bl)} 被释放，这些位置现在指向空块。" if zh
                else f"{r}: logical blocks {ids(slots)} left the sliding window{grp}; blocks {ids(bl)} "
                     f"were freed and those slots now point at the null block.")
    if k == "preempted":
        pol = reason(d.get("policy"), lang)
        why = d.get("reason")
        if zh and isinstance(why, str) and why.endswith(" needed blocks"):
            why = why[: -len(" needed blocks")] + " 需要新块"
        why_s = f"，{why}" if zh and why else (f", {why}" if why else "")
        pr = d.get("victim_priority")
        pr_s = (f"，优先级 {pr}" if zh else f", priority {pr}") if pr is not None else ""
        return (f"{r} 被抢占（{pol}{why_s}{pr_s}）：释放它的所有块，回到等待队列，之后重新计算。" if zh
                else f"{r} was preempted ({pol}{why_s}{pr_s}): all its blocks are freed and it goes back to "
                     f"waiting to be recomputed.")
    if k == "finished":
        why = reason(d.get("reason"), lang)
        return f"{r} 完成（{why}），释放它的块。" if zh else f"{r} finished ({why}) and frees its blocks."
    if k == "reset":
        ok = d.get("ok", d.get("success", True))
        if zh:
            return "reset_prefix_cache：所有哈希被清空。" if ok else "reset_prefix_cache 被拒绝：还有块正在使用。"
        return ("reset_prefix_cache: every hash was dropped." if ok
                else "reset_prefix_cache refused: blocks are still in use.")
    if k == "sampled":
        toks = d.get("tokens", {}) or {}
        parts = []
        for rid, tid in toks.items():
            tid_list = tid if isinstance(tid, list) else [tid]
            txt = decode(tid_list) if decode else str(tid)
            parts.append(f"{rid} → “{txt}”")
        return ("模型采样：" if zh else "the model sampled: ") + (", ".join(parts) if parts else "—")
    return f"{k}: {r} {ids(b)} {d}"


def step_sentences(events: Sequence[Event], lang: str = "en", decode: Decode | None = None,
                   multi_group: bool = False) -> list[tuple[str, str]]:
    """(kind, sentence with its icon) for each event, in the order they happened."""
    out = []
    for e in events:
        out.append((e.kind, f"{ICONS.get(e.kind, '•')} {sentence(e, lang, decode, multi_group)}"))
    return out


def changed_blocks(events: Sequence[Event]) -> set[int]:
    """Blocks any event of the step touched (for the grid's 'changed' outline)."""
    out: set[int] = set()
    for e in events:
        if e.kind in ("allocated", "touched", "freed", "cached", "evicted", "window_skipped"):
            out.update(e.block_ids)
            out.update(int(x) for x in (e.data or {}).get("block_ids", []) if isinstance(x, int))
    return out
