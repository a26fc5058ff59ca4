"""Lesson 6: continuous batching and chunked prefill under a token budget."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle

LESSON = Lesson(
    id="batching",
    number=6,
    icon="🧮",
    title={"en": "Continuous batching and chunked prefill", "zh": "连续批处理与分块预填充"},
    summary={
        "en": "One token budget per step, shared by decodes "
        "and a long prompt split over several steps.",
        "zh": "每步一个 token 预算，由解码和被拆成多步的长提示词共享。",
    },
    scenario={
        "name": "lesson-6-batching",
        "description": "Budget of 16 tokens per step: A and B decode while C's "
        "52-token prompt is prefilled in chunks; D arrives while the budget is spent.",
        "model": "smollm2",
        "engine": {
            "block_size": 8,
            "num_gpu_blocks": 40,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 16,
        },
        "requests": [
            {
                "id": "A",
                "prompt": "Write a short poem about the ocean.",
                "max_tokens": 14,
                "ignore_eos": True,
            },
            {
                "id": "B",
                "prompt": "What is 2+2?",
                "max_tokens": 12,
                "arrival_step": 1,
                "ignore_eos": True,
            },
            {
                "id": "C",
                "prompt": "List the planets of the solar system in order from "
                "the sun, with one fact about each planet and its largest moon "
                "if it has one. Then explain in simple words why the sky is blue "
                "during the day and red at sunset, and why clouds are white.",
                "max_tokens": 6,
                "arrival_step": 2,
                "ignore_eos": True,
            },
            {"id": "D", "prompt": "Hello!", "max_tokens": 6, "arrival_step": 3, "ignore_eos": True},
        ],
    },
    intro={
        "en": "Every step the scheduler has a **token budget** (`max_num_batched_tokens` "
        "= {max_num_batched_tokens}). Running requests are served first — a decode "
        "costs 1 token — then waiting ones. There are no separate prefill and decode "
        "phases: all scheduled tokens of all requests run in one packed forward.",
        "zh": "每一步调度器都有一个 **token 预算**（`max_num_batched_tokens` "
        "= {max_num_batched_tokens}）。先服务运行中的请求——一次解码花 1 个 "
        "token——再服务等待中的请求。没有独立的预填充和解码阶段："
        "所有请求本步调度的 token 在一次打包的前向计算中一起运行。",
    },
    moments=(
        Moment(
            "scheduled",
            request="B",
            text={
                "en": "B joined while A was decoding: A's 1 decode token and B's "
                "{num_tokens}-token prefill share this step's forward pass. "
                "That is continuous batching — no waiting for a batch to drain.",
                "zh": "B 在 A 解码时加入：A 的 1 个解码 token 与 B 的 {num_tokens} "
                "个预填充 token 共享这一步的前向计算。这就是连续批处理——不必等上一批跑完。",
            },
        ),
        Moment(
            "scheduled",
            where="chunk_with_decodes",
            text={
                "en": "C's long prompt does not fit in what is left of the budget. It is "
                "admitted anyway and gets a **chunk** of {num_tokens} tokens; the rest follows "
                "in the next steps (chunked prefill), while A and B keep decoding every step.",
                "zh": "C 的长提示词放不进剩余预算。它仍被接纳，只得到 {num_tokens} "
                "个 token 的一个**分块**；其余部分在接下来的几步继续（分块预填充），"
                "同时 A 和 B 每步照常解码。",
            },
        ),
        Moment(
            "blocked",
            where="budget_reason",
            text={
                "en": "D is waiting: this step's token budget is used up (reason "
                "`token_budget`). It will be admitted once the prefill chunks leave room.",
                "zh": "D 在等待：本步 token 预算已用完（原因 "
                "`token_budget`）。等分块预填充腾出空间后它才会被接纳。",
            },
        ),
        Moment(
            "admitted",
            request="D",
            text={
                "en": "D got in. Check the budget chart: every bar "
                "is at most {max_num_batched_tokens} tokens.",
                "zh": "D 进来了。看看预算图：每一根柱子都不超过 "
                "{max_num_batched_tokens} 个 token。",
            },
        ),
    ),
    outro={
        "en": "Raise the budget with the switch above: "
        "C's prompt goes through in fewer, larger chunks.",
        "zh": "用上面的开关提高预算：C 的提示词会以更少、更大的分块完成。",
    },
    questions=(
        Question(
            prompt={
                "en": "Budget 16; three requests decode. How many "
                "prompt tokens can a new request prefill this step?",
                "zh": "预算 16；三个请求在解码。这一步新请求最多能预填充多少个提示 token？",
            },
            options=(
                {"en": "13", "zh": "13"},
                {"en": "16", "zh": "16"},
                {"en": "0 until the decodes finish", "zh": "在解码结束前为 0"},
            ),
            answer=0,
            explain={
                "en": "Running requests are scheduled first: 3 × "
                "1 token; the remaining 13 go to the new prompt.",
                "zh": "先调度运行中的请求：3 × 1 个 token；剩下的 13 个给新提示词。",
            },
        ),
    ),
    toggles=(
        Toggle("max_num_batched_tokens", {"en": "Token budget", "zh": "token 预算"}, (16, 32, 64)),
    ),
    focus=("scheduled", "admitted", "blocked"),
    panels=("budget",),
)
