"""Myths some articles tell about vLLM's block manager, checked against the live pool."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from paged_kv_lab.record.snapshot import Snapshot, StepRecord


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


def _ids(blocks) -> str:
    """Block ids as "3, 5" (no brackets: the page shows the live text inside a markdown
    directive)."""
    return ", ".join(str(b) for b in blocks)


def myth_sections(
    snaps: Sequence[Snapshot],
    lang: str = "en",
    records: Optional[Sequence[StepRecord]] = None,
) -> list[tuple[str, str, str]]:
    """(myth, what vLLM does, what the live pool shows now) for each myth; ``records`` (the steps
    that led to ``snaps[-1]``) name the call behind each eviction."""
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
                else "两者不同：驱逐只看队列顺序，从不读时间。"
            )
            if zh
            else f"vLLM reuses next: block {v} (queue head). A "
            f"timestamp LRU would pick: block {t} ({idle}). "
            + (
                "They agree this time — for a different reason: vLLM reads queue order, not time."
                if same
                else "They differ: eviction reads the queue order, never a time."
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
            "vLLM 0.33 的 `KVCacheBlock` 有 block_id、ref_cnt、哈希、`block_hash_num_tokens`"
            "（哈希覆盖的前缀 token 数，本应用也记录它）、两个链表指针、is_null，"
            "以及跨块池延迟释放时用的 "
            "pool 引用——没有时间戳字段。驱逐从不读时间：驱逐顺序就是空闲队列顺序，"
            "带哈希的块释放时追加到队尾（同一请求内逆序），无哈希的块放到队头；"
            "正在使用的块根本不在队列里，touch 是把它移出队列。"
            "vLLM v1 确实有一个可选的指标收集器（`KVCacheMetricsCollector`，由 "
            "`kv_cache_metrics` 设置开启），它抽样记录块的访问时间，用于统计块的驻留时长；"
            "驱逐从不读取这些时间。"
            if zh
            else "vLLM 0.33's `KVCacheBlock` has block_id, ref_cnt, a hash, "
            "`block_hash_num_tokens` (how many prefix tokens that hash covers; we record it "
            "too), two list pointers, is_null and a pool reference for deferred frees across "
            "pools — no timestamp field. Eviction never reads a time: the eviction order is "
            "the free queue's order, hashed blocks appended at the tail when freed (reversed "
            "within a request), unhashed blocks to the head; a block in use is not in the "
            "queue at all, and touch takes it out. vLLM v1 does have an optional metrics "
            "collector (`KVCacheMetricsCollector`, on with the `kv_cache_metrics` setting) "
            "that samples blocks and records their access times for residency statistics; "
            "eviction never reads them.",
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
            "之后重新预填充（常常命中自己仍在缓存中的块）。抢占本身不复制、不换出任何块；"
            "块也没有“脏”标记：满块一旦有了哈希就不再被写入，所以没有什么需要写回。"
            "（v0 曾有 swap，v1 已移除。）"
            "会被复制的是：配置了 KV offloading 连接器时（vLLM 0.33 的 "
            "`SimpleCPUOffloadConnector`，见第 10 课“第二层”），带哈希的满块被复制 GPU → CPU——"
            "eager 模式下每块在其 token 算完后的下一步复制一次，lazy 模式下只复制快被驱逐的块；"
            "GPU 上的块原地不动、仍然缓存。这份副本从不写回覆盖 GPU 块：只有当之后的请求在 GPU "
            "上未命中、在 CPU 上命中时，它才被拷进一个*新分配*的 GPU 块。未满的块没有哈希，"
            "从不被存储。"
            if zh
            else "vLLM v1 preempts by recompute: the victim's blocks are "
            "freed and it is prefilled again later (often hitting its own "
            "still-cached blocks). Preemption itself copies and swaps out nothing, and no "
            "block carries a dirty flag: a full block is never written again once it has a "
            "hash, so there is nothing to write back. (v0 had swapping; v1 removed it.) "
            "What *is* copied, with a KV offloading connector (vLLM 0.33's "
            "`SimpleCPUOffloadConnector`, lesson 10 “A second tier”): full, hashed blocks go "
            "GPU → CPU — in eager mode each once, the step after its tokens were computed; in "
            "lazy mode only those about to be evicted — and the GPU block stays where it is, "
            "still cached. The copy is never written back over a GPU block: it is copied into "
            "a *newly allocated* GPU block only when a later request misses on the GPU and "
            "hits it on the CPU. A partly filled block has no hash and is never stored.",
            live_preempted(snap, pre, zh) + live_cpu_tier(snap, zh),
        )
    )
    w = write_targets(snap)
    hits = hit_lengths(snap)
    inside = [h for h in hits if h % snap.block_size]
    out.append(
        (
            "“Beam search / 并行采样的序列共享物理块；要写入 "
            "ref_cnt > 1 的块时，先复制一份（写时复制，CoW）。”"
            if zh
            else "“Beam search / parallel sampling sequences share physical blocks; "
            "writing a block with ref_cnt > 1 first copies it (copy-on-write).”",
            "那是 vLLM V0 的块管理器。v1 的并行采样不靠写时复制：n > 1 的请求在到达时拆成 n "
            "个子请求（0_id、1_id…），它们只因提示词相同而通过前缀缓存共享块。对只有注意力层的模型"
            "（比如这里的模型），能被共享的只有已缓存的满块，而满块再也不会被写入；"
            "每个请求只写自己最后那个未满的块，它没有哈希，别人命中不了，所以 ref_cnt 总是 1——"
            "从来没有块被复制。vLLM 0.33 只在一种情况下复制块：块内（“partial hash”）命中结束在"
            "某个块的中间时，请求拿到那个块的私有副本，`v1/core/kv_cache_manager.py` 的 "
            "`take_kv_cache_block_copies` 把这些复制以 `KVCacheBlockCopy`"
            "（源块、目标块）交给 worker；"
            "而 `partial_hash_hits_enabled` 只在混合模型含有 align 模式的 Mamba 组时"
            "才允许这种命中。"
            "v1 也没有 beam search 的块分叉。"
            if zh
            else "That is vLLM V0's block manager. v1's parallel sampling uses no copy-on-write: "
            "a request with n > 1 fans out on arrival into n child requests (0_id, 1_id, ...) "
            "that share blocks only because their prompts are equal, through the prefix cache. "
            "For an attention-only model such as ours, only cached full blocks can be shared, "
            "and a full block is never written again; each request writes only its own last, "
            "partial block, which has no hash, so nobody can hit it and its ref_cnt stays 1 — "
            "no block is ever copied. vLLM 0.33 copies a block in one case only: when a "
            "sub-block (“partial hash”) hit ends inside a block, the request gets a private "
            "copy of that block, and `take_kv_cache_block_copies` (`v1/core/kv_cache_manager.py`) "
            "hands the worker the copies as `KVCacheBlockCopy` (source, destination) pairs; "
            "`partial_hash_hits_enabled` allows such hits only when a hybrid model has Mamba "
            "groups in align mode. v1's block manager has no beam-search forking either.",
            (
                f"现在 ref_cnt > 1 的块：{_ids(w.shared) or '无'}（其中没有哈希的："
                f"{len(w.shared_unhashed)}）。运行中的请求下一个 token 写入的块："
                f"{_ids(w.written) or '无'}，其中被共享的："
                f"{len(w.written_shared)}——没有需要复制的块。"
                + (
                    f"到目前为止的命中：{_ids(hits)} 个 token，"
                    + (
                        "都是整块，没有哪个命中结束在块中间。"
                        if not inside
                        else f"其中 {len(inside)} 个结束在块中间。"
                    )
                    if hits
                    else "到目前为止还没有命中。"
                )
                if zh
                else f"Blocks with ref_cnt > 1 now: {_ids(w.shared) or 'none'} "
                f"({len(w.shared_unhashed)} of them without a hash). Blocks the running "
                f"requests write their next token into: {_ids(w.written) or 'none'}, "
                f"{len(w.written_shared)} of them shared — nothing to copy. "
                + (
                    f"Hits so far: {_ids(hits)} tokens, "
                    + (
                        "each a whole number of blocks: no hit ends inside a block."
                        if not inside
                        else f"{len(inside)} of them ending inside a block."
                    )
                    if hits
                    else "No hit so far."
                )
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
            "一个哈希就代表整个前缀，所以查找只需把请求的满块逐个哈希、逐个查字典"
            "（全注意力组从左往右，遇到第一个未命中就停下；滑动窗口组从右往左找窗口所需的连续块）"
            "——没有树节点、没有边，也不需要分裂节点。"
            "SGLang 的树与 vLLM 的块池并排运行同一批请求：见专题"
            "[哈希链与基数树](/designs)。"
            if zh
            else "A radix tree is SGLang's RadixAttention. vLLM v1's BlockPool has one "
            "flat dict: block hash (with its KV cache group) → the blocks holding it. "
            "Hashes are chained, so one hash stands for the whole prefix: a lookup "
            "hashes the request's full blocks and probes the dict one block at a time (a "
            "full-attention group from the left, stopping at the first miss; a sliding-window "
            "group from the right, for the run of blocks its window needs) — no tree nodes, "
            "no edges, no node splitting. SGLang's tree, drawn next to vLLM's pool on the same "
            "requests: the topic [Hash chains vs radix tree](/designs).",
            (
                f"现在这张表有 {n_hash} 个哈希，指向 {n_blocks} 个块。{example}"
                if zh
                else f"The map holds {n_hash} hashes pointing "
                f"at {n_blocks} blocks right now. {example}"
            ),
        )
    )
    out += seed_003_myths(snaps, zh, records)
    return out


def live_cpu_tier(snap: Snapshot, zh: bool) -> str:
    """The CPU tier's copies right now (empty without one)."""
    cpu = snap.cpu_pool
    if cpu is None:
        return ""
    stored = sum(1 for h in cpu.block_hashes if h is not None)
    gpu = sum(1 for b in snap.blocks if b.block_hash is not None)
    return (
        f" 这次运行有 CPU 层：现在 CPU 池存有 {stored} 个块的副本，GPU 池有 {gpu} 个已缓存块。"
        if zh
        else f" This run has a CPU tier: it holds copies of {stored} blocks now, while "
        f"{gpu} blocks are cached in the GPU pool."
    )


