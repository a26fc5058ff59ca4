"""Myths some articles tell about vLLM's block manager, checked against the live pool."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from record.snapshot import Snapshot


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


def _ids(blocks) -> str:
    """Block ids as "3, 5" (no brackets: the page shows the live text inside a markdown
    directive)."""
    return ", ".join(str(b) for b in blocks)


def myth_sections(snaps: Sequence[Snapshot], lang: str = "en") -> list[tuple[str, str, str]]:
    """(myth, what vLLM does, what the live pool shows now) for each myth."""
    zh = lang == "zh"
    snap = snaps[-1]
    out = []
    c = lru_contrast(snaps)
    if c.vllm_order:
        v, t = c.vllm_order[0], c.timestamp_order[0]
        lu = c.last_used.get(t, -1)
        idle = (
            ("从未使用" if zh else "never used")
            if lu < 0
            else (f"第 {lu} 步后空闲" if zh else f"idle since step {lu}")
        )
        same = v == t
        live = (
            f"vLLM 下一个复用：块 {v}（队头）。时间戳 LRU 会选：块 {t}（{idle}）。"
            + (
                "这次两者一致——但原因不同：vLLM 看的是队列顺序，不是时间。"
                if same
                else "两者不同：vLLM 没有时间戳。"
            )
            if zh
            else f"vLLM reuses next: block {v} (queue head). A "
            f"timestamp LRU would pick: block {t} ({idle}). "
            + (
                "They agree this time — for a different reason: vLLM reads queue order, not time."
                if same
                else "They differ: vLLM has no timestamps."
            )
        )
    else:
        live = "空闲队列为空。" if zh else "The free queue is empty."
    out.append(
        (
            "“块元数据带 last_accessed 时间戳，LRU 驱逐时间最早的块；touch 更新时间戳。”"
            if zh
            else "“Each block has a last_accessed timestamp; LRU "
            "evicts the oldest; touch updates the timestamp.”",
            "vLLM 的 KVCacheBlock 只有 block_id、ref_cnt、哈希、两个链表指针和 is_null。"
            "驱逐顺序就是空闲队列顺序：释放时追加到队尾（同一请求内逆序），0.33 "
            "中无哈希的块放到队头；正在使用的块根本不在队列里，touch 是把它移出队列。"
            if zh
            else "vLLM's KVCacheBlock has block_id, ref_cnt, a hash, two list pointers and "
            "is_null — nothing else. The eviction order is the free queue's order: appended "
            "at the tail when freed (reversed within a request), unhashed blocks to the head "
            "in 0.33; a block in use is not in the queue at all, and touch takes it out.",
            live,
        )
    )
    runs = free_runs(snap)
    waste, held = internal_waste(snap)
    pct = (100 * waste / held) if held else 0.0
    out.append(
        (
            "“Block Manager 检测碎片率，并通过整理/合并空闲块来减少碎片。”"
            if zh
            else "“The block manager measures a fragmentation "
            "rate and defragments / coalesces free blocks.”",
            "所有块大小相同，任何空闲块都能满足任何请求：块表把逻辑块映射到任意物理块，"
            "所以不存在外部碎片，vLLM 也从不移动或整理块。"
            "唯一的浪费在每个请求最后一个未满的块里（内部碎片，最多 block_size − 1 个槽位）。"
            if zh
            else "All blocks have one size and any free block serves any request: "
            "the block table maps logical blocks to arbitrary physical ones, so "
            "there is no external fragmentation and vLLM never moves or compacts "
            "blocks. The only waste is inside each request's last, partly filled "
            "block (internal fragmentation, at most block_size − 1 slots).",
            (
                f"现在 {len(snap.free_queue)} 个空闲块分成 {len(runs)} 段不连续的编号——这无关紧要。"
                f"运行中请求预留的 {held} 个槽位中有 {waste} 个尚未使用（{pct:.0f}%）。"
                if zh
                else f"Right now the {len(snap.free_queue)} free blocks form {len(runs)} "
                f"separate id runs — and it does not matter. Of the {held} slots "
                f"reserved by running requests, {waste} are not used yet ({pct:.0f}%)."
            ),
        )
    )
    pre = sum(r.num_preemptions for r in snap.requests)
    out.append(
        (
            "“内存不足时把块换出到 CPU（swap），块有 is_dirty 标记需要写回。”"
            if zh
            else "“When memory runs out, blocks are swapped to CPU; "
            "blocks carry an is_dirty flag for write-back.”",
            "vLLM v1 的调度器通过重算来抢占：释放被抢占请求的所有块，"
            "之后重新预填充（常常命中自己仍在缓存中的块）。KV "
            "块从不被写回任何地方，所以没有“脏”块。（v0 曾有 swap，v1 已移除。）"
            if zh
            else "vLLM v1 preempts by recompute: the victim's blocks are "
            "freed and it is prefilled again later (often hitting its own "
            "still-cached blocks). KV blocks are never written back anywhere, "
            "so nothing is 'dirty'. (v0 had swapping; v1 removed it.)",
            (
                f"到目前为止的抢占次数：{pre}。换出到 CPU 的块：0。"
                if zh
                else f"Preemptions so far: {pre}. Blocks swapped to CPU: 0."
            ),
        )
    )
    w = write_targets(snap)
    out.append(
        (
            "“Beam search / 并行采样的序列共享物理块；要写入 "
            "ref_cnt > 1 的块时，先复制一份（写时复制，CoW）。”"
            if zh
            else "“Beam search / parallel sampling sequences share physical blocks; "
            "writing a block with ref_cnt > 1 first copies it (copy-on-write).”",
            "那是 vLLM V0 的块管理器。v1 没有写时复制：n > 1 的请求在到达时拆成 n 个子请求（0_id、"
            "1_id…），它们只因提示词相同而通过前缀缓存共享块。能被共享的只有已缓存的满块，"
            "而满块再也不会被写入；每个请求只写自己最后那个未满的块，未满的块没有哈希，"
            "别人命中不了，所以它的 ref_cnt 总是 1。v1 也没有 beam search 的块分叉。"
            if zh
            else "That is vLLM V0's block manager. v1 has no copy-on-write: a request with n > "
            "1 fans out on arrival into n child requests (0_id, 1_id, ...) that share blocks "
            "only because their prompts are equal, through the prefix cache. Only cached full "
            "blocks can be shared, and a full block is never written again; each request "
            "writes only its own last, partial block, which has no hash, so nobody can hit it "
            "and its ref_cnt stays 1. v1's block manager has no beam-search forking either.",
            (
                f"现在 ref_cnt > 1 的块：{_ids(w.shared) or '无'}（其中没有哈希的："
                f"{len(w.shared_unhashed)}）。运行中的请求下一个 token 写入的块："
                f"{_ids(w.written) or '无'}，其中被共享的："
                f"{len(w.written_shared)}——没有需要复制的块。"
                if zh
                else f"Blocks with ref_cnt > 1 now: {_ids(w.shared) or 'none'} "
                f"({len(w.shared_unhashed)} of them without a hash). Blocks the running "
                f"requests write their next token into: {_ids(w.written) or 'none'}, "
                f"{len(w.written_shared)} of them shared — nothing to copy."
            ),
        )
    )
    n_hash, n_blocks, first = hash_map_summary(snap)
    example = ""
    if first is not None:
        example = (
            f"例如 {first[0][:12]}… → 块 {_ids(first[1])}。"
            if zh
            else f"For example {first[0][:12]}… → blocks {_ids(first[1])}."
        )
    out.append(
        (
            "“vLLM 用基数树（Radix Tree）管理前缀哈希与物理块的对应关系，"
            "树的每个节点对应一个物理块。”"
            if zh
            else "“vLLM keeps prefix hashes in a radix tree; each tree node is a physical block.”",
            "基数树是 SGLang 的 RadixAttention。vLLM v1 的 BlockPool "
            "只有一张扁平的字典：块哈希（带 KV cache 组号）→ 持有它的块。哈希是链式的，"
            "一个哈希就代表整个前缀，所以查找只需把请求的满块逐个哈希、逐个查字典，"
            "遇到第一个未命中就停下——没有树节点、没有边，也不需要分裂节点。"
            if zh
            else "A radix tree is SGLang's RadixAttention. vLLM v1's BlockPool has one "
            "flat dict: block hash (with its KV cache group) → the blocks holding it. "
            "Hashes are chained, so one hash stands for the whole prefix: a lookup "
            "hashes the request's full blocks and probes the dict one block at a time, "
            "stopping at the first miss — no tree nodes, no edges, no node splitting.",
            (
                f"现在这张表有 {n_hash} 个哈希，指向 {n_blocks} 个块。{example}"
                if zh
                else f"The map holds {n_hash} hashes pointing "
                f"at {n_blocks} blocks right now. {example}"
            ),
        )
    )
    return out


_SHOWN: "OrderedDict[tuple, list[tuple[str, str, str]]]" = OrderedDict()
_SHOWN_LOCK = threading.Lock()
SHOWN_MAX = 512


def myth_sections_at(
    run_key: str, step: int, snaps: Callable[[], Sequence[Snapshot]], lang: str = "en"
) -> list[tuple[str, str, str]]:
    """``myth_sections`` of a recorded run at ``step``, computed once per server process: every
    session at the same step of the same run (a class on one lesson) shares it, and a run's
    history is walked once per step, not once per cursor report. Bounded (LRU), thread-safe."""
    key = (run_key, step, lang)
    with _SHOWN_LOCK:
        hit = _SHOWN.get(key)
        if hit is not None:
            _SHOWN.move_to_end(key)
            return hit
    out = myth_sections(snaps(), lang)
    with _SHOWN_LOCK:
        _SHOWN[key] = out
        while len(_SHOWN) > SHOWN_MAX:
            _SHOWN.popitem(last=False)
    return out
