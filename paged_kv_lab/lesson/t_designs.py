"""Topic: vLLM's hash-chained blocks next to SGLang's radix tree and nano-vllm's block table.

The run is vLLM's (kvcore on the loaded model); under the player, at its step, the same requests
go through models of the other two designs (designs/; drawn by ui/designs_page.py).
"""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question

# A and B share "The capital of France is Paris. The capital of" and part of a block after it;
# C is unrelated and long enough to push cached blocks out of the small pool; D repeats A.
A = "The capital of France is Paris. The capital of Italy is"
B = "The capital of France is Paris. The capital of Spain is"
C = "Write two short lines about the sea, the wind and the stars over the harbour at night."

LESSON = Lesson(
    id="designs",
    number=0,
    icon="🌳",
    title={"en": "Hash chains vs radix tree", "zh": "哈希链与基数树"},
    summary={
        "en": "The same requests through vLLM's block pool, SGLang's radix tree and nano-vllm's "
        "block table, step by step: where they hit, what they evict, what they share.",
        "zh": "同一批请求依次经过 vLLM 的块池、SGLang 的基数树和 nano-vllm 的块表："
        "各自命中哪里、驱逐什么、共享什么。",
    },
    scenario={
        "name": "topic-designs",
        "description": "A, then B (same start, different country), then C (unrelated, long), "
        "then A's prompt again as D, one after another in a pool of 9 blocks of 4 tokens.",
        "model": "smollm2",
        "engine": {"block_size": 4, "num_gpu_blocks": 9, "max_num_seqs": 2},
        "requests": [
            {"id": "A", "prompt": A, "max_tokens": 3, "ignore_eos": True},
            {"id": "B", "prompt": B, "max_tokens": 3, "ignore_eos": True, "arrival_step": 4},
            {"id": "C", "prompt": C, "max_tokens": 3, "ignore_eos": True, "arrival_step": 8},
            {"id": "D", "prompt": A, "max_tokens": 3, "ignore_eos": True, "arrival_step": 12},
        ],
    },
    intro={
        "en": "vLLM keeps **no tree**: each full block of 4 tokens gets a hash chained to the "
        "block before it, and one flat map finds a block by its hash. SGLang keeps a **radix "
        "tree** of token runs; nano-vllm keeps vLLM's idea in its smallest form, a dict from "
        "hash to block id. The player below is vLLM's run on the real model; under it the same "
        "requests go, at the same step, through SGLang's tree and nano-vllm's table.",
        "zh": "vLLM **没有树**：每个 4 个 token 的满块得到一个与前一块链接的哈希，"
        "一张扁平映射按哈希找到块。SGLang 保存一棵由 token 段组成的**基数树**；"
        "nano-vllm 把 vLLM 的思路做到最小：一个从哈希到块号的字典。下面的播放器是 vLLM "
        "在真实模型上的运行；再往下，同一批请求在同一步经过 SGLang 的树和 nano-vllm 的表。",
    },
    moments=(
        Moment(
            "cache_hit",
            request="B",
            text={
                "en": "B hits {num_tokens} tokens: only **full blocks** count in vLLM. SGLang's "
                "tree (page size 1) matches to the token, so below it hits more of B's prompt.",
                "zh": "B 命中 {num_tokens} 个 token：vLLM 只计**满块**。SGLang 的树"
                "（页大小 1）按 token 匹配，所以在下面它命中 B 提示词的更多部分。",
            },
        ),
        Moment(
            "evicted",
            text={
                "en": "vLLM evicts block {blocks}: the head of the free queue, the block freed "
                "longest ago (a request's tail is freed first). SGLang instead drops whole "
                "**leaves**, least recently used first.",
                "zh": "vLLM 驱逐块 {blocks}：空闲队列的队首，即最早释放的块"
                "（一个请求的尾部最先释放）。SGLang 则按最近最少使用的顺序丢弃整片**叶子**。",
            },
        ),
    ),
    outro={
        "en": "Same requests, same memory, three answers. Compare the hits per request in the "
        "table under the designs.",
        "zh": "同样的请求、同样的内存，三种结果。请对照设计下方表格中每个请求的命中数。",
    },
    questions=(
        Question(
            prompt={
                "en": "B shares 30-odd characters with A but its prompt diverges inside a block. "
                "Which design can reuse the tokens of that last, partly shared block?",
                "zh": "B 与 A 共享三十多个字符，但提示词在一个块的中间分叉。"
                "哪种设计能复用那个只共享了一部分的块里的 token？",
            },
            options=(
                {"en": "vLLM", "zh": "vLLM"},
                {"en": "SGLang with page size 1", "zh": "页大小为 1 的 SGLang"},
                {"en": "nano-vllm", "zh": "nano-vllm"},
            ),
            answer=1,
            explain={
                "en": "vLLM and nano-vllm hash whole blocks, so a block matches entirely or "
                "not at all; SGLang's tree splits the edge at the first different token.",
                "zh": "vLLM 和 nano-vllm 对整块求哈希，一块要么全部匹配要么完全不匹配；"
                "SGLang 的树在第一个不同的 token 处拆开边。",
            },
        ),
    ),
    focus=("cache_hit", "evicted"),
    panels=("designs",),  # SGLang's tree and nano-vllm's table under the player, at its step
)
