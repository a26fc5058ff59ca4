"""Lesson 2: prefix caching and hash chains."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle

LESSON = Lesson(
    id="prefix",
    number=2,
    icon="🔗",
    title={"en": "Prefix caching and hash chains", "zh": "前缀缓存与哈希链"},
    summary={
        "en": "Requests sharing a system prompt share blocks: "
        "chained hashes, hits, touch, ref counts, cache_salt.",
        "zh": "共享系统提示词的请求共享块：链式哈希、命中、touch、引用计数、cache_salt。",
    },
    scenario={
        "name": "lesson-2-prefix-caching",
        "description": "Four chat requests: all share SmolLM2's "
        "system prompt; C repeats A; D repeats A with a cache_salt.",
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
                "prompt": "What is a KV cache?",
                "chat": True,
                "max_tokens": 10,
                "ignore_eos": True,
            },
            {
                "id": "B",
                "prompt": "Name three colors.",
                "chat": True,
                "max_tokens": 10,
                "arrival_step": 2,
                "ignore_eos": True,
            },
            {
                "id": "C",
                "prompt": "What is a KV cache?",
                "chat": True,
                "max_tokens": 8,
                "arrival_step": 11,
                "ignore_eos": True,
            },
            {
                "id": "D",
                "prompt": "What is a KV cache?",
                "chat": True,
                "max_tokens": 8,
                "arrival_step": 11,
                "cache_salt": "user-2",
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "All four requests go through SmolLM2's chat template, so they start "
        "with the same system prompt. Each full block gets a **chained hash**: "
        "H(parent hash, the block's tokens, extra keys). Two blocks have the same hash "
        "only if their whole prefix is the same — so a lookup walks the chain from the "
        "first block and stops at the first miss. Watch the hash-chain tree grow.",
        "zh": "四个请求都经过 SmolLM2 的对话模板，因此开头是同一段系统提示词。"
        "每个满块都有一个**链式哈希**：H(父哈希, 块内 token, 额外键)。"
        "只有整个前缀都相同时两个块的哈希才相同——所以查找从第一个块沿链走，"
        "遇到第一个未命中就停下。请观察哈希链树如何生长。",
    },
    moments=(
        Moment(
            "cache_miss",
            request="A",
            text={
                "en": "A asks `get_computed_blocks`: the cache "
                "is empty, a miss. A computes its whole prompt.",
                "zh": "A 调用 `get_computed_blocks`：缓存是空的，未命中。A 计算整个提示词。",
            },
        ),
        Moment(
            "cached",
            request="A",
            text={
                "en": "A's full prompt blocks {blocks} got hashes chained from "
                "NONE_HASH (see the tree). Its last block is partial: a **partial "
                "block is never cached** — it gets a hash only once decoding fills it.",
                "zh": "A 的满提示块 {blocks} 得到了从 NONE_HASH 开始的链式哈希（见树）。"
                "它的最后一块没装满：**不满的块永远不会被缓存**——要等解码把它填满才会有哈希。",
            },
        ),
        Moment(
            "cache_hit",
            request="B",
            text={
                "en": "B has a different question but the same system prompt. "
                "Its first block hashes equal A's, so it **hits** {blocks} "
                "({num_tokens} tokens) and computes only the rest.",
                "zh": "B 的问题不同，但系统提示词相同。它前几个块的哈希与 A 的相同，"
                "于是**命中**了 {blocks}（{num_tokens} 个 token），只需计算剩下的部分。",
            },
        ),
        Moment(
            "touched",
            request="B",
            where="shared",
            text={
                "en": "`touch` raised those blocks' ref_cnt to 2: one "
                "physical copy of the K/V, two block tables pointing at it "
                "(thick borders in the grid, the shared path in the tree).",
                "zh": "`touch` 把这些块的 ref_cnt 提高到 2：K/V 只有一份物理副本，却被两张块表指向"
                "（网格中的粗边框，树中的共享路径）。",
            },
        ),
        Moment(
            "freed",
            request="A",
            where="still_used",
            text={
                "en": "A finished, but the blocks it shares with B still have ref_cnt "
                "1: they stay out of the free queue. Only A's own blocks were queued.",
                "zh": "A 完成了，但它与 B 共享的块 ref_cnt 仍为 1："
                "它们不会进入空闲队列。只有 A 独占的块进入了队列。",
            },
        ),
        Moment(
            "cache_hit",
            request="C",
            text={
                "en": "C is A's prompt again and hits {num_tokens} tokens: all of its "
                "full blocks. Its last few tokens form a partial block, which is never "
                "cached and so never hit; and a hit is always capped at num_tokens − 1, "
                "because the last prompt token must be computed to produce logits.",
                "zh": "C 与 A 的提示词完全相同，命中了 {num_tokens} 个 token："
                "它所有的满块。最后几个 token 组成一个不满的块，不满的块从不缓存，"
                "也就不会被命中；而且命中长度上限总是 num_tokens − 1，"
                "因为最后一个提示 token 必须计算才能得到 logits。",
            },
        ),
        Moment(
            "touched",
            request="C",
            where="rescue",
            key=False,
            text={
                "en": "Some hit blocks were already free (ref_cnt 0, cached): `touch` took "
                "them out of the middle of the free queue before anyone could evict them.",
                "zh": "部分命中的块已经空闲（ref_cnt 0，仍有缓存）："
                "`touch` 在它们被驱逐之前把它们从空闲队列中间取了出来。",
            },
        ),
        Moment(
            "cache_miss",
            request="D",
            text={
                "en": 'D is the very same prompt with `cache_salt="user-2"`. The salt '
                "is an extra key of the first block, so every hash in D's chain differs "
                "from A's: a miss. Salts keep tenants from probing each other's cache.",
                "zh": 'D 的提示词完全相同，但带有 `cache_salt="user-2"`。盐是第一个块的额外键，'
                "所以 D 整条链上的哈希都与 A 的不同：未命中。加盐可以防止不同租户互相探测缓存。",
            },
        ),
    ),
    outro={
        "en": "Hit rate is counted in tokens: hits / "
        "queried tokens since the last reset (chart above).",
        "zh": "命中率按 token 计算：自上次重置以来命中的 token / 查询的 token（见上方图表）。",
    },
    questions=(
        Question(
            prompt={
                "en": "Two prompts share their first 20 tokens; "
                "block_size is 8. How many blocks can the second one hit?",
                "zh": "两个提示词前 20 个 token 相同；block_size 为 8。第二个最多能命中几个块？",
            },
            options=({"en": "2", "zh": "2"}, {"en": "3", "zh": "3"}, {"en": "2.5", "zh": "2.5"}),
            answer=0,
            explain={
                "en": "Only full blocks are hashed: tokens 16–23 differ "
                "after token 19, so the third block's hash differs.",
                "zh": "只有满块才有哈希：第三块（token 16–23）"
                "在第 19 个 token 之后不同，所以哈希不同。",
            },
        ),
        Question(
            prompt={
                "en": "Why chain the hashes (include the parent hash)?",
                "zh": "为什么哈希要成链（包含父哈希）？",
            },
            options=(
                {
                    "en": "So equal hashes mean equal whole "
                    "prefixes, not just equal block contents",
                    "zh": "这样哈希相同就意味着整个前缀相同，而不只是块内容相同",
                },
                {"en": "To make hashing faster", "zh": "为了让哈希更快"},
                {"en": "To order the free queue", "zh": "为了给空闲队列排序"},
            ),
            answer=0,
            explain={
                "en": "K/V of a token depends on every token before it; "
                "reusing a block is only valid after the same prefix.",
                "zh": "一个 token 的 K/V 取决于它之前的所有 token；只有前缀相同，块才能复用。",
            },
        ),
    ),
    toggles=(
        Toggle(
            "enable_prefix_caching",
            {"en": "Prefix caching", "zh": "前缀缓存"},
            (True, False),
            ({"en": "on", "zh": "开"}, {"en": "off", "zh": "关"}),
        ),
        Toggle(
            "hash_algo",
            {"en": "Hash", "zh": "哈希算法"},
            ("xxhash", "sha256"),
            (
                {"en": "xxhash (xxh3_128)", "zh": "xxhash（xxh3_128）"},
                {"en": "sha256 (vLLM default)", "zh": "sha256（vLLM 默认）"},
            ),
        ),
    ),
    focus=("cache_hit", "cache_miss", "touched"),
)
