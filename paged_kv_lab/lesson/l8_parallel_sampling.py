"""Lesson 8: parallel sampling (n > 1) shares the prompt through the prefix cache, with no
copy-on-write."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle

LESSON = Lesson(
    id="parallel",
    number=8,
    icon="🌿",
    title={
        "en": "Parallel sampling: sharing without copy-on-write",
        "zh": "并行采样：不靠写时复制的共享",
    },
    summary={
        "en": "n = 3 samples of one prompt: three child requests, the prompt's full "
        "blocks at ref_cnt 3, each child's own last block — and, on this attention-only "
        "model, no block is ever copied.",
        "zh": "同一提示词采样 n = 3 次：三个子请求，提示词的满块 "
        "ref_cnt 为 3，每个子请求有自己的最后一块——在这个只有注意力层的模型上，没有任何块被复制。",
    },
    scenario={
        "name": "lesson-8-parallel-sampling",
        "description": "One chat request with n = 3 and a "
        "seed: children 0_A, 1_A, 2_A sample seeds 42, 43, 44.",
        "model": "smollm2",
        "engine": {
            "block_size": 8,
            "num_gpu_blocks": 32,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 128,
        },
        "requests": [
            {
                "id": "A",
                "prompt": "Write a haiku about memory.",
                "chat": True,
                "max_tokens": 8,
                "n": 3,
                "seed": 42,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "Request A asks for **n = 3** samples. vLLM v1's scheduler never sees A: "
        "on arrival the engine fans it out into three ordinary child requests, `0_A`, "
        "`1_A`, `2_A`, each with n = 1 and its own seed (42, 43, 44). Nothing links the "
        "children inside the block manager — they share K/V only because their prompts "
        "are equal, through the prefix cache. Watch the prompt's blocks reach ref_cnt 3.",
        "zh": "请求 A 要求采样 **n = 3** 次。vLLM v1 的调度器根本看不到 A："
        "引擎在它到达时把它拆成三个普通的子请求 `0_A`、`1_A`、`2_A`，每个 n = 1，"
        "各有自己的种子（42、43、44）。块管理器里没有任何东西把它们连在一起——它们共享 "
        "K/V 只是因为提示词相同，靠的是前缀缓存。请看提示词的块如何达到 ref_cnt 3。",
    },
    moments=(
        Moment(
            "cache_miss",
            request="0_A",
            text={
                "en": "Child `0_A` is scheduled first. The cache is "
                "empty: a miss, so it computes the whole prompt.",
                "zh": "子请求 `0_A` 最先被调度。缓存是空的：未命中，所以它计算整个提示词。",
            },
        ),
        Moment(
            "cached",
            request="0_A",
            text={
                "en": "`allocate_slots` hashed 0_A's full prompt blocks {blocks} "
                "right away — in the same pass, before the forward that computes "
                "them. That is what lets its siblings hit them in this very step.",
                "zh": "`allocate_slots` 立刻为 0_A 的满提示块 {blocks} "
                "计算了哈希——就在同一次调度中，在计算它们的前向之前。"
                "正因如此，兄弟请求在同一步就能命中它们。",
            },
        ),
        Moment(
            "cache_hit",
            request="1_A",
            text={
                "en": "The second child, `1_A`, has the same prompt: it **hits** {blocks} "
                "({num_tokens} tokens) and computes only the tokens of its last, partial block.",
                "zh": "第二个子请求 `1_A` 的提示词相同：它**命中**了 "
                "{blocks}（{num_tokens} 个 token），只需计算最后那个未满块里的 token。",
            },
        ),
        Moment(
            "touched",
            request="2_A",
            where="shared",
            text={
                "en": "`2_A` hits them too, and `touch` raises their "
                "ref_cnt to **3**: one copy of the prompt's K/V, three "
                "block tables pointing at it (thick borders in the grid).",
                "zh": "`2_A` 也命中了它们，`touch` 把它们的 ref_cnt 提高到 **3**："
                "提示词的 K/V 只有一份，三张块表指向它（网格中的粗边框）。",
            },
        ),
        Moment(
            "allocated",
            request="2_A",
            text={
                "en": "Each child got its **own** block for the rest of the prompt: "
                "`2_A` holds {blocks}. A partial block has no hash, so no one can "
                "hit it and its ref_cnt stays 1 — the block a child writes into is "
                "never shared, so there is nothing to copy on write.",
                "zh": "每个子请求为提示词剩余部分分到了**自己的**块：`2_A` 持有 "
                "{blocks}。未满的块没有哈希，别人命中不了，它的 ref_cnt "
                "保持为 1——子请求写入的块从不被共享，所以没有什么需要写时复制。",
            },
        ),
        Moment(
            "cached",
            request="1_A",
            text={
                "en": "`1_A`'s own block filled up with its sampled tokens "
                "and got a hash {blocks}, chained from the shared prompt "
                "blocks. From here on every child's chain is its own.",
                "zh": "`1_A` 自己的块被它采样出的 token 填满，得到了哈希 {blocks}，"
                "链接在共享的提示块之后。从这里开始，每个子请求的链都是自己的。",
            },
        ),
        Moment(
            "freed",
            request="0_A",
            where="still_used",
            text={
                "en": "`0_A` finished, but its prompt blocks {still_used} still have "
                "other users: they stay out of the free queue until the last child lets go.",
                "zh": "`0_A` 完成了，但它的提示块 {still_used} 还有其他使用者："
                "在最后一个子请求释放之前，它们不会进入空闲队列。",
            },
        ),
    ),
    outro={
        "en": "The outputs are grouped under A as vLLM's RequestOutput "
        "does: index 0, 1, 2 (the table above lists the children). With "
        "greedy sampling (no seed) the three texts would be identical.",
        "zh": "输出按 vLLM 的 RequestOutput 方式归在 A 之下：index 0、1、"
        "2（上表列出了各个子请求）。如果是贪心采样（没有种子），三段文本会完全相同。",
    },
    questions=(
        Question(
            prompt={
                "en": "A 37-token prompt, block_size 8, n = 3. How many blocks "
                "do the three children hold right after they are admitted?",
                "zh": "提示词 37 个 token，block_size 为 8，"
                "n = 3。三个子请求刚被接纳时一共持有几个块？",
            },
            options=({"en": "7", "zh": "7"}, {"en": "15", "zh": "15"}, {"en": "5", "zh": "5"}),
            answer=0,
            explain={
                "en": "4 shared full blocks (32 tokens, ref_cnt "
                "3) + 3 own partial blocks (5 tokens each).",
                "zh": "4 个共享的满块（32 个 token，ref_cnt "
                "3）+ 3 个各自的未满块（各 5 个 token）。",
            },
        ),
        Question(
            prompt={
                "en": "When does vLLM v1 copy a block because "
                "a shared block is about to be written?",
                "zh": "vLLM v1 什么时候会因为共享块要被写入而复制它？",
            },
            options=(
                {
                    "en": "For an attention-only model like this one, never: only full, "
                    "cached blocks are shared, and they are never written again",
                    "zh": "对这种只有注意力层的模型，从不："
                    "只有已缓存的满块会被共享，而满块不会再被写入",
                },
                {"en": "When a child samples its first token", "zh": "子请求采样第一个 token 时"},
                {"en": "When ref_cnt > 1 and the block is partial", "zh": "ref_cnt > 1 且块未满时"},
            ),
            answer=0,
            explain={
                "en": "Copy-on-write of shared sequences was vLLM V0's. In v1 a partial block "
                "has no hash, so a hit never lands in it. vLLM 0.33 copies a block only for a "
                "sub-block (“partial hash”) hit, which ends inside a block: "
                "`take_kv_cache_block_copies` in `v1/core/kv_cache_manager.py` hands the "
                "worker `KVCacheBlockCopy` pairs. `partial_hash_hits_enabled` allows such hits "
                "only when a hybrid model has Mamba groups in align mode, so for an "
                "attention-only model no block is ever copied.",
                "zh": "共享序列的写时复制是 vLLM V0 的做法。"
                "在 v1 中未满的块没有哈希，命中不会落在它上面。"
                "vLLM 0.33 只为块内（“partial hash”）命中复制块——这种命中结束在某个块的中间："
                "`v1/core/kv_cache_manager.py` 的 `take_kv_cache_block_copies` 把 "
                "`KVCacheBlockCopy`（源块、目标块）交给 worker。`partial_hash_hits_enabled` "
                "只在混合模型含有 align 模式的 Mamba 组时才允许这种命中，所以只有注意力层的模型"
                "从不复制任何块。",
            },
        ),
    ),
    toggles=(
        Toggle(
            "enable_prefix_caching",
            {"en": "Prefix caching", "zh": "前缀缓存"},
            (True, False),
            (
                {"en": "on (children share the prompt)", "zh": "开（子请求共享提示词）"},
                {"en": "off (each child computes it)", "zh": "关（每个子请求各算一遍）"},
            ),
        ),
    ),
    focus=("cache_hit", "touched", "cached"),
    panels=("myths",),
)
