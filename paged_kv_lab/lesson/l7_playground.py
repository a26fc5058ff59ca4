"""Lesson 7: the playground — every setting, free-text requests."""

from paged_kv_lab.lesson.catalog import Lesson

LESSON = Lesson(
    id="playground",
    number=7,
    icon="🛝",
    title={"en": "Playground", "zh": "游乐场"},
    summary={
        "en": "Add requests with your own text, change every engine setting, step and inspect.",
        "zh": "用自己的文字添加请求，修改所有引擎设置，单步运行并查看。",
    },
    scenario={
        "name": "playground",
        "description": "Two chat requests; add your own.",
        "model": "smollm2",
        "engine": {
            "block_size": 8,
            "num_gpu_blocks": 24,
            "max_num_seqs": 4,
            "max_num_batched_tokens": 64,
        },
        "requests": [
            {"id": "A", "prompt": "What is paged attention?", "chat": True, "max_tokens": 12},
            {
                "id": "B",
                "prompt": "Tell me a fact about the moon.",
                "chat": True,
                "max_tokens": 12,
                "arrival_step": 1,
            },
        ],
    },
    intro={
        "en": "Everything is yours: change any engine setting in the form, "
        "add requests (they arrive at the next step), step, go back, and "
        "hover anything. Upload or download the scenario as JSON.",
        "zh": "一切由你决定：在表单里修改任意引擎设置，添加请求（在下一步到达），"
        "单步、后退，悬停查看任何东西。还可以以 JSON 上传或下载场景。",
    },
    focus=("cache_hit", "evicted", "preempted", "window_skipped"),
    panels=("myths",),
)