def live_preempted(snap: Snapshot, pre: int, zh: bool) -> str:
    """Preemptions so far, and the blocks the preempted requests now waiting still hold."""
    nulls = {b.block_id for b in snap.blocks if b.is_null}
    back = [r for r in snap.requests if r.num_preemptions and r.request_id in snap.waiting]
    held = sum(1 for r in back for t in r.block_tables for b in t if b not in nulls)
    if not back:
        return (
            f"到目前为止的抢占次数：{pre}。现在没有被抢占后仍在等待的请求。"
            if zh
            else f"Preemptions so far: {pre}. No preempted request is waiting now."
        )
    names = _ids(r.request_id for r in back)
    return (
        f"到目前为止的抢占次数：{pre}。被抢占后正在等待的请求 {names} 持有 {held} 个块"
        + ("——它们的块已释放回空闲队列，没有被搬到任何地方。" if not held else "。")
        if zh
        else f"Preemptions so far: {pre}. Preempted and waiting now: {names}, holding {held} "
        "blocks"
        + (" — their blocks went back to the free queue, not anywhere else." if not held else ".")
    )


def seed_003_myths(
    snaps: Sequence[Snapshot], zh: bool, records: Optional[Sequence[StepRecord]] = None
) -> list[tuple[str, str, str]]:
    """Three claims of a Chinese article on vLLM v1's KVCacheManager (seed 003) about parameters
    of allocate_slots and about evict_blocks, against vLLM 0.33.0's source and the live pool
    (``records``: the run's steps up to the last snapshot, for which call evicted what)."""
    snap = snaps[-1]
    out = []
    if records is None:  # the snapshots alone: how many hashes went, not which call took them
        lost = sum(
            1
            for prev, cur in zip(snaps, snaps[1:])
            for a, b in zip(prev.blocks, cur.blocks)
            if a.block_hash is not None and b.block_hash != a.block_hash
        )
        live = (
            f"到目前为止有 {lost} 个已缓存块失去了哈希。"
            if zh
            else f"Cached blocks that lost their hash so far: {lost}."
        )
    else:
        h = hash_losses(records)
        first = (
            (
                f"（第一个：第 {h.popped[0][0]} 步的块 {h.popped[0][1]}）"
                if zh
                else f" (the first: block {h.popped[0][1]} at step {h.popped[0][0]})"
            )
            if h.popped
            else ""
        )
        live = (
            f"到目前为止，get_new_blocks 从队头取出已缓存块、分给新请求时驱逐了 {len(h.popped)} 个"
            f"{first}；evict_blocks 按编号移除了 {len(h.by_id)} 个块的哈希；"
            f"reset_prefix_cache 成功 {h.resets} 次。"
            if zh
            else f"So far get_new_blocks evicted {len(h.popped)} cached blocks by popping them "
            f"from the queue head for a new owner{first}; evict_blocks dropped the hash of "
            f"{len(h.by_id)} blocks by id; reset_prefix_cache succeeded {h.resets} times."
        )
        if not h.popped:
            live += (
                "第 3 课（驱逐）里可以看到一次：在播放器里选“运行直到: 驱逐”。"
                if zh
                else " Lesson 3 (Eviction) shows one: choose “Run until: an eviction” in its "
                "player."
            )
        if h.failed_loads:
            step, rid = h.failed_loads[0]
            live += (
                f"KV 连接器报告了 {len(h.failed_loads)} 次加载失败（第一次：第 {step} 步的 "
                f"{rid}），被退回的请求由 `_handle_invalid_blocks` 处理。"
                if zh
                else f" A KV connector reported {len(h.failed_loads)} failed loads (the first: "
                f"{rid} at step {step}), and `_handle_invalid_blocks` cut those requests back."
            )
        else:
            live += (
                "在第 10 课（第二层）里把“D 从 CPU 的加载”设为失败，"
                "就能看到一次加载失败；"
                "CPU 层总是异步加载，块在加载完成前从未缓存，所以那里 evict_blocks 不会被调用。"
                if zh
                else " Lesson 10 (A second tier) shows a failed load: set “D's "
                "load from the CPU” to fail. The CPU tier always loads asynchronously and its "
                "blocks are not cached before the load is done, so there evict_blocks is not "
                "called."
            )
    out.append(
        (
            "“evict_blocks(block_ids)：强制从前缀缓存中驱逐指定块，"
            "通常用于缓存池满了之后执行 LRU 式淘汰。”"
            if zh
            else "“evict_blocks(block_ids) forcibly evicts the given blocks from the prefix "
            "cache, usually to run an LRU eviction once the cache pool is full.”",
            "`KVCacheManager.evict_blocks` 调用 `BlockPool.evict_blocks`：只移除所列块的前缀缓存"
            "哈希（不论块正在使用还是空闲），不释放块，也不改变空闲队列的顺序。vLLM "
            "的调度器只在一处调用它：KV 连接器报告某些块的 K/V 加载失败时"
            "（`_handle_invalid_blocks`，且 `kv_load_failure_policy` 为默认的 “fail”），"
            "而且只针对运行中的请求同步加载、已进入前缀缓存的块（及其块表中其后的块），"
            "以免之后的请求命中坏数据；异步加载的块在加载完成前从未缓存，无需驱逐。"
            "块池满了并不需要驱逐过程："
            "`get_new_blocks` 从空闲队列队头取块，"
            "取到的已缓存块在那一刻失去哈希（惰性驱逐，见第 3 课）。"
            if zh
            else "`KVCacheManager.evict_blocks` calls `BlockPool.evict_blocks`: it drops the "
            "prefix-cache hash of exactly the blocks named (in use or free), frees nothing "
            "and leaves the free queue's order as it was. vLLM's scheduler calls it in one "
            "place: when a KV connector reports blocks whose K/V failed to load "
            '(`_handle_invalid_blocks`, when `kv_load_failure_policy` is "fail", its '
            "default), and only for blocks a running request loaded synchronously, which are "
            "already cached (with the rest of that table after them), so no later request hits "
            "bad data; an asynchronous load's blocks are not cached until it is done. "
            "A full pool needs no eviction pass: "
            "`get_new_blocks` pops the free queue's head, and a cached block popped there "
            "loses its hash at that moment (lazy eviction, lesson 3).",
            live,
        )
    )
    # every request at every step so far: (step, request, blocks with a hash, full blocks of tokens)
    rows = [(sn.step, *row) for sn in snaps for row in cached_within_tokens(sn)]
    over = [r for r in rows if r[2] > r[3]]
    now = ", ".join(f"{rid} {h} ≤ {f}" for st, rid, h, f in rows if st == snap.step and h <= f)
    if not rows:
        live = "到目前为止还没有请求持有块。" if zh else "No request has held blocks so far."
    elif not over:
        live = (
            f"到目前为止检查了 {len(rows)} 次（每步每个持有块的请求）：块表里带哈希的块从未多于"
            "它真正拥有的 token（提示词 + 输出）能填满的块。" + (f"现在：{now}。" if now else "")
            if zh
            else f"Checked {len(rows)} times so far (each request holding blocks, at each step): "
            "its blocks with a hash never outnumbered the full blocks of tokens it really holds "
            "(prompt + output)." + (f" Now: {now}." if now else "")
        )
    else:
        where = _ids(f"{rid}@{st}" for st, rid, _, _ in over)
        live = (
            f"到目前为止检查了 {len(rows)} 次，其中带哈希的块多于真实 token 满块的有：{where}。"
            if zh
            else f"Checked {len(rows)} times so far; blocks with a hash outnumbered the full "
            f"blocks of real tokens at: {where}."
        )
    out.append(
        (
            "“delay_cache_blocks 表示这轮先分到块、但先不把它们固化进前缀缓存；"
            "这在投机解码里很重要，因为 lookahead 里的草稿 token 还没被确认。”"
            if zh
            else "“delay_cache_blocks means: allocate the blocks this round but do not commit "
            "them to the prefix cache yet — important for speculative decoding, whose "
            "lookahead draft tokens are not confirmed.”",
            "调度器把 `allocate_slots` 的 `delay_cache_blocks` 设为 `load_kv_async`：KV "
            "连接器会在之后的某一步把这个请求的 K/V 传进刚分配的块（预填充/解码分离，KV 传输），"
            "所以块现在就分配，等传输完成后才缓存。草稿 token 是用另一种方式挡在前缀缓存之外的："
            "`allocate_slots` 最多只缓存到 `request.num_tokens`，而草稿不在其中"
            "（它们在 `spec_token_ids` 里）——第 9 课演示了这一点。"
            if zh
            else "The scheduler passes `allocate_slots` `delay_cache_blocks=load_kv_async`: a KV "
            "connector will write this request's K/V into the new blocks in a later step "
            "(prefill/decode disaggregation, a KV transfer), so the blocks are allocated now "
            "and cached once the transfer has arrived. Drafts are kept out of the prefix "
            "cache another way: `allocate_slots` caches at most `request.num_tokens` tokens, "
            "and drafts are not among them (they sit in `spec_token_ids`) — lesson 9 shows it.",
            live,
        )
    )
    pc = snap.prefix_cache
    hits, queries = int(pc.get("hits", 0) or 0), int(pc.get("queries", 0) or 0)
    out.append(
        (
            "“ext_comp：由外部组件（比如多模态 connector）计算并传入的 token。”"
            if zh
            else "“ext_comp: tokens computed by an external component (a multimodal "
            "connector, say) and passed in.”",
            "`ext_comp` 即 `num_external_computed_tokens`：K/V 不在 vLLM 自己的前缀缓存里、"
            "而由 KV 连接器持有的提示 token"
            "（预填充/解码分离中的另一个实例，或 CPU/磁盘 offload 层），"
            "它们被加载进新分配的块。多模态编码器的输出在编码器缓存（`EncoderCacheManager`）里，"
            "`num_encoder_tokens` 是另一个参数，用于编码器-解码器模型的交叉注意力。"
            "`comp` 和 `new_comp` 都是 vLLM 自己的："
            "之前算过的 token，以及这次前缀缓存新命中的 token。"
            if zh
            else "`ext_comp` is `num_external_computed_tokens`: prompt tokens whose K/V is not "
            "in vLLM's own prefix cache but held by a KV connector (another instance in "
            "prefill/decode disaggregation, or a CPU/disk offload tier) and loaded into the "
            "newly allocated blocks. A multimodal encoder's output lives in the encoder cache "
            "(`EncoderCacheManager`), and `num_encoder_tokens` is a separate argument, for "
            "encoder-decoder cross-attention. `comp` and `new_comp` are vLLM's own: tokens "
            "computed before, and the new prefix-cache hit.",
            (
                f"到目前为止，vLLM 自己的前缀缓存在 {queries} 个查询的提示 token 中命中了 {hits} 个"
                "（`new_comp`，PrefixCacheStats）；连接器提供的 token 另计"
                "（connector_prefix_cache_stats）。"
                if zh
                else f"So far vLLM's own prefix cache supplied {hits} of {queries} queried "
                "prompt tokens (`new_comp`, PrefixCacheStats); tokens a connector supplies "
                "are counted apart (connector_prefix_cache_stats)."
            ),
        )
    )
    return out


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
