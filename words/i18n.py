"""UI text in English and Chinese.

Every label the app shows goes through ``tr(key, lang, **fields)``. Lesson
narration lives with each lesson (lesson/lessons/), event sentences in
words/sentences.py; both use the same two-language dict shape ``{"en": ..., "zh": ...}``.
"""
from __future__ import annotations

LANGS = ("en", "zh")
LANG_NAMES = {"en": "English", "zh": "中文"}

TEXT: dict[str, tuple[str, str]] = {
    # app shell and sidebar
    "app_title": ("Paged KV Lab", "分页 KV 缓存实验室"),
    "language": ("Language", "语言"),
    "model": ("Model", "模型"),
    "model_smollm2": ("SmolLM2-135M-Instruct (real)", "SmolLM2-135M-Instruct（真实模型）"),
    "model_tiny-random": ("tiny random model (tests)", "微型随机模型（测试用）"),
    "device": ("Device", "设备"),
    "device_auto": ("auto (CUDA if available)", "自动（有 CUDA 则用 CUDA）"),
    "device_cpu": ("cpu", "cpu"),
    "device_cuda": ("cuda", "cuda"),
    "model_state": ("Model state", "模型状态"),
    "model_loading": ("Loading {model} on {device}… (first start converts the GGUF once)",
                      "正在 {device} 上加载 {model}……（首次启动会转换一次 GGUF）"),
    "model_loaded": ("Loaded {model} on {device} in {secs:.1f} s", "{model} 已加载到 {device}，用时 {secs:.1f} 秒"),
    "model_ready": ("{model} ready on {device}", "{model} 已就绪（{device}）"),
    "model_failed": ("Could not load {model} on {device}: {error}", "无法在 {device} 上加载 {model}：{error}"),
    "model_hint": ("Pick another model or device in the sidebar; the rest of the app keeps working.",
                   "请在侧边栏换一个模型或设备；应用其余部分照常可用。"),
    "model_info": ("{layers} layers · {kv_heads} KV heads · head size {head_dim} · {dtype}",
                   "{layers} 层 · {kv_heads} 个 KV 头 · 头维度 {head_dim} · {dtype}"),
    "nav_home": ("Home", "首页"),
    "nav_lessons": ("Lessons", "课程"),
    # controls
    "step": ("Step", "单步"),
    "back": ("Back", "后退"),
    "reset": ("Reset", "重置"),
    "play": ("Play", "播放"),
    "pause": ("Pause", "暂停"),
    "to_end": ("Run to end", "运行到结束"),
    "run_until": ("Run until", "运行直到"),
    "run_until_go": ("Go", "执行"),
    "timeline": ("Timeline (step)", "时间轴（步）"),
    "speed": ("Play speed (s per step)", "播放速度（每步秒数）"),
    "step_of": ("Step {step} of {total} computed", "第 {step} 步（已计算 {total} 步）"),
    "download_run": ("Download this run", "下载这次运行"),
    "download_run_help": ("One HTML file with the player and every step recorded so far: it opens offline, "
                          "with no server (for slides, handouts, course pages).",
                          "一个 HTML 文件，包含播放器和目前录制的每一步：无需服务器即可离线打开（适合幻灯片、讲义、课程网页）。"),
    "all_done": ("All requests have finished.", "所有请求都已完成。"),
    "not_found": ("No “{kind}” event until the end of the run (stopped at step {step}).",
                  "直到运行结束都没有“{kind}”事件（停在第 {step} 步）。"),
    "found_at": ("First “{kind}” event at step {step}.", "在第 {step} 步出现第一个“{kind}”事件。"),
    "step_error": ("The engine could not run this step: {error}", "引擎无法执行这一步：{error}"),
    "kind_cache_hit": ("cache hit", "缓存命中"),
    "kind_evicted": ("eviction", "驱逐"),
    "kind_preempted": ("preemption", "抢占"),
    "kind_window_skipped": ("window skip", "滑出窗口"),
    "kind_finished": ("a request finishing", "请求完成"),
    "kind_allocated": ("allocation", "分配"),
    # panels
    "narration": ("What is happening", "正在发生什么"),
    "events": ("Events of this step", "本步事件"),
    "events_none": ("Nothing happened yet: press Step.", "还没有发生任何事：请按“单步”。"),
    "grid": ("Physical blocks", "物理块"),
    "grid_caption": ("Colour = owning request; thick border = shared (ref_cnt > 1); red border = next victim "
                     "(free-queue head); pale yellow = cached but free; grey = free; black ∅ = null block. "
                     "Hover a block for its hash, parent hash, text, owners and queue position.",
                     "颜色 = 持有该块的请求；粗边框 = 共享（ref_cnt > 1）；红边框 = 下一个被复用的块（空闲队列头）；"
                     "淡黄 = 已缓存但空闲；灰色 = 空闲；黑色 ∅ = 空块（null block）。"
                     "鼠标悬停可看哈希、父哈希、文本、持有者和队列位置。"),
    "tables": ("Block tables (logical block → physical block)", "块表（逻辑块 → 物理块）"),
    "queue": ("Free queue, head → tail", "空闲队列（头 → 尾）"),
    "queue_caption": ("get_new_blocks pops from the head; freed blocks with a hash go to the tail, "
                      "freed blocks without one go to the head (vLLM 0.33).",
                      "get_new_blocks 从队头取块；释放时带哈希的块放到队尾，"
                      "不带哈希的块放到队头（vLLM 0.33）。"),
    "chains": ("Prefix-cache hash chains", "前缀缓存哈希链"),
    "chains_caption": ("Each node is a cached block: hash = H(parent hash, its tokens, extra keys). "
                       "Requests that share a prefix share a path from the root.",
                       "每个节点是一个已缓存的块：哈希 = H(父哈希, 块内 token, 额外键)。"
                       "共享前缀的请求共享从根出发的同一条路径。"),
    "outputs": ("Generated text", "生成的文本"),
    "metrics": ("Over time", "随时间变化"),
    "m_step": ("Step", "步"),
    "m_free": ("free blocks", "空闲块"),
    "usage": ("KV usage %", "KV 使用率 %"),
    "hit_rate": ("prefix hit rate %", "前缀命中率 %"),
    "running": ("running", "运行中"),
    "waiting": ("waiting", "等待中"),
    "budget": ("Token budget per step", "每步 token 预算"),
    "budget_line": ("max_num_batched_tokens", "max_num_batched_tokens"),
    "held": ("Blocks held per request", "每个请求持有的块数"),
    "address": ("PagedAttention address", "PagedAttention 寻址"),
    "address_req": ("Request", "请求"),
    "address_pos": ("Token position", "token 位置"),
    "address_none": ("No request holds blocks at this step.", "这一步没有请求持有块。"),
    "memory": ("Memory math", "显存计算"),
    "myths": ("Myths vs what vLLM does", "误区与 vLLM 的真实做法"),
    "requests": ("Requests", "请求"),
    "req_table_cols": (("request", "status", "prompt", "output", "computed", "cached (hit)", "preempted", "priority"),
                       ("请求", "状态", "提示词", "输出", "已计算", "命中缓存", "被抢占", "优先级")),
    "settings": ("Engine settings", "引擎设置"),
    "settings_apply_note": ("Changing a setting rebuilds the engine and replays to the same step.",
                            "修改设置会重建引擎并重放到同一步。"),
    "scenario": ("Scenario file", "场景文件"),
    "download": ("Download scenario JSON", "下载场景 JSON"),
    "upload": ("Upload scenario JSON", "上传场景 JSON"),
    "paste": ("…or paste scenario JSON", "……或粘贴场景 JSON"),
    "load": ("Load", "加载"),
    "loaded_ok": ("Loaded scenario “{name}”.", "已加载场景“{name}”。"),
    "bad_scenario": ("This scenario was not loaded; nothing changed. Problems:", "场景未加载，当前状态未改变。问题："),
    "bad_json": ("not valid JSON: {error}", "不是合法的 JSON：{error}"),
    "link": ("Link to this view", "本视图链接"),
    "link_caption": ("The URL holds the lesson, step, language and settings: copy it to reopen this view.",
                     "URL 中保存了课程、步数、语言和设置：复制它即可重新打开此视图。"),
    # quiz
    "quiz_mode": ("Predict the next step (quiz)", "预测下一步（测验）"),
    "quiz_title": ("Predict before you look", "先预测，再揭晓"),
    "quiz_answer": ("Answer", "作答"),
    "quiz_reveal": ("Reveal the step", "揭晓这一步"),
    "quiz_skip": ("Skip question", "跳过此题"),
    "quiz_right": ("Right!", "答对了！"),
    "quiz_wrong": ("Not quite: the answer is {answer}.", "不对：答案是 {answer}。"),
    "quiz_q_victim": ("This step will preempt a request. Which one is the victim?", "这一步会抢占一个请求。被抢占的是哪个？"),
    "quiz_q_hit": ("{req} is about to be looked up in the prefix cache. Will it hit?", "{req} 即将查询前缀缓存。会命中吗？"),
    "quiz_q_alloc": ("Which physical block will be allocated first in this step?", "这一步最先分配的物理块是哪一个？"),
    "quiz_q_evict": ("A cached block will lose its hash in this step. Which block?", "这一步有一个已缓存块会失去它的哈希。是哪一个？"),
    "quiz_q_free": ("How many blocks will be free after this step?", "这一步之后会有多少个空闲块？"),
    "yes": ("yes", "会"),
    "no": ("no", "不会"),
    "check_yourself": ("Check yourself", "自我检测"),
    "block": ("block", "块"),
    # home
    "home_title": ("Paged KV caching in a minute", "一分钟看懂分页 KV 缓存"),
    "home_live": ("Live: two requests sharing a prompt prefix on the real model", "实时演示：真实模型上两个共享提示前缀的请求"),
    "home_lessons": ("Lessons", "课程列表"),
    "open": ("Open", "打开"),
    # trace viewer
    "nav_tools": ("Tools", "工具"),
    "nav_trace": ("Trace viewer", "轨迹查看器"),
    "trace_title": ("Trace viewer", "轨迹查看器"),
    "trace_summary": ("Open a trace written by `python -m kvcore run SCENARIO.json --trace OUT.jsonl` and step "
                      "through the recorded allocation decisions with every picture of the lessons. Nothing is "
                      "recomputed: what you see is what the engine recorded.",
                      "打开由 `python -m kvcore run SCENARIO.json --trace OUT.jsonl` 写出的轨迹文件，"
                      "用课程里的全部图示逐步查看记录下的分配决策。不会重新计算：看到的就是引擎记录的内容。"),
    "trace_upload": ("Trace file (.jsonl)", "轨迹文件（.jsonl）"),
    "trace_example": ("Load an example trace", "加载示例轨迹"),
    "trace_example_help": ("Runs examples/eviction.json on the loaded model and opens its trace, as the CLI "
                           "would write it.",
                           "用已加载的模型运行 examples/eviction.json，并打开它的轨迹（与命令行写出的相同）。"),
    "trace_none": ("No trace loaded yet: upload a .jsonl file or load the example.",
                   "尚未加载轨迹：请上传 .jsonl 文件，或加载示例。"),
    "trace_loaded": ("Loaded trace “{name}”: {steps} steps.", "已加载轨迹“{name}”：共 {steps} 步。"),
    "bad_trace": ("“{name}” was not loaded; the trace shown before is kept. Problems:",
                  "“{name}”未加载，之前显示的轨迹保持不变。问题："),
    "trace_about": ("**{name}** · {steps} steps · scenario “{scenario}” · model {model}",
                    "**{name}** · 共 {steps} 步 · 场景“{scenario}” · 模型 {model}"),
    "trace_no_header": ("This trace has no header line (it was written before traces had one): the scenario and "
                        "the state before step 1 are unknown, so it starts at step 1.",
                        "这个轨迹没有头部行（写出它的版本还没有头部）：场景和第 1 步之前的状态未知，因此从第 1 步开始。"),
    "trace_ids_only": ("Tokens are shown as ids: the trace was recorded with {model}, the sidebar's model is {loaded}.",
                       "token 以 id 显示：轨迹用 {model} 录制，而侧边栏的模型是 {loaded}。"),
    "trace_ids_unknown": ("Tokens are shown as ids: the trace does not say which model recorded it.",
                          "token 以 id 显示：轨迹没有记录是哪个模型生成的。"),
    "trace_step_of": ("Step {step} of {total} in the trace", "第 {step} 步（轨迹共 {total} 步）"),
    "trace_end": ("End of the trace: it stops here, before every request finished.",
                  "轨迹到此结束：它在所有请求完成之前就停止了。"),
    "trace_outputs": ("Outputs at the end of the run (the trace's last line)", "运行结束时的输出（轨迹的最后一行）"),
    "trace_outputs_cols": (("request", "finish reason", "text", "token ids"), ("请求", "结束原因", "文本", "token id")),
    "trace_no_outputs": ("The trace has no outputs line (the file may have been cut short).",
                         "轨迹没有输出行（文件可能被截断了）。"),
    "trace_scenario": ("Scenario of this trace (header)", "本轨迹的场景（头部）"),
    "trace_open_playground": ("Open this scenario in the Playground", "在游乐场中打开这个场景"),
}


def tr(key: str, lang: str = "en", **fields) -> str:
    """Look up ``key`` in ``lang``; unknown keys come back as the key itself."""
    pair = TEXT.get(key)
    if pair is None:
        return key
    text = pair[1] if lang == "zh" else pair[0]
    if fields and isinstance(text, str):
        return text.format(**fields)
    return text


def pick(texts: dict | str | None, lang: str = "en", **fields) -> str:
    """Choose a language from a ``{"en": ..., "zh": ...}`` dict (lesson data)."""
    if texts is None:
        return ""
    if isinstance(texts, str):
        text = texts
    else:
        text = texts.get(lang) or texts.get("en") or ""
    return text.format(**fields) if fields else text
