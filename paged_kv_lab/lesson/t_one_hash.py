"""Topic: one block hash held by several physical blocks (vLLM's ``BlockHashToBlockMap``)."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question

# Long enough for several chunks of LONG_PREFILL tokens; both requests send it word for word.
PROMPT = (
    "The quick brown fox jumps over the lazy dog, and then the dog chases the fox "
    "around the old barn all day long."
)
LONG_PREFILL = 8

LESSON = Lesson(
    id="onehash",
    number=0,
    icon="👯",
    title={"en": "One hash, two blocks", "zh": "一个哈希，两个块"},
    summary={
        "en": "Two identical prompts prefilled in chunks side by side: the prefix-cache map "
        "ends up holding two physical blocks for one hash, and why.",
        "zh": "两个完全相同的提示词并排分块预填充：前缀缓存映射最终为同一个哈希保存了"
        "两个物理块，以及原因。",
    },
    scenario={
        "name": "topic-one-hash-two-blocks",
        "description": "A and B send the same prompt at the same step; "
        "long_prefill_token_threshold gives each 8 tokens a step, so they prefill side by "
        "side. C sends it again after both finished.",
        "model": "smollm2",
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 40,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 64,
            "long_prefill_token_threshold": LONG_PREFILL,
        },
        "requests": [
            {"id": "A", "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True},
            {"id": "B", "prompt": PROMPT, "max_tokens": 4, "ignore_eos": True},
            {
                "id": "C",
                "prompt": PROMPT,
                "max_tokens": 2,
                "arrival_step": 7,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "vLLM's prefix-cache map (`BlockHashToBlockMap` in `v1/core/block_pool.py`) "
        "maps a hash to **one block or a dict of blocks**. When does one hash need two "
        "blocks? A popular article says: when two requests run at once, B cannot use A's "
        "block because A is using it, so B gets its own. That is wrong: a block in use is "
        "shared freely (`touch` raises its ref_cnt; lesson 2 shows it). Here A and B send "
        "the same prompt at the same step, and `long_prefill_token_threshold` = "
        f"{LONG_PREFILL} lets each prefill only that many tokens a step, so "
        "they prefill side by side. Watch the hash tree: one node, two chips.",
        "zh": "vLLM 的前缀缓存映射（`v1/core/block_pool.py` 中的 `BlockHashToBlockMap`）"
        "把一个哈希映射到**一个块，或一个块字典**。什么时候一个哈希需要两个块？"
        "一篇流行文章说：两个请求同时运行时，A 的块正在被 A 使用，B 用不了，只好另分一个。"
        "这是错的：正在使用的块可以随意共享（`touch` 增加它的 ref_cnt；第 2 课演示过）。"
        "这里 A 和 B 在同一步发送同一个提示词，`long_prefill_token_threshold` = "
        f"{LONG_PREFILL} 让每个请求每步只预填充这么多 token，"
        "于是它们并排预填充。请看哈希树：一个节点，两个块标记。",
    },
    moments=(
        Moment(
            "cache_miss",
            request="A",
            text={
                "en": "A looks up its prompt: the cache is empty. It is given its first "
                "chunk only, and its full blocks get hashes at once, in `allocate_slots`, "
                "before the forward pass has written their K/V.",
                "zh": "A 查找它的提示词：缓存是空的。它只得到第一块（chunk），"
                "它的满块立刻在 `allocate_slots` 中得到哈希，早于前向计算写入它们的 K/V。",
            },
        ),
        Moment(
            "cache_hit",
            request="B",
            text={
                "en": "B looks up in the same step, after A was scheduled, and **hits** A's "
                "blocks {blocks} ({num_tokens} tokens) although they are in use and not even "
                "computed yet: both run in the same forward. So B starts one chunk ahead of "
                "A, and computes the next blocks first.",
                "zh": "B 在同一步、A 被调度之后查找，**命中**了 A 的块 {blocks}"
                "（{num_tokens} 个 token）——尽管它们正被使用，甚至还没算出来："
                "两者在同一次前向中运行。于是 B 比 A 领先一个 chunk，先算出后面的块。",
            },
        ),
        Moment(
            "cached",
            request="A",
            where="dup_hash",
            text={
                "en": "A's blocks {blocks} just got hashes that B's blocks already hold: the "
                "map now keeps **two blocks for one hash**. The real reason: a request "
                "looks the cache up only once, when it is admitted (`get_computed_blocks`); "
                "while it runs, it fills its own new blocks and never looks again, and vLLM "
                "never swaps a computed block for a cached twin, so that block tables only "
                "grow (the NOTE on `BlockHashToBlockMap`). Open **Why?**, *two requests*, "
                "A and B: equal hashes, but only the first chunk's blocks are shared.",
                "zh": "A 的块 {blocks} 刚刚得到的哈希，B 的块已经有了：映射现在为**一个哈希"
                "保存两个块**。真正的原因：请求只在被接纳时查找一次缓存"
                "（`get_computed_blocks`）；运行之后它只往自己的新块里填，不再查找；"
                "vLLM 也从不把算好的块换成缓存里的孪生块，好让块表只增不改"
                "（见 `BlockHashToBlockMap` 的 NOTE）。打开**为什么？**，选*两个请求*、"
                "A 和 B：哈希相同，但只有第一个 chunk 的块是共享的。",
            },
        ),
        Moment(
            "cached",
            where="dup_decode",
            text={
                "en": "The same happens while decoding: greedy sampling gives A and B the same "
                "tokens, so {req}'s full decode block {blocks} gets a hash the other request's "
                "block already has. Running side by side, two requests never share the blocks "
                "they decode.",
                "zh": "解码时也一样：贪心采样让 A 和 B 生成相同的 token，于是 {req} "
                "填满的解码块 {blocks} 得到的哈希，另一个请求的块已经有了。"
                "并排运行的两个请求从不共享各自解码出的块。",
            },
        ),
        Moment(
            "cache_hit",
            request="C",
            text={
                "en": "C sends the prompt again after both finished and hits {blocks}. Where "
                "the map holds two blocks, `get_one_block` returns the first one inserted; "
                "the twin stays in the free queue, cached, until it is reused. Evicting it "
                "removes only that block id: the hash stays cached by the other.",
                "zh": "C 在两者都完成后再次发送这个提示词，命中了 {blocks}。映射里有两个块的"
                "地方，`get_one_block` 返回最先插入的那个；孪生块仍带着缓存留在空闲队列，"
                "直到被复用。驱逐它只会移除那个块号：另一个块仍为这个哈希保留着缓存。",
            },
        ),
    ),
    outro={
        "en": "Other ways to get twins on a real server: a prompt whose length is a multiple "
        "of block_size (a hit stops at num_tokens − 1, so the last block is recomputed), and "
        "any two requests that decode the same text. The twins cost memory, never "
        "correctness: both hold the same K/V.",
        "zh": "真实服务器上产生孪生块的其他途径：长度正好是 block_size 整数倍的提示词"
        "（命中最多到 num_tokens − 1，最后一块会重算），以及任何两个解码出相同文本的请求。"
        "孪生块只浪费内存，不影响正确性：两者存的是同样的 K/V。",
    },
    questions=(
        Question(
            prompt={
                "en": "Why does vLLM keep two blocks for one hash instead of merging them?",
                "zh": "为什么 vLLM 为同一个哈希保留两个块，而不是把它们合并？",
            },
            options=(
                {
                    "en": "Block tables only grow: a computed block is never swapped for its "
                    "cached twin",
                    "zh": "块表只增不改：算好的块从不被换成缓存里的孪生块",
                },
                {
                    "en": "A block in use cannot be shared with another request",
                    "zh": "正在使用的块不能与其他请求共享",
                },
                {
                    "en": "The two blocks hold different K/V",
                    "zh": "两个块存的 K/V 不同",
                },
            ),
            answer=0,
            explain={
                "en": "The lookup happens once, at admission; afterwards a request's table is "
                "append-only. Blocks in use are shared all the time (ref_cnt > 1).",
                "zh": "查找只在接纳时进行一次；之后请求的块表只追加。"
                "正在使用的块一直都在共享（ref_cnt > 1）。",
            },
        ),
    ),
    focus=("cached", "cache_hit", "cache_miss"),
)
