"""The home page's live picture: two requests sharing a prompt prefix."""

from paged_kv_lab.lesson.catalog import Lesson, Moment

LESSON = Lesson(
    id="home",
    number=0,
    icon="🏠",
    title={"en": "Paged KV caching in a minute", "zh": "一分钟看懂分页 KV 缓存"},
    summary={"en": "", "zh": ""},
    scenario={
        "name": "home",
        "description": "Two requests with the same first words on a 12-block pool.",
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
                "max_tokens": 5,
                "ignore_eos": True,
            },
            {
                "id": "B",
                "prompt": "The capital of France is Paris, and the capital of Italy is",
                "max_tokens": 5,
                "arrival_step": 1,
                "ignore_eos": True,
            },
        ],
    },
    intro={
        "en": "Press Step: A's prompt is cut into blocks of {block_size} tokens.",
        "zh": "按“单步”：A 的提示词被切成每块 {block_size} 个 token。",
    },
    moments=(
        Moment(
            "allocated",
            request="A",
            text={
                "en": "A got blocks {blocks} — not a contiguous buffer, just the next free blocks.",
                "zh": "A 拿到了块 {blocks}——不是一段连续缓冲区，只是接下来的几个空闲块。",
            },
        ),
        Moment(
            "cache_hit",
            request="B",
            text={
                "en": "B starts with the same words: it reuses A's blocks "
                "{blocks} (ref_cnt 2) and computes only the rest.",
                "zh": "B 的开头相同：它复用 A 的块 {blocks}（ref_cnt 2），只计算剩余部分。",
            },
        ),
        Moment(
            "freed",
            text={
                "en": "{req} finished; its blocks return to the free queue: the cached "
                "ones at the tail, one without a hash at the head.",
                "zh": "{req} 完成；它的块回到空闲队列：已缓存的放在队尾，没有哈希的放在队头。",
            },
        ),
    ),
)
