"""Lesson 5: sliding-window attention: null slots, flat memory, sparse retention, hybrid models."""

from paged_kv_lab.lesson.catalog import Lesson, Moment, Question, Toggle

LESSON = Lesson(
    id="sliding",
    number=5,
    icon="🪟",
    title={"en": "Sliding window", "zh": "滑动窗口"},
    summary={
        "en": "Windowed layers free blocks that leave the window; tables "
        "point at the null block; memory per request stays flat; sparse "
        "vs dense retention; a hybrid model with two tables per request.",
        "zh": "窗口注意力层释放滑出窗口的块；块表指向空块；"
        "每个请求的显存保持平稳；稀疏与稠密保留；每个请求两张块表的混合模型。",
    },
    scenario={
        "name": "lesson-5-sliding-window",
        "description": "Every layer attends to the last 8 tokens. A "
        "decodes 14 tokens; B runs alongside; C resends A's prompt "
        "after A finished and hits the blocks sparse retention kept.",
        "model": "smollm2",
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 24,
            "sliding_window": 8,
            "max_num_seqs": 2,
            "max_num_batched_tokens": 64,
        },
        "requests": [
            {
                "id": "A",
                "prompt": "Count with me: one, two, three,",
                "max_tokens": 14,
                "ignore_eos": True,
            },
            {
                "id": "B",
                "prompt": "Roses are red, violets are blue, sugar is sweet,",
                "max_tokens": 8,
                "arrival_step": 2,
                "ignore_eos": True,
            },
            {
                "id": "C",
                "prompt": "Count with me: one, two, three,",
                "max_tokens": 4,
                "arrival_step": 14,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "With a sliding window of W = {sliding_window}, a token attends only to itself "
        "and the W − 1 tokens before it. Older K/V is never read again, so a sliding-window "
        "group frees every block that lies wholly outside the window and points that table "
        "slot at the **null block** (∅). (SmolLM2 was trained with full attention, so its text "
        "degrades under a window: this lesson is about memory, not quality.)",
        "zh": "滑动窗口 W = {sliding_window} 时，一个 token 只关注它自己和之前的 W − 1 "
        "个 token。更早的 K/V 再也不会被读取，所以滑动窗口组会释放完全落在窗口之外的块，"
        "并把块表中的这个位置指向**空块**（∅）。（SmolLM2 训练时使用全注意力，"
        "加窗口后生成质量会下降：本课关注的是显存，而不是质量。）",
    },
    moments=(
        Moment(
            "window_skipped",
            text={
                "en": "{req}'s logical blocks {slots} left the window. "
                "`remove_skipped_blocks` (inside `allocate_slots`, before the capacity "
                "check) freed {blocks}; those slots now show ∅ in the block table.",
                "zh": "{req} 的逻辑块 {slots} 滑出了窗口。`remove_skipped_blocks`（在 "
                "`allocate_slots` 中、容量检查之前）释放了 {blocks}；块表里这些位置现在显示 ∅。",
            },
        ),
        Moment(
            "freed",
            where="window_reason",
            text={
                "en": "Blocks that left the window go back to the free queue like any "
                "freed block: hashed ones to the tail, unhashed ones to the head. "
                "Look at *blocks held per request*: it stays flat while decoding.",
                "zh": "滑出窗口的块像其他被释放的块一样回到空闲队列：有哈希的去队尾，"
                "没哈希的去队头。看看“每个请求持有的块数”：解码期间它保持平稳。",
            },
        ),
        Moment(
            "freed",
            request="A",
            where="to_head",
            key=False,
            text={
                "en": "Sparse retention (`prefix_cache_retention_interval` 0, vLLM's "
                "default): a sliding-window group hashes only the cdiv(W − 1, block_size) "
                "blocks that a resend of the same prompt could hit — those ending where "
                "the prompt's last block starts. A's other full blocks never got a hash, "
                "so they went to the **head**. Switch to *dense* to hash them all.",
                "zh": "稀疏保留（`prefix_cache_retention_interval` 为 0，vLLM 默认）："
                "滑动窗口组只给“重发同一提示词时可能命中”的 cdiv(W − 1, block_size) "
                "个块计算哈希——即在提示词最后一块开始处结束的那几块。A 的其他满块从未得到哈希，"
                "所以去了**队头**。切换到“稠密”可以给它们全部计算哈希。",
            },
        ),
        Moment(
            "cache_hit",
            request="C",
            text={
                "en": "C resends A's prompt. For a sliding window the hit is "
                "searched **from the right**: it needs enough contiguous cached "
                "blocks to cover the window before the last prompt token — exactly "
                "the blocks sparse retention kept. C hits {num_tokens} tokens.",
                "zh": "C 重发了 A 的提示词。滑动窗口的命中是**从右往左**查找的："
                "只需要足够多的连续已缓存块覆盖最后一个提示 token "
                "之前的窗口——正是稀疏保留留下的那些块。C 命中了 {num_tokens} 个 token。",
            },
        ),
    ),
    outro={
        "en": "Switch *layers* to *hybrid*: half the layers use full attention, "
        "half the window. Each request then has two block tables (one per KV "
        "cache group) drawn from the one shared pool; only the sliding group's "
        "table gets ∅ slots, and a hit must hold in both groups.",
        "zh": "把“层”切换为“混合”：一半层用全注意力，一半用滑动窗口。"
        "每个请求于是有两张块表（每个 KV 缓存组一张），都从同一个块池分配；"
        "只有滑动窗口组的块表会出现 ∅，而且命中必须在两个组中同时成立。",
    },
    questions=(
        Question(
            prompt={
                "en": "W = 8, block_size = 4, a request has computed "
                "17 tokens. Which logical blocks can be freed?",
                "zh": "W = 8，block_size = 4，一个请求已计算 17 个 token。哪些逻辑块可以释放？",
            },
            options=(
                {"en": "0 and 1 (tokens 0–7)", "zh": "0 和 1（token 0–7）"},
                {"en": "0, 1 and 2", "zh": "0、1 和 2"},
                {"en": "none until the request finishes", "zh": "在请求结束前都不能"},
            ),
            answer=0,
            explain={
                "en": "The next token (position 17) sees positions "
                "10–17; blocks 0 (0–3) and 1 (4–7) are wholly before 10.",
                "zh": "下一个 token（位置 17）能看到位置 10–17；"
                "块 0（0–3）和块 1（4–7）完全在 10 之前。",
            },
        ),
        Question(
            prompt={
                "en": "What does a null slot in a block table mean?",
                "zh": "块表中的空块位置意味着什么？",
            },
            options=(
                {
                    "en": "That logical block left the window; its physical block was freed",
                    "zh": "这个逻辑块滑出了窗口，它的物理块已被释放",
                },
                {"en": "The block is being swapped in", "zh": "这个块正在被换入"},
                {"en": "The block is shared", "zh": "这个块被共享"},
            ),
            answer=0,
            explain={
                "en": "The table keeps its length (positions stay "
                "addressable) but points at block 0, which holds nothing.",
                "zh": "块表保持长度不变（位置仍可寻址），但指向块 0，它不存任何东西。",
            },
        ),
    ),
    toggles=(
        # The old setting name, read as prefix_cache_retention_interval 0 / null
        # (record/scenario.py).
        Toggle(
            "sliding_retention",
            {"en": "Retention", "zh": "保留策略"},
            ("sparse", "dense"),
            (
                {"en": "sparse (interval 0)", "zh": "稀疏（间隔 0）"},
                {"en": "dense (interval null)", "zh": "稠密（间隔 null）"},
            ),
        ),
        Toggle(
            "layers",
            {"en": "Layers", "zh": "层"},
            ("uniform", "hybrid"),
            (
                {"en": "all sliding", "zh": "全部滑动窗口"},
                {"en": "hybrid: full + sliding", "zh": "混合：全注意力 + 滑动窗口"},
            ),
        ),
    ),
    focus=("window_skipped", "cache_hit"),
    panels=("held",),
    layer_pattern=("full_attention", "sliding_attention"),
)
