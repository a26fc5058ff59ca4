"""Lesson 1: blocks, the null block and the free queue."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle

LESSON = Lesson(
    id="blocks",
    number=1,
    icon="🧱",
    title={"en": "Blocks and the free queue", "zh": "块与空闲队列"},
    summary={
        "en": "The pool, the null block, allocation from the head, and where freed blocks go.",
        "zh": "块池、空块、从队头分配，以及释放的块去了哪里。",
    },
    scenario={
        "name": "lesson-1-blocks",
        "description": "Three requests on a 16-block pool with 4-token "
        "blocks: allocation from the queue head, reverse-order freeing, "
        "unhashed blocks to the head and hashed ones to the tail.",
        "model": "smollm2",
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 16,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 64,
        },
        "requests": [
            {"id": "A", "prompt": "The capital of France is", "max_tokens": 6, "ignore_eos": True},
            {
                "id": "B",
                "prompt": "Once upon a time, in a small village,",
                "max_tokens": 10,
                "arrival_step": 1,
                "ignore_eos": True,
            },
            {
                "id": "C",
                "prompt": "Water boils at",
                "max_tokens": 6,
                "arrival_step": 6,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "The KV cache is not one long buffer per request. vLLM cuts GPU memory "
        "into **blocks** of `block_size` tokens ({block_size} here) and keeps all "
        "of them in a pool of {num_gpu_blocks}. Free blocks wait in a **free "
        "queue**, a doubly linked list drawn below from head to tail. Block 0 is the "
        "**null block**: taken out when the pool is built, never handed to a request, "
        "never freed — it only fills table slots that hold nothing. Press **Step**.",
        "zh": "KV 缓存不是每个请求一段连续的长缓冲区。vLLM 把显存切成一个个**块**，每块存 "
        "`block_size` 个 token（这里是 {block_size}），全部放进一个共 "
        "{num_gpu_blocks} 块的池子。空闲的块排在**空闲队列**里——一个双向链表，"
        "下图按从队头到队尾的真实顺序画出。块 0 是**空块（null block）**：建池时就被取出，"
        "从不分配给请求，也从不释放，只用来填充块表中“什么都没有”的位置。请按**单步**。",
    },
    moments=(
        Moment(
            "allocated",
            request="A",
            text={
                "en": "A's 5 prompt tokens need ⌈5 / {block_size}⌉ blocks. `get_new_blocks` "
                "popped {blocks} from the **head** of the free queue — the queue started as "
                "1, 2, 3, … because block 0 was taken out for the null block.",
                "zh": "A 的 5 个提示 token 需要 ⌈5 / {block_size}⌉ 个块。"
                "`get_new_blocks` 从空闲队列**队头**取出了 {blocks}——队列一开始是 "
                "1, 2, 3, …，因为块 0 已经被取出当作空块。",
            },
        ),
        Moment(
            "cached",
            request="A",
            text={
                "en": "Full blocks get their hash immediately, inside `allocate_slots`, "
                "even before the forward pass writes their K/V. A's last block is only "
                "partly filled: no hash yet, so nobody could hit it.",
                "zh": "满块在 `allocate_slots` 里立刻得到哈希，甚至早于前向计算写入它的 K/V。"
                "A 的最后一块只装了一部分：还没有哈希，所以没有人能命中它。",
            },
        ),
        Moment(
            "allocated",
            request="B",
            text={
                "en": "B arrived and took {blocks} — again the next blocks at the head. "
                "Allocation never searches for a 'good' block: it is always `popleft`, O(1).",
                "zh": "B 到达并拿到了 {blocks}——仍然是队头的下一批块。"
                "分配从不搜索“合适的”块：永远是 `popleft`，O(1)。",
            },
        ),
        Moment(
            "allocated",
            request="A",
            where="decode_alloc",
            text={
                "en": "A's decoding filled its last block, so the next token needs "
                "a new one: {blocks} from the head. A request's blocks need not "
                "be contiguous — its block table maps logical to physical.",
                "zh": "A 的解码填满了最后一块，下一个 token 需要新块：从队头取出 {blocks}。"
                "同一请求的块不必连续——块表负责把逻辑块映射到物理块。",
            },
        ),
        Moment(
            "freed",
            request="A",
            text={
                "en": "A finished. `free` releases its blocks in **reverse order** "
                "({blocks}). vLLM 0.33: blocks that carry a hash go to the **tail** "
                "(kept as cache, reused last); a block without a hash can never be hit, "
                "so it goes to the **head** to be reused first. Switch *free order* to "
                "*legacy* to see the older rule, where everything goes to the tail.",
                "zh": "A 完成了。`free` 按**逆序**释放它的块（{blocks}）。vLLM "
                "0.33 中：带哈希的块放到**队尾**（作为缓存保留，最后才被复用）；"
                "没有哈希的块永远不会被命中，所以放到**队头**，最先被复用。"
                "把“释放顺序”切换为“legacy”可以看到旧规则：所有块都放到队尾。",
            },
        ),
        Moment(
            "allocated",
            request="C",
            text={
                "en": "C takes {blocks} from the head. With the 0.33 "
                "order that is the block A freed without a hash: reusing "
                "it first keeps every cached block alive a little longer.",
                "zh": "C 从队头拿到 {blocks}。按 0.33 的顺序，这正是 A 释放的那个没有哈希的块："
                "先复用它，所有已缓存的块就能多活一会儿。",
            },
        ),
    ),
    outro={
        "en": "Everything is back in the free queue except the null block. Cached "
        "blocks keep their hashes until `get_new_blocks` pops them — eviction is lazy.",
        "zh": "除了空块，所有块都回到了空闲队列。已缓存的块会一直保留哈希，"
        "直到被 `get_new_blocks` 取出——驱逐是惰性的。",
    },
    questions=(
        Question(
            prompt={"en": "Why is block 0 never allocated?", "zh": "为什么块 0 从不被分配？"},
            options=(
                {
                    "en": "It is the null block: a placeholder for table slots that hold nothing",
                    "zh": "它是空块：给块表中不存东西的位置占位",
                },
                {"en": "It is reserved for the system prompt", "zh": "它专门留给系统提示词"},
                {"en": "It is the head of the free queue", "zh": "它是空闲队列的队头"},
            ),
            answer=0,
            explain={
                "en": "BlockPool pops block 0 at start as the null block; sliding-window tables "
                "point skipped slots at it. It is never freed, evicted or counted as free.",
                "zh": "BlockPool 在初始化时取出块 0 作为空块；滑动窗口的块表把跳过的位置指向它。"
                "它从不被释放、驱逐，也不计入空闲块。",
            },
        ),
        Question(
            prompt={
                "en": "In vLLM 0.33, a block freed *without* a hash goes to…",
                "zh": "在 vLLM 0.33 中，没有哈希的块被释放后放到……",
            },
            options=(
                {"en": "the head of the free queue", "zh": "空闲队列的队头"},
                {"en": "the tail of the free queue", "zh": "空闲队列的队尾"},
                {"en": "a separate list of empty blocks", "zh": "另一个空块列表"},
            ),
            answer=0,
            explain={
                "en": "It can never be a cache hit, so it is reused first (`prepend_n`); "
                "hashed blocks go to the tail so they survive as long as possible.",
                "zh": "它不可能被缓存命中，因此最先复用（`prepend_n`）；"
                "带哈希的块放到队尾，尽可能久地保留。",
            },
        ),
        Question(
            prompt={
                "en": "SmolLM2-135M: 30 layers, 3 KV heads, head "
                "size 64, float32. Bytes per block at block_size 16?",
                "zh": "SmolLM2-135M：30 层、3 个 KV 头、头维度 "
                "64、float32。block_size 为 16 时每块多少字节？",
            },
            options=(
                {"en": "737,280 (720 KiB)", "zh": "737,280（720 KiB）"},
                {"en": "368,640 (360 KiB)", "zh": "368,640（360 KiB）"},
                {"en": "46,080 (45 KiB)", "zh": "46,080（45 KiB）"},
            ),
            answer=0,
            explain={
                "en": "16 × 30 × 2 (K and V) × 3 × 64 × 4 bytes = "
                "737,280. Forgetting the 2 for K and V gives the half.",
                "zh": "16 × 30 × 2（K 和 V）× 3 × 64 × 4 字节 "
                "= 737,280。忘了 K、V 的 ×2 就会得到一半。",
            },
        ),
    ),
    toggles=(
        Toggle(
            "free_order",
            {"en": "Free order", "zh": "释放顺序"},
            ("v0.33", "legacy"),
            (
                {
                    "en": "v0.33: unhashed → head, hashed → tail",
                    "zh": "v0.33：无哈希→队头，有哈希→队尾",
                },
                {"en": "legacy: everything → tail", "zh": "legacy：全部→队尾"},
            ),
        ),
    ),
    focus=("allocated", "finished"),
    panels=("memory",),
)
