// The player's words (EN / 中文) and el(), the one way the player puts text on the page: as
// textContent, never as HTML. Shared by player.js, panels.js and charts.js.

export const LABELS = {
  en: {
    back: "◀ Back", step: "Step ▶", play: "▶ Play", pause: "⏸ Pause", end: "⏭ Run to end", until: "Go",
    until_prefix: "Run until", pos: (n, m) => `Step ${n} of ${m}`, computing: "computing…",
    grid: "Physical KV blocks (GPU block pool)", events: "What happened this step", queue: "Free block queue (head → tail)",
    outputs: "Generated text", tables: "Block tables (logical → physical)", chains: "Prefix-cache hash chains",
    address: "PagedAttention addressing", selected: "Selected",
    grid_caption: "Colour = owning request · yellow = free but still cached · grey = free · dark = null block · black border = shared · red dot = changed this step. Hover for details, click to follow.",
    queue_caption: "The head is reused (and its cached hash evicted) first; freed blocks join at the tail, a request's last block first.",
    chains_caption: "Each cached block's hash covers its parent's hash and its own tokens, so a match of block i means blocks 0..i all match.",
    m_step: "Step", m_free: "Free blocks", m_usage: "KV usage", m_hit: "Prefix hit rate", m_rw: "Running / waiting",
    events_none: "The state before the first step.", all_done: "All requests finished.", trace_end: "The end of the recorded run.",
    found: (k, s) => `Found ${k} at step ${s}.`, not_found: (k) => `No ${k} in the rest of the run.`,
    searching: (k) => `Looking for ${k}…`, hold: "🎓 Answer the question below to see the next step.",
    waiting_step: "Computing the next step…", block: "block", ref: "ref_cnt", owners: "owners", hash: "hash",
    parent: "parent hash", group: "group", tokens: "tokens", text: "text", qpos: "free-queue position",
    not_free: "not in the free queue", head: "head", tail: "tail", none_hash: "NONE_HASH (no parent)",
    orphans: "parent evicted", no_chains: "No cached blocks yet.", no_tables: "No request holds blocks.",
    address_none: "No request holds blocks yet.", req: "request", pos_label: "token position", null_block: "null",
    not_computed: "(not computed yet)", status: "status", prompt: "prompt", computed: "computed", cached: "cached hit",
    preemptions: "preemptions", free: "free", speed: (s) => `${s}×`, decoded_ids: "(token ids: no tokenizer)",
    click_hint: "Click a block or a request in any panel to follow it; click again to stop.",
    requests: "Requests", over_time: "Over time", budget: "Token budget per step", held: "Blocks held per request",
    req_cols: ["request", "status", "prompt", "output", "computed", "cached (hit)", "preempted", "priority"],
    c_usage: "KV usage %", c_hit: "prefix hit rate %", c_running: "running", c_waiting: "waiting", c_step: "step",
    c_count: "requests", c_budget: "max_num_batched_tokens", c_tokens: "tokens scheduled",
    c_blocks: "blocks held (not counting null)", c_striped: "striped = prefill / chunk, solid = decode",
    prefill: "prefill", chunk: "prefill chunk", decode: "decode", recompute: "recompute",
  },
  zh: {
    back: "◀ 后退", step: "单步 ▶", play: "▶ 播放", pause: "⏸ 暂停", end: "⏭ 运行到结束", until: "开始",
    until_prefix: "运行直到", pos: (n, m) => `第 ${n} 步，共 ${m} 步`, computing: "计算中…",
    grid: "物理 KV 块（GPU 块池）", events: "本步发生了什么", queue: "空闲块队列（队头 → 队尾）",
    outputs: "生成的文本", tables: "块表（逻辑块 → 物理块）", chains: "前缀缓存哈希链",
    address: "PagedAttention 寻址", selected: "已选中",
    grid_caption: "颜色 = 所属请求 · 黄色 = 空闲但仍缓存 · 灰色 = 空闲 · 深色 = 空块 · 黑框 = 共享 · 红点 = 本步改变。悬停查看详情，点击跟踪。",
    queue_caption: "队头最先被复用（其缓存哈希被驱逐）；释放的块加入队尾，请求的最后一个块最先加入。",
    chains_caption: "每个缓存块的哈希覆盖父块哈希和自身 token，所以第 i 块匹配意味着第 0..i 块全部匹配。",
    m_step: "步", m_free: "空闲块", m_usage: "KV 使用率", m_hit: "前缀命中率", m_rw: "运行 / 等待",
    events_none: "第一步之前的状态。", all_done: "所有请求都已完成。", trace_end: "录制的运行到此结束。",
    found: (k, s) => `在第 ${s} 步找到 ${k}。`, not_found: (k) => `运行的剩余部分没有 ${k}。`,
    searching: (k) => `正在查找 ${k}…`, hold: "🎓 先回答下面的问题，再看下一步。",
    waiting_step: "正在计算下一步…", block: "块", ref: "ref_cnt", owners: "持有者", hash: "哈希",
    parent: "父哈希", group: "组", tokens: "token 数", text: "文本", qpos: "空闲队列位置",
    not_free: "不在空闲队列中", head: "队头", tail: "队尾", none_hash: "NONE_HASH（无父块）",
    orphans: "父块已被驱逐", no_chains: "还没有缓存块。", no_tables: "没有请求持有块。",
    address_none: "还没有请求持有块。", req: "请求", pos_label: "token 位置", null_block: "空块",
    not_computed: "（尚未计算）", status: "状态", prompt: "提示", computed: "已计算", cached: "缓存命中",
    preemptions: "抢占次数", free: "空闲", speed: (s) => `${s}×`, decoded_ids: "（token id：没有分词器）",
    click_hint: "在任意面板点击一个块或请求即可跟踪它；再次点击取消。",
    requests: "请求", over_time: "随时间变化", budget: "每步 token 预算", held: "每个请求持有的块数",
    req_cols: ["请求", "状态", "提示词", "输出", "已计算", "命中缓存", "被抢占", "优先级"],
    c_usage: "KV 使用率 %", c_hit: "前缀命中率 %", c_running: "运行中", c_waiting: "等待中", c_step: "步",
    c_count: "请求数", c_budget: "max_num_batched_tokens", c_tokens: "本步调度的 token",
    c_blocks: "持有的块数（不含空块）", c_striped: "斜纹 = 预填充 / 分块预填充，实心 = 解码",
    prefill: "预填充", chunk: "分块预填充", decode: "解码", recompute: "重算",
  },
};
export const KIND_NAMES = {
  en: { cache_hit: "a cache hit", evicted: "an eviction", preempted: "a preemption", window_skipped: "a window skip",
        allocated: "an allocation", finished: "a finished request", freed: "a free", touched: "a touch",
        cached: "a newly cached block", resumed: "a resume", admitted: "an admission" },
  zh: { cache_hit: "缓存命中", evicted: "驱逐", preempted: "抢占", window_skipped: "滑出窗口", allocated: "分配",
        finished: "请求完成", freed: "释放", touched: "touch", cached: "新缓存块", resumed: "恢复", admitted: "接纳" },
};

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
