"""Every event as one sentence with its reason, in English and Chinese.

One table, ``SENTENCES``: per event kind a function giving (English, 中文). The CLI's
step log and the app's event list both read it. Token text comes from a ``decode``
function the caller passes in (kvcore does not know the UI or load a tokenizer here).
Sentences are plain text, safe to show as markdown; they never carry HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from paged_kv_lab.record import events as E
from paged_kv_lab.record.events import Event, EventKind

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Style:
    """How sentences are written: ``decode`` turns token ids into text (None: show the ids);
    ``multi_group`` names the KV cache group of pool events (only hybrid models have several)."""

    decode: Decode | None = None
    multi_group: bool = False


Render = Callable[[Event, Style], tuple[str, str]]

ICONS: dict[EventKind, str] = {
    E.ARRIVED: "📥",
    E.SCHEDULED: "🗓",
    E.ADMITTED: "✅",
    E.RESUMED: "↩️",
    E.BLOCKED: "⛔",
    E.CACHE_HIT: "🎯",
    E.CACHE_MISS: "🔍",
    E.TOUCHED: "👆",
    E.ALLOCATED: "🧱",
    E.EVICTED: "🗑",
    E.CACHED: "🔒",
    E.FREED: "♻️",
    E.WINDOW_SKIPPED: "🪟",
    E.PREEMPTED: "⚠️",
    E.FINISHED: "🏁",
    E.RESET: "🧹",
    E.SAMPLED: "✍️",
    E.DRAFT_PROPOSED: "🔮",
    E.DRAFT_ACCEPTED: "👍",
    E.DRAFT_REJECTED: "👎",
    E.CPU_HIT: "🧊",
    E.CPU_LOAD: "⬆️",
    E.CPU_LOADED: "📦",
    E.CPU_STORED: "⬇️",
    E.CPU_EVICTED: "🫗",
    E.KV_LOAD_FAILED: "💥",
}

# The words behind the short reason codes events carry: (English, 中文).
REASONS: dict[str, tuple[str, str]] = {
    "max_num_seqs": ("max_num_seqs running requests already", "运行中的请求数已达 max_num_seqs"),
    "no_free_blocks": (
        "not enough free blocks for its whole sequence",
        "空闲块不足以容纳它的完整序列",
    ),
    "token_budget": ("this step's token budget is used up", "本步的 token 预算已用完"),
    "finished": ("finished", "请求完成"),
    "preempted": ("preempted", "被抢占"),
    "window": ("left the sliding window", "滑出了滑动窗口"),
    "eos": ("end-of-sequence token", "生成了结束符"),
    "length": ("max_tokens reached", "达到 max_tokens"),
    "stop": ("stop token", "停止符"),
    "reused from queue head": (
        "its block was reused from the queue head",
        "它的块被从队头取出复用",
    ),
    "evict_blocks": ("evict_blocks was called", "调用了 evict_blocks"),
    "prefill": ("prefill", "预填充"),
    "chunk": ("a prefill chunk", "一段分块预填充"),
    "decode": ("decode", "解码"),
    "recompute": ("recomputing after preemption", "抢占后重新计算"),
    "preempted_this_step": (
        "no admissions in a step that preempted",
        "本步发生了抢占，不接纳新请求",
    ),
    "never_fits": (
        "its prompt can never fit in this pool, so it is aborted",
        "它的提示词永远放不进这个块池，因此被中止",
    ),
    "aborted": ("aborted", "已中止"),
    "error": (
        "its KV failed to load and kv_load_failure_policy is fail",
        "它的 KV 加载失败，且 kv_load_failure_policy 为 fail",
    ),
    "load failed": (
        "its load failed before any block was valid",
        "它的加载失败，没有一个块有效",
    ),
    "offload": (
        "the CPU tier's copy of them is done",
        "CPU 层对它们的拷贝已完成",
    ),
    "fcfs": ("FCFS: the last request in running", "FCFS：running 队列中的最后一个"),
    "priority": ("priority: the largest (priority, arrival)", "优先级：(priority, arrival) 最大者"),
}


def reason(key: str | None, lang: str) -> str:
    """The words for a reason code; an unknown code is shown as it is."""
    if key is None:
        return ""
    pair = REASONS.get(str(key))
    if pair is None:
        return str(key)
    return pair[1] if lang == "zh" else pair[0]


def ids(xs: Iterable[int]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


def short_hash(h: str | None, n: int = 8) -> str:
    return "" if not h else h[:n]


def _grp(e: Event, s: Style) -> str:
    return f" (g{e.group})" if s.multi_group and e.group is not None else ""


# -- one renderer per kind: (English, 中文) ----------------------------------------------
def _arrived(e: E.Arrived, s: Style):
    return (
        f"{e.request_id} arrived ({e.num_prompt_tokens} prompt tokens, priority {e.priority}) "
        f"and joined the waiting queue.",
        f"{e.request_id} 到达（{e.num_prompt_tokens} 个提示 "
        f"token，优先级 {e.priority}），进入等待队列。",
    )


def _scheduled(e: E.Scheduled, s: Style):
    return (
        f"{e.request_id} is scheduled for {e.num_tokens} tokens from position {e.start} "
        f"({reason(e.phase, 'en')}).",
        f"{e.request_id} 本步从位置 {e.start} 起调度 "
        f"{e.num_tokens} 个 token（{reason(e.phase, 'zh')}）。",
    )


def _admitted(e: E.Admitted, s: Style):
    c = e.num_cached_tokens
    return (
        f"{e.request_id} admitted from waiting to running; "
        f"{c} of its tokens come from the prefix cache.",
        f"{e.request_id} 从等待转为运行；其中 {c} 个 token 来自前缀缓存。",
    )


def _resumed(e: E.Resumed, s: Style):
    c = e.num_cached_tokens
    if not c:
        return (
            f"{e.request_id} resumed after preemption: none of "
            "its blocks survived, so everything is recomputed.",
            f"{e.request_id} 在被抢占后恢复运行：它的块都已被复用，必须全部重新计算。",
        )
    return (
        f"{e.request_id} resumed after preemption: {c} of its own tokens were still cached, "
        f"so they are not recomputed.",
        f"{e.request_id} 在被抢占后恢复运行：它自己的 {c} 个 token 仍在缓存中，不用重算。",
    )


def _blocked(e: E.Blocked, s: Style):
    return (
        f"{e.request_id} stays waiting: {reason(e.reason, 'en')}.",
        f"{e.request_id} 继续等待：{reason(e.reason, 'zh')}。",
    )


def _cache_hit(e: E.CacheHit, s: Style):
    blocks = " + ".join(ids(g) for g in e.block_ids_per_group if g) or ids(e.block_ids)
    return (
        f"{e.request_id} hit {e.num_blocks} cached blocks ({e.num_tokens} tokens): {blocks}.",
        f"{e.request_id} 命中了 {e.num_blocks} 个已缓存块（{e.num_tokens} 个 token）：{blocks}。",
    )


def _cache_miss(e: E.CacheMiss, s: Style):
    return (
        f"{e.request_id} looked up its {e.num_tokens} prompt tokens in the prefix cache: no hit.",
        f"{e.request_id} 用 {e.num_tokens} 个提示 token 查询前缀缓存：没有命中。",
    )


def _touched(e: E.Touched, s: Style):
    en = f"touch {ids(e.block_ids)}{_grp(e, s)}: ref_cnt + 1"
    zh = f"touch {ids(e.block_ids)}{_grp(e, s)}：ref_cnt 加 1"
    if e.request_id is None:  # the CPU tier pins the blocks it copies
        en, zh = f"CPU tier: {en}", f"CPU 层：{zh}"
        if not e.from_queue:
            return (
                en + ", a pin while it copies them; they cannot be reused until the copy is done.",
                zh + "，拷贝期间钉住它们；拷贝完成前它们不会被复用。",
            )
    if e.request_id:
        en, zh = f"{e.request_id}: {en}", f"{e.request_id}：{zh}"
    if not e.from_queue:
        return (
            en + "; they were in use by others and are now shared.",
            zh + "；这些块正被其他请求使用，现在被共享。",
        )
    fq, pos = ids(e.from_queue), ids(e.queue_positions)
    return (
        en + f"; {fq} were free and leave the free queue (queue "
        f"positions {pos}) — rescued before eviction.",
        zh + f"；{fq} 原本空闲，被从空闲队列中间取出（队列位置 {pos}），它们的缓存得以保住。",
    )


def _allocated(e: E.Allocated, s: Style):
    who = e.request_id or "?"
    en = f"{who} got blocks {ids(e.block_ids)}{_grp(e, s)} from the free-queue head"
    zh = f"{who} 从队头分配了块 {ids(e.block_ids)}{_grp(e, s)}"
    if e.queue_positions:
        en += f" (queue positions {ids(e.queue_positions)})"
        zh += f"（队列位置 {ids(e.queue_positions)}）"
    if e.evicted_hashes:
        lost = ", ".join(f"{bid} ← #{short_hash(h)}" for bid, h in e.evicted_hashes.items())
        en += f"; reusing them dropped cached hashes: {lost}"
        zh += f"；这些块被复用时丢失了哈希：{lost}"
    return en + ".", zh + "。"


def _evicted(e: E.Evicted, s: Style):
    h = short_hash(e.block_hash)
    en_for, zh_for = (
        (f", for {e.request_id}", f"，分给 {e.request_id}") if e.request_id else ("", "")
    )
    return (
        f"block {ids(e.block_ids)} lost hash #{h} ({reason(e.reason, 'en')}{en_for}): "
        f"that prefix can no longer be hit.",
        f"块 {ids(e.block_ids)} 丢失了哈希 "
        f"#{h}（{reason(e.reason, 'zh')}{zh_for}）：这段前缀不能再被命中。",
    )


def _cached(e: E.Cached, s: Style):
    who = e.request_id or "?"
    pairs = ", ".join(f"{bid}=#{short_hash(h)}" for bid, h in zip(e.block_ids, e.block_hashes))
    return (
        f"{who}'s full blocks were cached{_grp(e, s)}: {pairs} ({e.num_tokens} tokens).",
        f"{who} 的满块被缓存{_grp(e, s)}：{pairs}（{e.num_tokens} 个 token）。",
    )


def _freed(e: E.Freed, s: Style):
    who = e.request_id or ("CPU tier" if e.reason == "offload" else "?")
    en_parts, zh_parts = [], []
    if e.to_tail:
        en_parts.append(f"{ids(e.to_tail)} carry a hash and go to the tail (kept for reuse)")
        zh_parts.append(f"{ids(e.to_tail)} 带哈希，放到队尾（保留以供复用）")
    if e.to_head:
        en_parts.append(f"{ids(e.to_head)} have no hash and go to the head (reused first)")
        zh_parts.append(f"{ids(e.to_head)} 没有哈希，放到队头（最先被复用）")
    if e.still_used:
        en_parts.append(f"{ids(e.still_used)} are still used by others")
        zh_parts.append(f"{ids(e.still_used)} 仍被其他请求使用")
    en_detail = (": " + "; ".join(en_parts)) if en_parts else ""
    zh_detail = ("：" + "；".join(zh_parts)) if zh_parts else ""
    return (
        f"{who} freed {ids(e.block_ids)}{_grp(e, s)} in "
        f"reverse order ({reason(e.reason, 'en')}){en_detail}.",
        f"{who} 按逆序释放块 "
        f"{ids(e.block_ids)}{_grp(e, s)}（{reason(e.reason, 'zh')}）{zh_detail}。",
    )


def _window_skipped(e: E.WindowSkipped, s: Style):
    return (
        f"{e.request_id}: logical blocks {ids(e.slots)} left the sliding window{_grp(e, s)}; "
        f"blocks {ids(e.block_ids)} were freed and those slots now point at the null block.",
        f"{e.request_id}：逻辑块 {ids(e.slots)} 滑出了窗口{_grp(e, s)}；"
        f"块 {ids(e.block_ids)} 被释放，这些位置现在指向空块。",
    )


def _preempted(e: E.Preempted, s: Style):
    return (
        f"{e.request_id} was preempted ({reason(e.policy, 'en')}, "
        f"{e.needed_by} needed blocks, priority {e.victim_priority}): all "
        "its blocks are freed and it goes back to waiting to be recomputed.",
        f"{e.request_id} 被抢占（{reason(e.policy, 'zh')}，{e.needed_by} 需要新块，"
        f"优先级 {e.victim_priority}）：释放它的所有块，回到等待队列，之后重新计算。",
    )


def _finished(e: E.Finished, s: Style):
    return (
        f"{e.request_id} finished ({reason(e.reason, 'en')}) and frees its blocks.",
        f"{e.request_id} 完成（{reason(e.reason, 'zh')}），释放它的块。",
    )


def _reset(e: E.PrefixCacheReset, s: Style):
    if e.ok:
        return "reset_prefix_cache: every hash was dropped.", "reset_prefix_cache：所有哈希被清空。"
    n = e.blocks_in_use
    return (
        f"reset_prefix_cache refused: {n} blocks are still in use.",
        f"reset_prefix_cache 被拒绝：还有 {n} 个块正在使用。",
    )


def _sampled(e: E.Sampled, s: Style):
    text = (lambda t: str(t)) if s.decode is None else (lambda t: s.decode([t]))
    parts = ", ".join(f"{rid} → “{text(t)}”" for rid, t in e.tokens.items()) or "—"
    return f"the model sampled: {parts}", f"模型采样：{parts}"


def _tokens(ids: Sequence[int], s: Style) -> str:
    return ", ".join(f"“{s.decode([t])}”" for t in ids) if s.decode else ", ".join(map(str, ids))


def _draft_proposed(e: E.DraftProposed, s: Style):
    d = len(e.draft_token_ids)
    k = e.num_lookahead_tokens
    if k:
        return (
            f"{e.request_id}: the draft model (the target's first layers) drafts "
            f"{d} token{'s' if d != 1 else ''} ({_tokens(e.draft_token_ids, s)}), writing their "
            f"K/V past its {e.num_tokens} tokens into the lookahead slots allocate_slots "
            f"reserved (num_lookahead_tokens = {k}); next step they are scheduled after its last "
            "token, to be verified.",
            f"{e.request_id}：草稿模型（目标模型的前几层）起草了 {d} 个 token"
            f"（{_tokens(e.draft_token_ids, s)}），并把它们的 K/V 写在它的 {e.num_tokens} 个 "
            f"token 之后、allocate_slots 预留的前瞻槽位里（num_lookahead_tokens = {k}）；"
            "下一步它们排在最后一个 token 之后调度，等待验证。",
        )
    return (
        f"{e.request_id}: its latest tokens appeared earlier, so the n-gram proposer drafts the "
        f"{d} token{'s' if d != 1 else ''} that followed there ({_tokens(e.draft_token_ids, s)}); "
        "next step they are scheduled after its last token and get KV slots, to be verified.",
        f"{e.request_id}：它最新的几个 token 在前文出现过，n-gram 提议器据此起草当时紧随其后的 "
        f"{d} 个 token（{_tokens(e.draft_token_ids, s)}）；下一步它们排在最后一个 token 之后调度、"
        f"占用 KV 槽位，等待验证。",
    )


def _draft_accepted(e: E.DraftAccepted, s: Style):
    a = len(e.accepted_token_ids)
    nxt = _tokens([e.next_token_id], s)
    return (
        f"{e.request_id}: the model agreed with {a} of {e.num_draft_tokens} "
        f"draft{'s' if e.num_draft_tokens != 1 else ''} ({_tokens(e.accepted_token_ids, s)}) "
        f"and added its own next token {nxt}: {a + 1} tokens from one forward pass.",
        f"{e.request_id}：模型认可了 {e.num_draft_tokens} 个草稿中的 {a} 个"
        f"（{_tokens(e.accepted_token_ids, s)}），并接上自己的下一个 token {nxt}："
        f"一次前向得到 {a + 1} 个 token。",
    )


def _draft_rejected(e: E.DraftRejected, s: Style):
    r = len(e.rejected_token_ids)
    return (
        f"{e.request_id}: the model chose {_tokens([e.target_token_id], s)} instead of draft "
        f"{_tokens(e.rejected_token_ids[:1], s)}; {r} draft{'s are' if r != 1 else ' is'} dropped "
        f"and num_computed_tokens moves back to {e.num_computed_tokens}, so their slots (positions "
        f"{_tokens(e.positions, Style())}) will be overwritten and never enter the prefix cache.",
        f"{e.request_id}：模型选择了 {_tokens([e.target_token_id], s)} 而不是草稿 "
        f"{_tokens(e.rejected_token_ids[:1], s)}；丢弃 {r} 个草稿，num_computed_tokens 回退到 "
        f"{e.num_computed_tokens}，它们的槽位（位置 {_tokens(e.positions, Style())}）之后会被覆盖，"
        f"也绝不会进入前缀缓存。",
    )


def _cpu_hit(e: E.CpuHit, s: Style):
    return (
        f"{e.request_id}: past its GPU hit of {e.num_local_tokens} tokens, the CPU pool holds the "
        f"next {e.num_tokens} (CPU blocks {ids(e.block_ids)}); they are pinned there and will be "
        "loaded instead of computed.",
        f"{e.request_id}：在 GPU 命中的 {e.num_local_tokens} 个 token 之后，CPU 池还存有接下来的 "
        f"{e.num_tokens} 个（CPU 块 {ids(e.block_ids)}）；它们被钉住，将被加载而不是重新计算。",
    )


def _cpu_load(e: E.CpuLoad, s: Style):
    pairs = ", ".join(f"{c}→{g}" for c, g in zip(e.cpu_block_ids, e.block_ids))
    return (
        f"{e.request_id}: GPU blocks {ids(e.block_ids)} were just allocated for those "
        f"{e.num_tokens} tokens and are filled from the CPU (CPU→GPU: {pairs}) during this step; "
        "the request waits for them (WAITING_FOR_REMOTE_KVS) and computes nothing now.",
        f"{e.request_id}：刚为这 {e.num_tokens} 个 token 分配了 GPU 块 {ids(e.block_ids)}，"
        f"本步从 CPU 拷入（CPU→GPU：{pairs}）；请求在等待（WAITING_FOR_REMOTE_KVS），本步不计算。",
    )


def _cpu_loaded(e: E.CpuLoaded, s: Style):
    if e.load_failed:
        n = e.num_computed_tokens
        return (
            f"{e.request_id}: the failed load is reported done; "
            + (
                f"only its valid blocks enter the GPU prefix cache and it computes again from "
                f"token {n} on."
                if n
                else "no block was valid, so its blocks go back and it starts over from token 0."
            ),
            f"{e.request_id}：失败的加载已报告完成；"
            + (
                f"只有有效的块进入 GPU 前缀缓存，它从第 {n} 个 token 起重新计算。"
                if n
                else "没有一个块有效，它的块被归还，从第 0 个 token 重新开始。"
            ),
        )
    return (
        f"{e.request_id}: the load is done; its loaded blocks enter the GPU prefix cache and it "
        f"runs from token {e.num_computed_tokens} on, as if those tokens had been computed.",
        f"{e.request_id}：加载完成；加载的块进入 GPU 前缀缓存，它从第 {e.num_computed_tokens} "
        f"个 token 起继续，就像这些 token 已经算过一样。",
    )


def _kv_load_failed(e: E.KVLoadFailed, s: Style):
    n = e.num_computed_tokens
    if e.policy == "fail":
        en_then = "under kv_load_failure_policy fail it ends with an error"
        zh_then = "在 kv_load_failure_policy 为 fail 时，它以错误结束"
        if not e.asynchronous:
            en_then = (
                "those blocks and the rest of its table lose their hashes (evict_blocks), and "
                + en_then
            )
            zh_then = "这些块及其块表中其后的块失去哈希（evict_blocks），" + zh_then
    elif e.asynchronous:
        en_then = (
            "when the load is reported done it keeps only the valid blocks and goes on from "
            f"token {n}"
        )
        zh_then = f"加载报告完成后，它只保留有效的块，从第 {n} 个 token 起继续"
    else:
        en_then = (
            f"its output of this step is dropped and it computes again from token {n}, "
            "rewriting the blocks in place"
        )
        zh_then = f"本步输出被丢弃，它从第 {n} 个 token 起重新计算，原地重写这些块"
    return (
        f"{e.request_id}: blocks {ids(e.block_ids)} failed to load from the KV connector; it "
        f"goes back to token {n} ({e.num_lost_tokens} tokens lost) and {en_then}.",
        f"{e.request_id}：块 {ids(e.block_ids)} 从 KV 连接器加载失败；它退回到第 "
        f"{n} 个 token（丢失 {e.num_lost_tokens} 个 token），{zh_then}。",
    )


def _cpu_stored(e: E.CpuStored, s: Style):
    pairs = ", ".join(f"{g}→{c}" for g, c in zip(e.block_ids, e.cpu_block_ids))
    if e.mode == "lazy":
        why_en = "they are hashed and near the GPU free queue's head, so evicted soon"
        why_zh = "它们带哈希且靠近 GPU 空闲队列的队头，很快会被驱逐"
    else:
        who = ", ".join(e.req_ids) or "?"
        why_en = f"{who} computed them in an earlier step (eager mode stores every full block)"
        why_zh = f"{who} 在之前的步骤中算完了它们（eager 模式存储每个满块）"
    return (
        f"stored GPU→CPU ({pairs}): {why_en}; the CPU blocks now carry their hashes and join the "
        "CPU free queue's tail.",
        f"已存储 GPU→CPU（{pairs}）：{why_zh}；这些 CPU 块现在带有它们的哈希，排到 CPU 空闲队列"
        "的队尾。",
    )


def _cpu_evicted(e: E.CpuEvicted, s: Style):
    return (
        f"CPU block {ids(e.block_ids)} was taken from the CPU free queue's head for a new copy and "
        f"lost hash #{short_hash(e.block_hash)}: that block is now in neither tier.",
        f"CPU 块 {ids(e.block_ids)} 被从 CPU 空闲队列队头取出用于新的拷贝，丢失了哈希 "
        f"#{short_hash(e.block_hash)}：该块现在两层都没有了。",
    )


SENTENCES: dict[EventKind, Render] = {
    E.ARRIVED: _arrived,
    E.SCHEDULED: _scheduled,
    E.ADMITTED: _admitted,
    E.RESUMED: _resumed,
    E.BLOCKED: _blocked,
    E.CACHE_HIT: _cache_hit,
    E.CACHE_MISS: _cache_miss,
    E.TOUCHED: _touched,
    E.ALLOCATED: _allocated,
    E.EVICTED: _evicted,
    E.CACHED: _cached,
    E.FREED: _freed,
    E.WINDOW_SKIPPED: _window_skipped,
    E.PREEMPTED: _preempted,
    E.FINISHED: _finished,
    E.RESET: _reset,
    E.SAMPLED: _sampled,
    E.DRAFT_PROPOSED: _draft_proposed,
    E.DRAFT_ACCEPTED: _draft_accepted,
    E.DRAFT_REJECTED: _draft_rejected,
    E.CPU_HIT: _cpu_hit,
    E.CPU_LOAD: _cpu_load,
    E.CPU_LOADED: _cpu_loaded,
    E.CPU_STORED: _cpu_stored,
    E.CPU_EVICTED: _cpu_evicted,
    E.KV_LOAD_FAILED: _kv_load_failed,
}


def sentence(
    e: Event, lang: str = "en", decode: Decode | None = None, multi_group: bool = False
) -> str:
    """One event as one sentence ("zh" for Chinese, anything else English)."""
    en, zh = SENTENCES[e.kind](e, Style(decode, multi_group))
    return zh if lang == "zh" else en


def step_sentences(
    evs: Sequence[Event], lang: str = "en", decode: Decode | None = None, multi_group: bool = False
) -> list[tuple[str, str]]:
    """(kind, icon + sentence) for each event, in the order they happened."""
    return [
        (e.kind.value, f"{ICONS[e.kind]} {sentence(e, lang, decode, multi_group)}") for e in evs
    ]


_BLOCK_KINDS = frozenset({E.ALLOCATED, E.TOUCHED, E.FREED, E.CACHED, E.EVICTED, E.WINDOW_SKIPPED})


def changed_blocks(evs: Sequence[Event]) -> set[int]:
    """Blocks whose state an event of the step changed (for the grid's 'changed' outline)."""
    return {b for e in evs if e.kind in _BLOCK_KINDS for b in e.block_ids}
