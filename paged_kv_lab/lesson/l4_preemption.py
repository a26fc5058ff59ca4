"""Lesson 4: preemption by recompute, FCFS and priority victims, resuming with a hit."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle

LESSON = Lesson(
    id="preemption",
    number=4,
    icon="⚠️",
    title={"en": "Preemption and recompute", "zh": "抢占与重算"},
    summary={
        "en": "More decode work than blocks: the victim, its freed "
        "blocks, and its return with a hit on its own cache.",
        "zh": "解码需要的块比池中多：被抢占者、它释放的块，以及它带着对自己缓存的命中回来。",
    },
    scenario={
        "name": "lesson-4-preemption",
        "description": "Three requests decode on a 14-block pool until it runs "
        "dry; one is preempted, frees its blocks and later resumes, hitting its "
        "own cached blocks. Priorities: A=2, B=0, C=1 (smaller = more important).",
        "model": "smollm2",
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 14,
            "max_num_seqs": 3,
            "max_num_batched_tokens": 64,
            "policy": "fcfs",
        },
        "requests": [
            {
                "id": "A",
                "prompt": "The quick brown fox",
                "max_tokens": 10,
                "priority": 2,
                "ignore_eos": True,
            },
            {
                "id": "B",
                "prompt": "Roses are red, violets are blue, sugar is sweet,",
                "max_tokens": 16,
                "priority": 0,
                "ignore_eos": True,
            },
            {
                "id": "C",
                "prompt": "Count with me: one, two, three,",
                "max_tokens": 14,
                "priority": 1,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "Three requests are admitted together — each fits now, but all of them "
        "keep growing by one token per step, and every {block_size} tokens one of "
        "them needs a new block. The pool will run dry. vLLM v1 then **preempts**: it "
        "frees a running request's blocks and recomputes it later (no swapping to CPU).",
        "zh": "三个请求同时被接纳——现在都放得下，但它们每步各长一个 token，每 "
        "{block_size} 个 token 就有一个请求需要新块。块池终将耗尽。这时 vLLM v1 "
        "会**抢占**：释放一个运行中请求的所有块，稍后重新计算它（不换出到 CPU）。",
    },
    moments=(
        Moment(
            "preempted",
            text={
                "en": "No free block left for a running request, so the scheduler "
                "preempts **{req}** ({policy}). FCFS picks the *last* request "
                "in `running`; the priority policy picks the largest (priority, "
                "arrival) wherever it sits. Its blocks are freed and it goes back "
                "to the front of the waiting queue with num_computed_tokens = 0.",
                "zh": "运行中的请求没有空闲块可用，调度器抢占了 **{req}**（{policy}）。"
                "FCFS 选 `running` 中的*最后一个*；优先级策略选 (priority, arrival) 最大者，"
                "无论它在哪。它的块被释放，它回到等待队列最前面，num_computed_tokens 归零。",
            },
        ),
        Moment(
            "freed",
            where="preempted_reason",
            text={
                "en": "The victim's full blocks keep their hashes and go to "
                "the tail of the free queue. If they survive until it "
                "returns, most of the recompute will be a prefix-cache hit.",
                "zh": "被抢占者的满块保留哈希并进入空闲队列队尾。"
                "如果它们能撑到它回来，大部分重算都会变成前缀缓存命中。",
            },
        ),
        Moment(
            "blocked",
            where="after_preempt",
            text={
                "en": "In a step that preempted, no waiting request is "
                "admitted — the freed blocks go to the running ones first.",
                "zh": "发生抢占的那一步不接纳任何等待中的请求——释放出的块先给运行中的请求用。",
            },
        ),
        Moment(
            "cache_hit",
            where="self_hit",
            text={
                "en": "{req} looks itself up in the prefix cache "
                "and finds its own blocks {blocks} still cached.",
                "zh": "{req} 在前缀缓存中查找自己，发现自己的块 {blocks} 仍然在缓存中。",
            },
        ),
        Moment(
            "resumed",
            text={
                "en": "{req} resumes: {num_cached_tokens} tokens come back from "
                "its own cached blocks; only the rest (including its generated "
                "tokens) is recomputed. The output is unchanged — recompute is exact.",
                "zh": "{req} 恢复运行：{num_cached_tokens} 个 token 来自它自己的缓存块；"
                "只有剩下的部分（包括已生成的 token）需要重算。输出不变——重算是精确的。",
            },
        ),
    ),
    outro={
        "en": "Switch the policy to *priority*: A has the largest priority value "
        "(least important), so A becomes the victim although it is first in line.",
        "zh": "把策略切换到*优先级*：A 的 priority 值最大（最不重要），"
        "所以尽管 A 排在最前面，也会成为被抢占者。",
    },
    questions=(
        Question(
            prompt={
                "en": "With FCFS, which running request is preempted?",
                "zh": "FCFS 策略下，哪个运行中的请求会被抢占？",
            },
            options=(
                {"en": "The last one in the running list", "zh": "running 列表中的最后一个"},
                {"en": "The one holding the most blocks", "zh": "持有块最多的那个"},
                {"en": "The one that needs the block", "zh": "需要新块的那个"},
            ),
            answer=0,
            explain={
                "en": "`running.pop()` — the most recently admitted. "
                "It may be the requester itself when it is last.",
                "zh": "`running.pop()`——最近被接纳的那个。"
                "如果需要块的请求本身排在最后，被抢占的就是它自己。",
            },
        ),
        Question(
            prompt={
                "en": "What happens to a preempted request's generated tokens?",
                "zh": "被抢占请求已生成的 token 会怎样？",
            },
            options=(
                {
                    "en": "They are kept; their K/V is recomputed (or hit) when it resumes",
                    "zh": "保留；恢复时重算（或命中）它们的 K/V",
                },
                {"en": "They are discarded and regenerated", "zh": "丢弃后重新生成"},
                {"en": "They are swapped to CPU memory", "zh": "换出到 CPU 内存"},
            ),
            answer=0,
            explain={
                "en": "v1 preempts by recompute: the request "
                "becomes prompt + outputs and is prefilled again.",
                "zh": "v1 通过重算来抢占：请求变成“提示词 + 已输出”，重新预填充。",
            },
        ),
    ),
    toggles=(
        Toggle(
            "policy",
            {"en": "Scheduling policy", "zh": "调度策略"},
            ("fcfs", "priority"),
            ({"en": "FCFS", "zh": "先来先服务（FCFS）"}, {"en": "priority", "zh": "优先级"}),
        ),
    ),
    focus=("preempted", "resumed", "cache_hit"),
)
