"""Lesson 10: a second tier. vLLM 0.33's SimpleCPUOffloadConnector keeps copies of GPU blocks in a
CPU pool of its own, so a block evicted from the GPU is not always lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle
from paged_kv_lab.record.snapshot import StepRecord

A = "The capital of France is Paris, and the capital of Spain is"
B = "Once upon a time, in a small village by the sea, there lived an old fisherman who told stories"

LESSON = Lesson(
    id="secondtier",
    number=10,
    icon="🧊",
    title={"en": "A second tier", "zh": "第二层"},
    summary={
        "en": "A GPU pool too small for the working set, and a CPU pool beside it: blocks evicted "
        "from the GPU survive on the CPU, a later request hits them there and they are loaded "
        "back (vLLM 0.33's SimpleCPUOffloadConnector).",
        "zh": "GPU 块池装不下工作集，旁边有一个 CPU 块池：从 GPU 驱逐的块在 CPU 上还活着，"
        "之后的请求在那里命中它们，再把它们加载回来（vLLM 0.33 的 SimpleCPUOffloadConnector）。",
    },
    scenario={
        "name": "lesson-10-second-tier",
        "description": "An 8-block GPU pool and a 24-block CPU pool. A and B miss; B evicts A's "
        "blocks from the GPU, but their copies stay on the CPU. C repeats B's prompt: a GPU hit. "
        "D repeats A's: a GPU miss, a CPU hit, loaded back. E is new: a miss.",
        "model": "smollm2",
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 8,
            "max_num_seqs": 2,
            "max_num_batched_tokens": 64,
            "cpu_offload": {"num_cpu_blocks": 24, "lazy_offload": False},
        },
        "requests": [
            {"id": "A", "prompt": A, "max_tokens": 4, "ignore_eos": True},
            {"id": "B", "prompt": B, "max_tokens": 4, "arrival_step": 5, "ignore_eos": True},
            {
                "id": "C",
                "prompt": B + " about the sea",
                "max_tokens": 4,
                "arrival_step": 10,
                "ignore_eos": True,
            },
            {
                "id": "D",
                "prompt": A + " Madrid. The capital of Italy is",
                "max_tokens": 4,
                "arrival_step": 15,
                "ignore_eos": True,
            },
            {
                "id": "E",
                "prompt": "Water boils at one hundred degrees Celsius at sea level, and it "
                "freezes at",
                "max_tokens": 4,
                "arrival_step": 20,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "Only {num_gpu_blocks} GPU blocks (one of them the null block): not enough to keep "
        "every prompt cached. Beside them sits a **CPU pool** with its own `BlockPool`, its own "
        "free queue and its own hash map (vLLM 0.33's `SimpleCPUOffloadConnector`, eager mode). "
        "Below the player, both pools are drawn with their free queues, head → tail, at the "
        "step you are on.",
        "zh": "只有 {num_gpu_blocks} 个 GPU 块（其中一个是空块）：不足以把每个提示词都留在缓存里。"
        "旁边是一个 **CPU 块池**，有自己的 `BlockPool`、自己的空闲队列和自己的哈希表"
        "（vLLM 0.33 的 `SimpleCPUOffloadConnector`，eager 模式）。播放器下方画出了当前这一步"
        "两个块池及其空闲队列（队头 → 队尾）。",
    },
    moments=(
        Moment(
            "cpu_stored",
            text={
                "en": "A's prompt blocks were computed in the last step, so now they are "
                "**copied** GPU → CPU ({blocks} → {cpu_block_ids}). Nothing moves: the GPU blocks "
                "stay A's and stay cached; each was pinned (ref_cnt + 1) only while copied. The "
                "CPU blocks take the same hashes and join the CPU free queue's tail.",
                "zh": "A 的提示词块在上一步算完，所以现在把它们**复制** GPU → CPU（{blocks} → "
                "{cpu_block_ids}）。没有东西被移走：GPU 块仍属于 A、仍然缓存；"
                "每块只在复制期间被钉住（ref_cnt + 1）。"
                "CPU 块拿到相同的哈希，排到 CPU 空闲队列的队尾。",
            },
        ),
        Moment(
            "evicted",
            request="B",
            text={
                "en": "B's long prompt needs the queue head, and the head is A's cached blocks: "
                "popping them evicts them from the **GPU** prefix cache ({blocks}). On the GPU "
                "alone, A's prefix would now be lost — but its copies are still on the CPU.",
                "zh": "B 的长提示词需要队头的块，而队头正是 A 的已缓存块："
                "取出它们就把它们从 **GPU** 前缀缓存中驱逐（{blocks}）。"
                "只看 GPU 的话，A 的前缀现在已经没了——但它的副本还在 CPU 上。",
            },
        ),
        Moment(
            "cache_hit",
            request="C",
            text={
                "en": "C repeats B's prompt while B's blocks are still cached on the GPU: a "
                "**GPU hit** of {num_tokens} tokens, touched in place — nothing is copied.",
                "zh": "C 重复了 B 的提示词，而 B 的块还缓存在 GPU 上：**GPU 命中** {num_tokens} 个 "
                "token，原地 touch——不复制任何东西。",
            },
        ),
        Moment(
            "cpu_hit",
            request="D",
            text={
                "en": "D repeats A's prompt. The GPU lookup stops after {num_local_tokens} tokens, "
                "but the connector looks the remaining block hashes up in the **CPU pool** and "
                "finds {num_tokens} tokens there (CPU blocks {blocks}), pinned until the "
                "scheduler allocates. Like a GPU hit, it stops before the last prompt token.",
                "zh": "D 重复了 A 的提示词。GPU 查找在 {num_local_tokens} 个 token 后停下，"
                "但连接器在 **CPU 池**里查剩下的块哈希，找到了 {num_tokens} 个 token（CPU 块 "
                "{blocks}），在调度器分配之前一直钉住它们。和 GPU 命中一样，它停在提示词最后一个 "
                "token 之前。",
            },
        ),
        Moment(
            "cpu_load",
            request="D",
            text={
                "en": "The scheduler counts those tokens as **external computed tokens**: it "
                "allocates fresh GPU blocks {blocks} for them, and the worker copies CPU blocks "
                "{cpu_block_ids} into them during this step. The load is asynchronous, so D "
                "waits (`WAITING_FOR_REMOTE_KVS`) and computes nothing now.",
                "zh": "调度器把这些 token 记为**外部已计算 token**："
                "为它们分配新的 GPU 块 {blocks}，worker 在本步把 CPU 块 {cpu_block_ids} 拷进去。"
                "加载是异步的，所以 D 在等待"
                "（`WAITING_FOR_REMOTE_KVS`），本步不做计算。",
            },
        ),
        Moment(
            "cpu_loaded",
            request="D",
            where="load_ok",
            text={
                "en": "The copies are done: the loaded blocks get their hashes in the GPU prefix "
                "cache and D runs from token {num_computed_tokens} — the prefix came back from "
                "the CPU instead of being recomputed.",
                "zh": "拷贝完成：加载的块在 GPU 前缀缓存中拿到哈希，"
                "D 从第 {num_computed_tokens} 个 token 起运行——"
                "前缀是从 CPU 取回的，而不是重新计算。",
            },
        ),
        Moment(
            "kv_load_failed",
            request="D",
            key=False,
            text={
                "en": "With the switch on, the copy into D's blocks **fails**: the worker reports "
                "GPU blocks {blocks} as `invalid_block_ids`. `_handle_invalid_blocks` cuts D back "
                "to token {num_computed_tokens}, the start of its first failed block "
                "({num_lost_tokens} tokens lost). D was still waiting for its load, so those "
                "blocks never entered the GPU prefix cache and there is nothing to evict: vLLM "
                "calls `evict_blocks` only for blocks a running request loaded synchronously, "
                "under the “fail” policy — and this connector always loads asynchronously. This "
                "run's `kv_load_failure_policy` is “{policy}”: “recompute” computes the lost "
                "tokens again, “fail” (vLLM's default) ends D with an error.",
                "zh": "打开开关后，拷入 D 的块的操作**失败**：worker 把 GPU 块 {blocks} 报告为 "
                "`invalid_block_ids`。`_handle_invalid_blocks` 把 D 退回到第 {num_computed_tokens} "
                "个 token，即它第一个失败块的开头（丢失 {num_lost_tokens} 个 token）。"
                "D 还在等待加载，这些块从未进入 GPU 前缀缓存，所以没有东西需要驱逐：vLLM 只在"
                "“fail”策略下、对运行中的请求同步加载的块调用 `evict_blocks`——而这个连接器总是异步"
                "加载。本次运行的 `kv_load_failure_policy` 是“{policy}”：“recompute”重新计算丢失的 "
                "token，“fail”（vLLM 的默认值）让 D 以错误结束。",
            },
        ),
        Moment(
            "cpu_loaded",
            request="D",
            where="load_failed",
            key=False,
            text={
                "en": "The failed load is reported done (a connector reports a load finished, "
                "failed or not). Only the blocks before the first failed one would be cached, and "
                "D kept none ({num_computed_tokens} valid tokens: its whole prefix came from the "
                "CPU), so its blocks go back to the free queue and D starts over with a new "
                "lookup. The CPU pool still holds the copies, so D is loaded again, and this copy "
                "succeeds; its output still equals transformers' generate.",
                "zh": "失败的加载被报告为完成（连接器无论成败都要报告加载完成）。"
                "只有第一个失败块之前的块才会被缓存，而 D 一个也没有"
                "（有效 token {num_computed_tokens} 个：它的整个前缀"
                "都来自 CPU），所以它的块回到空闲队列，D 重新查找。CPU 池仍保存着副本，于是 D "
                "再次加载，这次拷贝成功；它的输出仍与 transformers 的 generate 相同。",
            },
        ),
        Moment(
            "finished",
            request="D",
            where="error_reason",
            key=False,
            text={
                "en": "Under “fail”, D ends with an error (`FINISHED_ERROR`) and frees its "
                "blocks; a client would see the request fail rather than wait for a recompute.",
                "zh": "在“fail”策略下，D 以错误结束（`FINISHED_ERROR`）并释放它的块；"
                "客户端看到的是请求失败，而不是等待重新计算。",
            },
        ),
        Moment(
            "cpu_evicted",
            key=False,
            text={
                "en": "The CPU pool is finite too: a new copy took CPU block {blocks} from the "
                "CPU queue's head and evicted its hash — that block is now in neither tier.",
                "zh": "CPU 池也是有限的：一份新副本从 CPU 队头取走了 CPU 块 {blocks} 并驱逐了它的"
                "哈希——该块现在两层都没有了。",
            },
        ),
    ),
    outro={
        "en": "The table under the player splits each request's prompt by tier (GPU hit, CPU hit, "
        "computed) and shows its time to first token as measured here. Give the GPU pool more "
        "blocks with the switch above: A's blocks then survive on the GPU and D hits there. The "
        "second switch makes D's copy from the CPU fail, as a connector reports a failed load "
        "(`invalid_block_ids`), and shows what `kv_load_failure_policy` does with it. The "
        "playground sets the CPU pool's size and its lazy mode.",
        "zh": "播放器下方的表格把每个请求的提示词按层拆分（GPU 命中、CPU 命中、计算），并给出在"
        "这里测得的首 token 时间。用上面的开关给 GPU 块池更多块："
        "A 的块就会留在 GPU 上，D 在那里命中。"
        "第二个开关让 D 从 CPU 的拷贝失败，就像连接器报告加载失败（`invalid_block_ids`）那样，"
        "并展示 `kv_load_failure_policy` 如何处理它。"
        "CPU 池的大小和 lazy 模式可以在实验场里设置。",
    },
    questions=(
        Question(
            prompt={
                "en": "In eager mode, when does a block get copied to the CPU pool?",
                "zh": "在 eager 模式下，一个块什么时候被复制到 CPU 池？",
            },
            options=(
                {
                    "en": "Once it is full and hashed, in the step after its tokens were computed",
                    "zh": "满块并有了哈希之后，在其 token 算完后的下一步",
                },
                {"en": "When it is evicted from the GPU", "zh": "当它被从 GPU 驱逐时"},
                {"en": "When its request is preempted", "zh": "当它的请求被抢占时"},
            ),
            answer=0,
            explain={
                "en": "Eager mode stores every full block whose tokens are confirmed computed (a "
                "finished request's last blocks are flushed the step after it finishes). Lazy "
                "mode (`lazy_offload`) instead copies the hashed blocks near the GPU free "
                "queue's head, those about to be evicted. Preemption stores nothing extra.",
                "zh": "eager 模式存储每个 token 已确认算完的满块（请求完成后，它最后几块在下一步"
                "补存）。lazy 模式（`lazy_offload`）则只复制靠近 GPU 空闲队列队头、即将被驱逐的带"
                "哈希块。抢占不会额外存储任何块。",
            },
        ),
        Question(
            prompt={
                "en": "A request hits 12 tokens on the CPU. What happens in the step it is "
                "admitted?",
                "zh": "一个请求在 CPU 上命中了 12 个 token。它被接纳的那一步发生什么？",
            },
            options=(
                {
                    "en": "New GPU blocks are allocated and filled from the CPU; it computes "
                    "nothing until the next step",
                    "zh": "分配新的 GPU 块并从 CPU 拷入；它到下一步才开始计算",
                },
                {
                    "en": "It reads the K/V straight from CPU memory during attention",
                    "zh": "注意力计算时直接从 CPU 内存读取 K/V",
                },
                {
                    "en": "The CPU blocks are moved back into the GPU blocks they came from",
                    "zh": "CPU 块被移回它们原来的 GPU 块",
                },
            ),
            answer=0,
            explain={
                "en": "Attention only reads the GPU pool. The hit becomes external computed "
                "tokens: `allocate_slots` gives them new blocks (from the GPU queue head, like "
                "any allocation), `update_state_after_alloc` plans the copy, and the request "
                "waits in WAITING_FOR_REMOTE_KVS until the worker reports it done.",
                "zh": "注意力只读取 GPU 池。命中变成外部已计算 token：`allocate_slots` 为它们分配"
                "新块（和任何分配一样从 GPU 队头取），`update_state_after_alloc` 安排拷贝，请求在 "
                "WAITING_FOR_REMOTE_KVS 中等待，直到 worker 报告完成。",
            },
        ),
    ),
    toggles=(
        Toggle(
            "num_gpu_blocks",
            {"en": "GPU pool size (blocks)", "zh": "GPU 块池大小（块数）"},
            (8, 12, 24),
        ),
        Toggle(
            "failed_load",
            {"en": "D's load from the CPU", "zh": "D 从 CPU 的加载"},
            ("none", "D:recompute", "D:fail"),
            (
                {"en": "succeeds", "zh": "成功"},
                {"en": "fails (recompute)", "zh": "失败（recompute）"},
                {"en": "fails (fail)", "zh": "失败（fail）"},
            ),
        ),
    ),
    focus=("cache_hit", "evicted"),
    panels=("cpu_tier",),
)


# -- the hit split by tier, and the time to first token -------------------------------------------
@dataclass(frozen=True)
class TierRow:
    """One request's prompt by tier and its time to first token, from a recorded run."""

    request_id: str
    case: str  # "gpu_hit" | "cpu_hit" | "miss"
    num_prompt_tokens: int
    gpu_hit_tokens: int
    cpu_hit_tokens: int
    computed_tokens: int
    ttft_steps: int | None  # from the step it arrived in to the step of its first token
    ttft_ms: float | None  # wall time of those steps here; None if not measured (a trace)


