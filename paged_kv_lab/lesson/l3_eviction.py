"""Lesson 3: eviction from the queue head, rescue by touch, reverse-order freeing."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle

LESSON = Lesson(
    id="eviction",
    number=3,
    icon="🗑",
    title={"en": "Eviction", "zh": "驱逐"},
    summary={
        "en": "A tight pool: cached free blocks reused from the head lose their hash; "
        "a hit rescues blocks from the middle; reverse freeing keeps prefixes longest.",
        "zh": "紧张的块池：从队头复用的已缓存空闲块会丢失哈希；"
        "命中把块从队列中间救出；逆序释放让前缀保留最久。",
    },
    scenario={
        "name": "lesson-3-eviction",
        "description": "A 12-block pool. A finishes and leaves 4 cached "
        "blocks; B's long prompt evicts A's last blocks from the queue "
        "head; C repeats A's prompt and hits the prefix that survived.",
        "model": "smollm2",
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 12,
            "max_num_seqs": 2,
            "max_num_batched_tokens": 64,
        },
        "requests": [
            {
                "id": "A",
                "prompt": "The capital of France is Paris, and the capital of Spain is",
                "max_tokens": 4,
                "ignore_eos": True,
            },
            {
                "id": "B",
                "prompt": "Once upon a time, in a small village by the sea, there lived "
                "an old fisherman who told the children of the village long stories about",
                "max_tokens": 6,
                "arrival_step": 4,
                "ignore_eos": True,
            },
            {
                "id": "C",
                "prompt": "The capital of France is Paris, and the capital of Spain is",
                "max_tokens": 4,
                "arrival_step": 10,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "Only {num_gpu_blocks} blocks (one of them the null block). There "
        "is no separate eviction pass, and eviction reads no timestamp: a cached block that "
        "is free simply waits in the free queue. It is evicted when `get_new_blocks` pops "
        "it from the **head** — its hash is dropped right then (lazy eviction).",
        "zh": "只有 {num_gpu_blocks} 个块（其中一个是空块）。没有单独的驱逐过程，"
        "驱逐也不读任何时间戳：空闲的已缓存块只是排在空闲队列里。当 `get_new_blocks` "
        "从**队头**取出它时，它才被驱逐——哈希在那一刻被丢弃（惰性驱逐）。",
    },
    moments=(
        Moment(
            "freed",
            request="A",
            where="to_tail",
            text={
                "en": "A finished. Its blocks {blocks} go to the tail **in "
                "reverse order**: A's last block lands nearest the head and will be "
                "evicted first; its first block — the most shareable prefix — last.",
                "zh": "A 完成了。它的块 {blocks} **按逆序**进入队尾：A 的最后一块离队头最近，"
                "会最先被驱逐；它的第一块——最可能被共享的前缀——最后被驱逐。",
            },
        ),
        Moment(
            "allocated",
            request="B",
            where="evicts",
            text={
                "en": "B needs more blocks than were never used, so the queue head "
                "reached A's cached blocks. Popping one evicts it: its hash leaves "
                "the map ({blocks}). The prefix blocks of A are still there.",
                "zh": "B 需要的块比从未用过的块还多，于是队头轮到了 A 的已缓存块。"
                "取出它就等于驱逐它：它的哈希被移出哈希表（{blocks}）。A 的前缀块仍然还在。",
            },
        ),
        Moment(
            "evicted",
            text={
                "en": "An eviction is just `popleft` on the free queue plus "
                "dropping one hash: no scan, no timestamp read, no data moved. "
                "What is evicted is decided by the queue order alone.",
                "zh": "一次驱逐只是空闲队列的 `popleft` 加上丢弃一个哈希："
                "没有扫描、不读时间戳、不搬移数据。驱逐谁完全由队列顺序决定。",
            },
        ),
        Moment(
            "cache_hit",
            request="C",
            text={
                "en": "C repeats A's prompt. A's last blocks are gone, but reverse freeing "
                "kept the prefix furthest from the head: C still hits {num_tokens} "
                "tokens. Had A freed front-to-back, its *first* block would have been "
                "evicted first — and a chain without its first block cannot be hit at all.",
                "zh": "C 重复了 A 的提示词。A 的后几块已经没了，"
                "但逆序释放让前缀离队头最远：C 仍命中了 {num_tokens} 个 token。如果 A "
                "从前往后释放，它的*第一块*会最先被驱逐——而缺了第一块的链根本无法命中。",
            },
        ),
        Moment(
            "touched",
            request="C",
            where="rescue",
            text={
                "en": "Those blocks were free, in the **middle** of the "
                "queue: `touch` unlinks them in O(1) from the doubly linked "
                "list (ref_cnt 0 → 1). The hit rescued them from eviction.",
                "zh": "这些块原本空闲，位于队列**中间**：`touch` 以 O(1) "
                "把它们从双向链表中摘下（ref_cnt 0 → 1）。命中把它们从驱逐中救了回来。",
            },
        ),
    ),
    outro={
        "en": "Try a bigger pool with the switch above: "
        "nothing is evicted and C hits every full block.",
        "zh": "用上面的开关试试更大的块池：没有任何驱逐，C 命中了所有满块。",
    },
    questions=(
        Question(
            prompt={
                "en": "Which cached free block is evicted next?",
                "zh": "下一个被驱逐的已缓存空闲块是哪个？",
            },
            options=(
                {
                    "en": "The first cached block from the head of the free queue",
                    "zh": "从空闲队列队头数起的第一个已缓存块",
                },
                {"en": "The one with the oldest access timestamp", "zh": "访问时间戳最早的那个"},
                {"en": "The one with the fewest hits", "zh": "命中次数最少的那个"},
            ),
            answer=0,
            explain={
                "en": "Eviction reads no timestamp or counter: the queue order (free order, "
                "reversed per request) is the LRU order. vLLM's optional metrics collector "
                "(`kv_cache_metrics`) samples block access times for statistics, but eviction "
                "never reads them.",
                "zh": "驱逐不读任何时间戳或计数：队列顺序（释放顺序，每个请求内逆序）就是 LRU "
                "顺序。vLLM 可选的指标收集器（`kv_cache_metrics`）会抽样记录块的访问时间用于统计，"
                "但驱逐从不读取它们。",
            },
        ),
        Question(
            prompt={
                "en": "A hit on a block that sits in the middle of the free queue…",
                "zh": "命中一个位于空闲队列中间的块时……",
            },
            options=(
                {
                    "en": "removes it from the queue in O(1) (doubly linked list)",
                    "zh": "以 O(1) 把它从队列中移除（双向链表）",
                },
                {"en": "copies its K/V to a new block", "zh": "把它的 K/V 复制到新块"},
                {"en": "moves it to the head", "zh": "把它移到队头"},
            ),
            answer=0,
            explain={
                "en": "`touch` increments ref_cnt and calls "
                "`remove` on the free queue; nothing is copied.",
                "zh": "`touch` 增加 ref_cnt 并调用空闲队列的 `remove`；不复制任何数据。",
            },
        ),
    ),
    toggles=(
        Toggle(
            "num_gpu_blocks", {"en": "Pool size (blocks)", "zh": "块池大小（块数）"}, (12, 14, 24)
        ),
    ),
    focus=("evicted", "cache_hit", "touched"),
    panels=("myths",),
)