def tier_rows(records: Sequence[StepRecord]) -> list[TierRow]:
    """Per request that has produced its first token: its last admission's lookup (GPU hit, CPU
    hit, the rest computed) and its time to first token."""
    arrived: dict[str, int] = {}
    prompt: dict[str, int] = {}
    gpu: dict[str, int] = {}
    cpu: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, rec in enumerate(records):
        for e in rec.events:
            if e.kind == "arrived":
                arrived[e.request_id], prompt[e.request_id] = i, e.num_prompt_tokens
            elif e.kind in ("cache_hit", "cache_miss") and e.request_id not in first:
                gpu[e.request_id] = e.num_tokens if e.kind == "cache_hit" else 0
                cpu[e.request_id] = 0
            elif e.kind == "cpu_hit" and e.request_id not in first:
                cpu[e.request_id] = e.num_tokens
            elif e.kind == "kv_load_failed" and e.request_id not in first:
                # only the tokens before the first failed block came from the CPU
                cpu[e.request_id] = max(0, e.num_computed_tokens - gpu.get(e.request_id, 0))
            elif e.kind == "sampled":
                for rid in e.tokens:
                    first.setdefault(rid, i)
    rows = []
    for rid, i in first.items():
        if rid not in arrived:
            continue
        g, c = gpu.get(rid, 0), cpu.get(rid, 0)
        steps = records[arrived[rid] : i + 1]
        measured = all(r.seconds > 0 for r in steps)
        rows.append(
            TierRow(
                request_id=rid,
                case="cpu_hit" if c else ("gpu_hit" if g else "miss"),
                num_prompt_tokens=prompt[rid],
                gpu_hit_tokens=g,
                cpu_hit_tokens=c,
                computed_tokens=prompt[rid] - g - c,
                ttft_steps=len(steps),
                ttft_ms=1000 * sum(r.seconds for r in steps) if measured else None,
            )
        )
    return rows
