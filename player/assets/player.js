// The step player: steps a recorded run in the browser, with no server round-trip.
// Used as a Streamlit v2 component (the default export is called on every render with the
// latest `data`) and inside the static export (called once). Every string that comes from the
// run (token text, prompts, request ids, sentences) is inserted with textContent, never as HTML.

const LABELS = {
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
const KIND_NAMES = {
  en: { cache_hit: "a cache hit", evicted: "an eviction", preempted: "a preemption", window_skipped: "a window skip",
        allocated: "an allocation", finished: "a finished request", freed: "a free", touched: "a touch",
        cached: "a newly cached block", resumed: "a resume", admitted: "an admission" },
  zh: { cache_hit: "缓存命中", evicted: "驱逐", preempted: "抢占", window_skipped: "滑出窗口", allocated: "分配",
        finished: "请求完成", freed: "释放", touched: "touch", cached: "新缓存块", resumed: "恢复", admitted: "接纳" },
};
const SPEEDS = [0.5, 1, 2, 4];
const PLAY_MS = 800;
const REPORT_MS = 700;      // the cursor is reported once the learner pauses: each report reruns Python
const POLL_MS = 500;        // while the server still records the run, ask it for new steps this often
const LEAVING_MS = 3000;    // after a click on a link to another page, how long this page's players keep still
const RUNS = new Map();      // run key -> {head, snaps, steps, done}: survives a remount of the element
const MAX_RUNS = 4;
const PLAYERS = new WeakMap();
let PLAYER_UIDS = 0;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function applyDelta(prev, d) {
  const blocks = prev.blocks.slice();
  for (const b of d.blocks) blocks[b.i] = b;
  const byId = new Map(prev.reqs.map((r) => [r.id, r]));
  for (const r of d.reqs) byId.set(r.id, r);
  const order = d.order || prev.reqs.map((r) => r.id);
  return { step: d.step, wait: d.wait, run: d.run, usage: d.usage, free: d.free, pc: d.pc, blocks,
           queue: d.queue || prev.queue, reqs: order.map((id) => byId.get(id)) };
}

// -- charts over steps: plain SVG, every label set with textContent ---------------------
const SVGNS = "http://www.w3.org/2000/svg";

function sv(tag, attrs, text) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function niceStep(range, ticks) {   // a tick spacing of 1, 2 or 5 × 10^k giving about `ticks` ticks
  const raw = Math.max(range / ticks, 1e-9);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= raw);
}

// Axes for steps x0..x1 (each step centred in its own slot, so bars fit) and values 0..yMax on the
// left (0..y2Max on the right when given). The x range is the recorded run's, so it does not
// jump as the cursor moves.
function stepFrame({ x0, x1, yMax, y2Max, xLabel, yLabel, y2Label, intY, intY2 }) {
  const W = 720, H = 220, m = { l: 50, r: y2Max ? 50 : 14, t: 12, b: 36 };
  const pw = W - m.l - m.r, ph = H - m.t - m.b, slots = Math.max(x1 - x0 + 1, 1);
  const svg = sv("svg", { viewBox: `0 0 ${W} ${H}`, class: "pkv-svg" });
  const f = { svg, slot: pw / slots, top: m.t, bottom: m.t + ph,
    x: (s) => m.l + ((s - x0 + 0.5) / slots) * pw,
    y: (v) => m.t + ph - (Math.min(v, yMax) / yMax) * ph,
    y2: (v) => m.t + ph - (Math.min(v, y2Max) / y2Max) * ph };
  const g = sv("g", { class: "pkv-axes" });
  const yt = intY ? Math.max(1, Math.round(niceStep(yMax, 4))) : niceStep(yMax, 4);
  for (let v = 0; v <= yMax + 1e-9; v += yt) {
    g.append(sv("line", { x1: m.l, x2: W - m.r, y1: f.y(v), y2: f.y(v), class: "pkv-gridline" }),
      sv("text", { x: m.l - 6, y: f.y(v) + 4, "text-anchor": "end" }, +v.toFixed(6)));
  }
  if (y2Max) {
    const t2 = intY2 ? Math.max(1, Math.round(niceStep(y2Max, 4))) : niceStep(y2Max, 4);
    for (let v = 0; v <= y2Max + 1e-9; v += t2) g.append(sv("text", { x: W - m.r + 6, y: f.y2(v) + 4 }, +v.toFixed(6)));
  }
  const xt = Math.max(1, Math.round(niceStep(slots, 14)));
  for (let s = Math.ceil(x0 / xt) * xt; s <= x1; s += xt) {
    g.append(sv("line", { x1: f.x(s), x2: f.x(s), y1: f.bottom, y2: f.bottom + 4, class: "pkv-axis" }),
      sv("text", { x: f.x(s), y: f.bottom + 16, "text-anchor": "middle" }, s));
  }
  g.append(sv("line", { x1: m.l, x2: W - m.r, y1: f.bottom, y2: f.bottom, class: "pkv-axis" }),
    sv("text", { x: m.l + pw / 2, y: H - 3, "text-anchor": "middle", class: "pkv-axis-label" }, xLabel),
    sv("text", { x: 12, y: m.t + ph / 2, "text-anchor": "middle", class: "pkv-axis-label",
                 transform: `rotate(-90 12 ${m.t + ph / 2})` }, yLabel));
  if (y2Max) {
    g.append(sv("text", { x: W - 8, y: m.t + ph / 2, "text-anchor": "middle", class: "pkv-axis-label",
                          transform: `rotate(90 ${W - 8} ${m.t + ph / 2})` }, y2Label));
  }
  svg.append(g);
  return f;
}

// The shown step's marker, and one transparent column per drawn step that names its values
// (a <title> for the browser's tooltip, and the chart's readout line on hover).
function stepMarks(f, steps, shown, textOf, readout) {
  f.svg.append(sv("line", { x1: f.x(shown), x2: f.x(shown), y1: f.top, y2: f.bottom, class: "pkv-cursor" }));
  for (const s of steps) {
    const col = sv("rect", { x: f.x(s) - f.slot / 2, y: f.top, width: f.slot, height: f.bottom - f.top,
                             class: "pkv-hovercol", "data-step": s });
    col.append(sv("title", null, textOf(s)));
    f.svg.append(col);
  }
  readout.textContent = textOf(shown);
  f.svg.addEventListener("mouseover", (e) => {
    const s = e.target.getAttribute && e.target.getAttribute("data-step");
    if (s !== null && s !== undefined) readout.textContent = textOf(Number(s));
  });
  f.svg.addEventListener("mouseleave", () => { readout.textContent = textOf(shown); });
}

function polyline(f, pts, color, series, yOf) {
  const out = [sv("polyline", { points: pts.map(([s, v]) => `${f.x(s)},${yOf(v)}`).join(" "), fill: "none",
                                stroke: color, "stroke-width": 2.5 })];
  for (const [s, v] of pts) out.push(sv("circle", { cx: f.x(s), cy: yOf(v), r: 3, fill: color, "data-series": series, "data-step": s }));
  return out;
}

function legend(items) {   // [[colour, text]]
  const box = el("div", "pkv-legend");
  for (const [color, text] of items) {
    const sw = el("span", "pkv-swatch");
    sw.style.backgroundColor = color;
    const item = el("span", "pkv-legend-item");
    item.append(sw, document.createTextNode(text));
    box.append(item);
  }
  return box;
}

class Player {
  constructor(root) {
    this.root = root;                          // a ShadowRoot in the app, a div in the export
    this.box = root.querySelector(".pkv");     // carries data-step / data-total for tests and benches
    this.q = (role) => root.querySelector(`[data-role="${role}"]`);
    this.run = null;            // the RUNS entry shown
    this.runKey = null;
    this.cursor = 0;
    this.first = 0;
    this.prevShown = null;      // the snapshot drawn before (for enter transitions)
    this.sel = null;            // {type: "block"|"req", id}
    this.playing = false;
    this.timer = null;
    this.seek = null;           // {kind} while "run until" waits for steps, {end: true} for "run to end"
    this.gotoSeq = null;
    this.pendingGoto = null;
    this.holdAt = null;
    this.wantNext = false;      // Step was pressed at the frontier: show the next step when it arrives
    this.component = null;
    this.reported = {};
    this.asks = 0;
    this.reportTimer = null;
    this.pollTimer = null;      // armed while the run is still being recorded and the tab is visible
    this.polls = 0;
    this.addrReq = null; this.addrPos = null; this.addrGroup = 0;
    this.uid = ++PLAYER_UIDS;   // names this player's SVG patterns apart from another player's
    this.bind();
  }

  // The player's words in the run's language, with the page's own words (head.words) over them.
  get L() {
    if (this._lRun !== this.run) {
      this._lRun = this.run;
      const base = LABELS[(this.run && this.run.head.lang) || "en"] || LABELS.en;
      this._L = { ...base, ...((this.run && this.run.head.words) || {}) };
    }
    return this._L;
  }
  get n() { return this.run ? this.run.steps.length : 0; }

  // -- data in -----------------------------------------------------------------------
  receive(data) {
    if (!data || !data.run) return;
    let run = RUNS.get(data.run);
    if (!run) {
      if (!data.head) { this.report("have", { run: data.run, n: -1 }, true); return; }
      run = { head: data.head, snaps: [data.head.initial], steps: [], done: false, vocab: {} };
      RUNS.set(data.run, run);
      if (RUNS.size > MAX_RUNS) RUNS.delete(RUNS.keys().next().value);
      Object.assign(run.vocab, data.head.vocab || {});
    } else if (data.head) {
      Object.assign(run.vocab, data.head.vocab || {});
    }
    if (data.base > run.steps.length) {
      this.report("have", { run: data.run, n: run.steps.length }, true);
    } else {
      for (let i = run.steps.length - data.base; i < (data.steps || []).length; i++) {
        const st = data.steps[i];
        Object.assign(run.vocab, st.vocab || {});
        if (st.prompts) Object.assign(run.head.prompts, st.prompts);
        run.snaps.push(applyDelta(run.snaps[run.snaps.length - 1], st));
        run.steps.push(st);
      }
      run.done = !!data.done;
    }
    if (typeof location !== "undefined") this.path = location.pathname;
    const fresh = this.runKey !== data.run;
    this.run = run;
    this.runKey = data.run;
    this.first = run.head.first || 0;        // 1 for a trace without the state before step 1
    this.urlStep = !!data.url_step;
    this.holdAt = data.hold_at === undefined || data.hold_at === null ? null : data.hold_at - this.first;
    if (fresh) { this.cursor = Math.min(this.cursor, this.n); this.prevShown = null; this.staticLabels(); }
    if (data.goto && data.goto.seq !== this.gotoSeq) {
      this.gotoSeq = data.goto.seq;
      this.pendingGoto = Math.max(0, data.goto.step - this.first);
    }
    if (this.pendingGoto !== null && (this.pendingGoto <= this.n || run.done)) {
      const target = Math.min(this.pendingGoto, this.n);
      this.pendingGoto = null;
      this.stopPlay();
      this.show(target, false);
    } else if (this.wantNext && this.cursor < this.maxStep()) {
      this.notice(null);
      this.show(this.cursor + 1);
    } else {
      this.continueSeek();
      this.draw();
    }
    this.poll();
  }

  // The browser asks for new steps while the run is still being recorded: each ask reruns only the
  // player's part of the page, and nothing is asked once the run is done, while the tab is hidden
  // (a class's background tabs cost the server nothing) or after the player left the page.
  poll() {
    if (this.pollTimer !== null || this.component === null || this.component.static) return;
    const tick = () => {
      this.pollTimer = null;
      const host = this.root.host || this.root;
      if (!this.run || this.run.done || host.isConnected === false || this.left()) return;
      if (typeof document !== "undefined" && document.visibilityState === "hidden") {
        document.addEventListener("visibilitychange", () => this.poll(), { once: true });
        return;
      }
      this.component.setStateValue("poll", { run: this.runKey, n: this.n, ask: ++this.polls });
      this.pollTimer = setTimeout(tick, POLL_MS);
    };
    this.pollTimer = setTimeout(tick, POLL_MS);
  }

  // True once the learner went to another page of the app: this player's reports would rerun a
  // fragment the new page does not have while it loads, so it says nothing more.
  left() {
    if (typeof location === "undefined" || this.path === undefined) return false;
    const going = globalThis.__pkvLeaving;
    return location.pathname !== this.path ||
      (!!going && going.path === this.path && performance.now() - going.t < LEAVING_MS);
  }

  report(name, value, now) {
    if (!this.component || !this.component.setStateValue || this.left()) return;
    if (name === "have") value = { ...value, ask: ++this.asks };   // asking again must be a new value
    const key = JSON.stringify(value);
    // A report also says how many steps this browser holds: Python then sends only what is beyond.
    if (name !== "have" && this.run) value = { ...value, n: this.n };
    if (this.reported[name] === key) return;
    const send = () => {
      if (this.left()) return;
      this.reported[name] = key;
      this.component.setStateValue(name, value);
      if (name === "cursor" && this.urlStep) this.writeUrl(value.step);
    };
    if (name === "cursor" && !now) {
      clearTimeout(this.reportTimer);
      this.reportTimer = setTimeout(send, REPORT_MS);
    } else {
      send();
    }
  }

  // The link keeps the step: written here, at once, as the page would write it on its next full run.
  writeUrl(step) {
    try {
      const u = new URL(window.location.href);
      if (u.searchParams.get("step") === String(step)) return;
      u.searchParams.set("step", String(step));
      window.history.replaceState(window.history.state, "", u.toString());
    } catch (e) { /* a page without a writable location (a sandbox) keeps its URL */ }
  }

  // -- moving ------------------------------------------------------------------------
  maxStep() { return this.holdAt === null ? this.n : Math.min(this.n, this.holdAt); }

  show(k, animate = true) {
    k = Math.max(0, Math.min(k, this.n));
    const before = this.cursor;
    this.wantNext = false;
    this.prevShown = animate && Math.abs(k - before) === 1 && this.run ? this.run.snaps[before] : null;
    this.cursor = k;
    this.draw();
    this.report("cursor", { run: this.runKey, step: k + this.first }, false);
  }

  step() {
    this.notice(null);
    if (this.holdAt !== null && this.cursor >= this.holdAt) { this.notice(this.L.hold); return false; }
    if (this.cursor < this.n) { this.show(this.cursor + 1); return true; }
    if (this.run && !this.run.done) {
      this.notice(this.L.waiting_step);
      this.wantNext = true;
      this.report("want", { run: this.runKey, step: this.cursor + 1 + this.first }, true);
      return false;
    }
    this.notice(this.endText());
    return false;
  }

  endText() {
    const s = this.run.snaps[this.cursor];
    return s.wait.length || s.run.length ? this.L.trace_end : this.L.all_done;
  }

  togglePlay() {
    if (this.playing) { this.stopPlay(); this.draw(); return; }
    this.playing = true;
    this.seek = null;
    const speed = parseFloat(this.q("speed").value) || 1;
    const tick = () => {
      if (!this.playing) return;
      if (this.cursor >= this.n && this.run.done) { this.stopPlay(); this.notice(this.endText()); this.draw(); return; }
      if (this.holdAt !== null && this.cursor >= this.holdAt) { this.stopPlay(); this.notice(this.L.hold); this.draw(); return; }
      if (this.cursor < this.n) this.show(this.cursor + 1); else this.report("want", { run: this.runKey, step: this.cursor + 1 + this.first }, true);
      this.timer = setTimeout(tick, PLAY_MS / speed);
    };
    this.draw();
    tick();
  }

  stopPlay() { this.playing = false; clearTimeout(this.timer); this.timer = null; }

  runUntil(kind) {
    this.stopPlay();
    this.seek = kind ? { kind, from: this.cursor } : { end: true };
    this.continueSeek();
  }

  continueSeek() {
    if (!this.seek || !this.run) return;
    const L = this.L;
    const name = this.seek.kind ? ((KIND_NAMES[this.run.head.lang] || KIND_NAMES.en)[this.seek.kind] || this.seek.kind) : "";
    const limit = this.maxStep();
    if (this.seek.end) {
      if (this.cursor !== limit) this.show(limit, false);
      if (this.run.done || limit < this.n) { this.seek = null; this.notice(this.endText()); }
      else { this.notice(L.waiting_step); this.report("want", { run: this.runKey, step: this.n + 1 + this.first }, true); }
      this.draw();
      return;
    }
    for (let k = this.cursor + 1; k <= limit; k++) {
      if (this.run.steps[k - 1].ev.some((e) => e[0] === this.seek.kind)) {
        this.seek = null;
        this.show(k, false);
        this.notice(L.found(name, k + this.first));
        return;
      }
    }
    if (limit < this.n || this.run.done) {
      this.seek = null;
      this.show(limit, false);
      this.notice(limit < this.n ? L.hold : L.not_found(name));
    } else {
      this.show(limit, false);
      this.notice(L.searching(name));
      this.report("want", { run: this.runKey, step: this.n + 1 + this.first }, true);
    }
  }

  notice(text) {
    const box = this.q("notice");
    box.hidden = !text;
    box.textContent = text || "";
  }

  // -- events in ---------------------------------------------------------------------
  bind() {
    this.root.addEventListener("click", (e) => {
      const t = e.target.closest ? e.target.closest("[data-act],[data-block],[data-req]") : null;
      if (!t) return;
      if (t.dataset.act) { this.act(t.dataset.act); return; }
      const block = t.dataset.block, req = t.dataset.req;
      if (block !== undefined && t.dataset.follow !== "0") this.select({ type: "block", id: Number(block) });
      else if (req !== undefined) this.select({ type: "req", id: req });
    });
    const tl = this.q("timeline");
    tl.addEventListener("input", () => { this.stopPlay(); this.notice(null); this.show(Math.min(Number(tl.value), this.maxStep()), false); });
    const over = this.q("metrics-panel");
    over.addEventListener("toggle", () => { if (this.run && over.open) this.drawOverTime(); });
    this.root.addEventListener("mouseover", (e) => this.hover(e));
    this.root.addEventListener("mouseout", (e) => { if (e.target.closest && e.target.closest("[data-block]")) this.q("tip").hidden = true; });
  }

  act(what) {
    if (!this.run) return;
    if (what === "step") { this.stopPlay(); this.step(); }
    else if (what === "back") { this.stopPlay(); this.notice(null); this.show(this.cursor - 1); }
    else if (what === "home") { this.stopPlay(); this.notice(null); this.show(0, false); }
    else if (what === "last") { this.stopPlay(); this.notice(null); this.show(this.maxStep(), false); }
    else if (what === "play") this.togglePlay();
    else if (what === "end") this.runUntil(null);
    else if (what === "until") this.runUntil(this.q("until").value);
  }

  key(e) {
    const path = e.composedPath ? e.composedPath() : [e.target];
    const t = path[0];
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    if (t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName))) return;
    const acts = { ArrowRight: "step", ArrowLeft: "back", Home: "home", End: "last" };
    if (acts[e.key]) { e.preventDefault(); this.act(acts[e.key]); }
  }

  select(sel) {
    const same = this.sel && sel && this.sel.type === sel.type && this.sel.id === sel.id;
    this.sel = same ? null : sel;
    if (this.sel && this.sel.type === "req") this.addrReq = this.sel.id;
    this.draw();
  }

  // -- drawing -----------------------------------------------------------------------
  staticLabels() {
    const L = this.L;
    for (const h of this.root.querySelectorAll("[data-label]")) h.textContent = L[h.dataset.label] || "";
    for (const b of this.root.querySelectorAll("[data-act]")) {
      if (b.dataset.act !== "home" && L[b.dataset.act]) b.textContent = L[b.dataset.act];
    }
    const sp = this.q("speed");
    sp.replaceChildren(...SPEEDS.map((s) => { const o = el("option", null, L.speed(s)); o.value = String(s); return o; }));
    sp.value = "1";
    const names = KIND_NAMES[this.run.head.lang] || KIND_NAMES.en;
    const kinds = this.run.head.until_kinds || Object.keys(names);
    const un = this.q("until");
    un.replaceChildren(...kinds.map((k) => { const o = el("option", null, `${L.until_prefix}: ${names[k] || k}`); o.value = k; return o; }));
  }

  color(rid) { return (this.run.head.colors || {})[rid] || "#1f77b4"; }

  tokText(ids) {
    if (!this.run.head.decoded) return ids.join(" ");
    const v = this.run.vocab;
    return ids.map((t) => (v[t] !== undefined ? v[t] : `#${t}`)).join("");
  }

  draw() {
    if (!this.run) return;
    const L = this.L, snap = this.run.snaps[this.cursor];
    const st = this.cursor ? this.run.steps[this.cursor - 1] : (this.run.head.step0 || null);
    this.box.dataset.step = String(this.cursor + this.first);
    // When the first picture was drawn, in ms since the page's navigation began (read by the bench).
    if (!this.box.dataset.firstDraw && typeof performance !== "undefined") this.box.dataset.firstDraw = String(Math.round(performance.now()));
    this.box.dataset.total = String(this.n + this.first);
    this.box.dataset.done = String(this.run.done);
    const tl = this.q("timeline");
    tl.max = String(Math.max(this.n, 1)); tl.value = String(this.cursor); tl.disabled = this.n === 0;
    this.q("pos").textContent = L.pos(this.cursor + this.first, this.n + this.first);
    this.q("live").textContent = this.run.done ? "" : L.computing;
    const btn = (a) => this.root.querySelector(`[data-act="${a}"]`);
    btn("back").disabled = this.cursor === 0;
    btn("home").disabled = this.cursor === 0;
    const atEnd = this.cursor >= this.n && this.run.done;
    btn("step").disabled = atEnd || (this.holdAt !== null && this.cursor >= this.holdAt);
    btn("end").disabled = atEnd;
    btn("until").disabled = atEnd;
    btn("play").textContent = this.playing ? L.pause : L.play;
    btn("play").disabled = atEnd && !this.playing;
    const changed = new Set(st ? st.changed : []);
    this.drawNarration(snap, st);
    this.drawMetrics(snap);
    this.drawGrid(snap, changed);
    this.drawEvents(st);
    this.drawQueue(snap);
    this.drawOutputs(snap);
    this.drawTables(snap);
    this.drawChains(snap);
    this.drawAddress(snap);
    this.drawSelected(snap);
    this.drawPanels(snap);
    this.prevShown = null;
  }

  // -- the panels under the pictures: requests table and charts over steps -------------
  // The page names them in head.panels (lesson/panels.py player_panels; an export without it gets
  // the table and "over time"), with head.budget (max_num_batched_tokens) and head.words. Each is
  // drawn from the snapshots and steps held, up to the cursor, on an x axis of all steps held.
  drawPanels(snap) {
    const want = this.run.head.panels || ["requests", "metrics"];
    for (const name of ["requests", "metrics", "budget", "held"]) this.q(`${name}-panel`).hidden = !want.includes(name);
    if (want.includes("requests")) this.drawRequests(snap);
    if (want.includes("metrics") && this.q("metrics-panel").open) this.drawOverTime();
    if (want.includes("budget")) this.drawBudget();
    if (want.includes("held")) this.drawHeld();
  }

  drawRequests(snap) {
    const L = this.L;
    if (!snap.reqs.length) { this.q("requests").replaceChildren(el("div", "pkv-muted", "—")); return; }
    const table = el("table");
    const head = el("tr");
    head.append(...L.req_cols.map((c) => el("th", null, c)));
    const rows = snap.reqs.map((r) => {
      const tr = el("tr");
      tr.dataset.req = r.id;
      const id = el("td"); id.append(this.badge(r.id)); tr.append(id);
      for (const v of [r.st, r.np, r.no, r.nc, r.nk, r.pe, r.pri]) tr.append(el("td", null, v));
      return tr;
    });
    const thead = el("thead"); thead.append(head);
    const tbody = el("tbody"); tbody.append(...rows);
    table.append(thead, tbody);
    this.q("requests").replaceChildren(table);
  }

  stepOf(k) { return this.run.snaps[k].step; }

  drawOverTime() {
    const L = this.L, snaps = this.run.snaps, shown = snaps.slice(0, this.cursor + 1);
    const hit = (s) => 100 * (s.pc.hit_rate || 0);
    const y2Max = Math.max(1, ...snaps.map((s) => Math.max(s.run.length, s.wait.length)));
    const f = stepFrame({ x0: snaps[0].step, x1: snaps[snaps.length - 1].step, yMax: 100, y2Max, intY2: true,
                          xLabel: L.c_step, yLabel: "%", y2Label: L.c_count });
    const w = Math.min(f.slot * 0.36, 18);
    for (const s of shown) {
      f.svg.append(sv("rect", { x: f.x(s.step) - w, y: f.y2(s.run.length), width: w, height: f.bottom - f.y2(s.run.length),
                                fill: "rgba(31,119,180,0.45)", "data-series": "running", "data-step": s.step }),
        sv("rect", { x: f.x(s.step), y: f.y2(s.wait.length), width: w, height: f.bottom - f.y2(s.wait.length),
                     fill: "rgba(255,127,14,0.45)", "data-series": "waiting", "data-step": s.step }));
    }
    f.svg.append(...polyline(f, shown.map((s) => [s.step, 100 * s.usage]), "#d62728", "usage", f.y),
      ...polyline(f, shown.map((s) => [s.step, hit(s)]), "#2ca02c", "hit", f.y));
    const byStep = new Map(shown.map((s) => [s.step, s]));
    const text = (step) => {
      const s = byStep.get(step);
      return `${L.c_step} ${step}: ${L.c_usage} ${Math.round(100 * s.usage)} · ${L.c_hit} ${Math.round(hit(s))} · ` +
        `${L.c_running} ${s.run.length} · ${L.c_waiting} ${s.wait.length}`;
    };
    const readout = el("div", "pkv-readout");
    stepMarks(f, shown.map((s) => s.step), this.stepOf(this.cursor), text, readout);
    this.q("over").replaceChildren(legend([["#d62728", L.c_usage], ["#2ca02c", L.c_hit],
      ["rgba(31,119,180,0.45)", L.c_running], ["rgba(255,127,14,0.45)", L.c_waiting]]), f.svg, readout);
  }

  drawBudget() {
    const L = this.L, steps = this.run.steps, budget = this.run.head.budget;
    const box = this.q("budget");
    if (!steps.length) { box.replaceChildren(el("div", "pkv-muted", "—")); return; }
    const rids = [...new Set(steps.flatMap((st) => Object.keys(st.sched)))];
    const total = (st) => Object.values(st.sched).reduce((a, b) => a + b, 0);
    const yMax = 1.1 * Math.max(budget || 0, 1, ...steps.map(total));
    const f = stepFrame({ x0: this.stepOf(1), x1: this.stepOf(steps.length), yMax, xLabel: L.c_step,
                          yLabel: L.c_tokens, intY: true });
    const hatch = `pkv-hatch-${this.uid}`;
    const defs = sv("defs");
    const pat = sv("pattern", { id: hatch, patternUnits: "userSpaceOnUse", width: 6, height: 6, patternTransform: "rotate(45)" });
    pat.append(sv("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "rgba(255,255,255,0.75)", "stroke-width": 2.5 }));
    defs.append(pat);
    f.svg.append(defs);
    const w = Math.min(f.slot * 0.7, 36);
    for (let k = 1; k <= this.cursor; k++) {
      const st = steps[k - 1], step = this.stepOf(k);
      let acc = 0;
      for (const rid of rids) {
        const n = st.sched[rid] || 0;
        if (!n) continue;
        const a = { x: f.x(step) - w / 2, y: f.y(acc + n), width: w, height: f.y(acc) - f.y(acc + n) };
        const striped = (st.ph || {})[rid] !== "decode";
        f.svg.append(sv("rect", { ...a, fill: this.color(rid), "data-req": rid, "data-step": step,
                                  "data-phase": (st.ph || {})[rid] || "" }));
        if (striped) f.svg.append(sv("rect", { ...a, fill: `url(#${hatch})` }));
        acc += n;
      }
    }
    if (budget) {
      f.svg.append(sv("line", { x1: f.x(this.stepOf(1)) - f.slot / 2, x2: f.x(this.stepOf(steps.length)) + f.slot / 2,
                                y1: f.y(budget), y2: f.y(budget), class: "pkv-budget" }));
    }
    const text = (step) => {
      const st = steps[step - this.stepOf(1)];
      const parts = rids.filter((r) => st.sched[r]).map((r) => `${r} ${st.sched[r]} (${L[st.ph && st.ph[r]] || (st.ph && st.ph[r]) || "?"})`);
      return `${L.c_step} ${step}: ${parts.join(", ") || "—"} · ${total(st)}${budget ? ` / ${budget}` : ""}`;
    };
    const readout = el("div", "pkv-readout");
    const drawn = Array.from({ length: this.cursor }, (_, i) => this.stepOf(i + 1));
    if (this.cursor) stepMarks(f, drawn, this.stepOf(this.cursor), text, readout);
    const items = rids.map((r) => [this.color(r), r]);
    if (budget) items.push(["#333", `${L.c_budget} = ${budget}`]);
    box.replaceChildren(legend(items), f.svg, el("p", "pkv-caption", L.c_striped), readout);
  }

  drawHeld() {
    const L = this.L, snaps = this.run.snaps, shown = snaps.slice(0, this.cursor + 1);
    const nulls = new Set(snaps[0].blocks.filter((b) => b.z).map((b) => b.i));
    const held = (r) => new Set(r.bt.flat().filter((b) => !nulls.has(b))).size;
    const rids = [...new Set(snaps.flatMap((s) => s.reqs.map((r) => r.id)))];
    const yMax = Math.max(1, ...snaps.flatMap((s) => s.reqs.map(held))) * 1.1;
    const f = stepFrame({ x0: snaps[0].step, x1: snaps[snaps.length - 1].step, yMax, intY: true,
                          xLabel: L.c_step, yLabel: L.c_blocks });
    const lines = new Map(rids.map((r) => [r, []]));
    for (const s of shown) for (const r of s.reqs) lines.get(r.id).push([s.step, held(r)]);
    for (const [rid, pts] of lines) if (pts.length) f.svg.append(...polyline(f, pts, this.color(rid), rid, f.y));
    const byStep = new Map(shown.map((s) => [s.step, s]));
    const text = (step) => `${L.c_step} ${step}: ` + (byStep.get(step).reqs.map((r) => `${r.id} ${held(r)}`).join(", ") || "—");
    const readout = el("div", "pkv-readout");
    stepMarks(f, shown.map((s) => s.step), this.stepOf(this.cursor), text, readout);
    this.q("held").replaceChildren(legend(rids.map((r) => [this.color(r), r])), f.svg, readout);
  }

  drawNarration(snap, st) {
    const box = this.q("narration");
    const h = this.run.head;
    const texts = st ? st.nar.slice() : (h.intro ? [h.intro] : []);
    if (this.cursor === this.n && this.run.done && this.cursor > 0 && h.outro) texts.push("🏁 " + h.outro);
    const items = texts.map((t) => el("div", null, "💡 " + t));
    if (!items.length && st) items.push(el("div", "pkv-sum", st.sum));
    box.replaceChildren(...items);
  }

  drawMetrics(snap) {
    const L = this.L;
    const cells = [[L.m_step, snap.step], [L.m_free, snap.free], [L.m_usage, `${Math.round(100 * snap.usage)}%`],
      [L.m_hit, this.hitText(snap.pc)], [L.m_rw, `${snap.run.length} / ${snap.wait.length}`]];
    this.q("metrics").replaceChildren(...cells.map(([k, v]) => {
      const c = el("div", "pkv-metric"); c.append(el("small", null, k), el("b", null, v)); return c;
    }));
  }

  hitText(pc) {
    // vLLM's PrefixCacheStats: hit tokens / queried tokens at admission; resumed requests apart (⟲).
    const resumed = pc.preempted_requests ? ` ⟲ ${pc.preempted_hits}/${pc.preempted_queries}` : "";
    return `${Math.round(100 * (pc.hit_rate || 0))}% · ${pc.hits || 0}/${pc.queries || 0}${resumed}`;
  }

  blockClass(b, base) {
    let cls = base;
    if (b.z) cls += " null";
    else if (b.o.length) cls += " used";
    else if (b.h) cls += " cached";
    if (b.r > 1) cls += " shared";
    return cls;
  }

  paintOwners(node, b) {
    if (b.z || !b.o.length) return;
    const cols = b.o.map((o) => this.color(o));
    node.style.background = cols.length === 1 ? cols[0]
      : `linear-gradient(135deg, ${cols.map((c, i) => `${c} ${(100 * i) / cols.length}% ${(100 * (i + 1)) / cols.length}%`).join(", ")})`;
  }

  selState(b) {
    if (!this.sel) return "";
    if (this.sel.type === "block") return b.i === this.sel.id ? " pkv-sel" : "";
    return b.o.includes(this.sel.id) ? " pkv-sel" : " pkv-dim";
  }

  drawGrid(snap, changed) {
    const nodes = snap.blocks.map((b) => {
      const d = el("div", this.blockClass(b, "pkv-block") + (changed.has(b.i) ? " changed" : "") + this.selState(b));
      d.dataset.block = String(b.i);
      d.dataset.ref = String(b.r);
      d.dataset.owners = b.o.join(",");
      this.paintOwners(d, b);
      d.append(el("span", "pkv-id", b.z ? "∅" : b.i), el("span", "pkv-ref", b.z ? this.L.null_block : `ref ${b.r}`));
      return d;
    });
    this.q("grid").replaceChildren(...nodes);
  }

  drawEvents(st) {
    const box = this.q("events");
    if (!st) { box.replaceChildren(el("li", "pkv-muted", this.L.events_none)); return; }
    box.replaceChildren(...st.ev.map(([kind, rid, blocks, text]) => {
      const li = el("li", null, text);
      li.dataset.kind = kind;
      if (rid !== null && rid !== undefined) { li.style.borderLeft = `4px solid ${this.color(rid)}`; li.style.paddingLeft = "4px"; }
      if (this.sel && ((this.sel.type === "req" && this.sel.id === rid) || (this.sel.type === "block" && blocks.includes(this.sel.id)))) li.className = "pkv-sel-ev";
      return li;
    }));
  }

  chip(b, enterCls) {
    const c = el("span", this.blockClass(b, "pkv-chip") + this.selState(b) + (enterCls ? " " + enterCls : ""), b.z ? "∅" : b.i);
    c.dataset.block = String(b.i);
    this.paintOwners(c, b);
    return c;
  }

  drawQueue(snap) {
    const prevQ = this.prevShown ? new Set(this.prevShown.queue) : null;
    const items = [el("span", "pkv-end", this.L.head + " →")];
    for (const id of snap.queue) items.push(this.chip(snap.blocks[id], prevQ && !prevQ.has(id) ? "pkv-enter-queue" : ""));
    items.push(el("span", "pkv-end", "→ " + this.L.tail));
    this.q("queue").replaceChildren(...items);
  }

  badge(rid) {
    const b = el("span", "pkv-badge" + (this.sel && this.sel.type === "req" && this.sel.id === rid ? " pkv-sel" : ""), rid);
    b.style.background = this.color(rid);
    b.dataset.req = rid;
    return b;
  }

  drawOutputs(snap) {
    const rows = snap.reqs.map((r) => {
      const d = el("div");
      d.dataset.req = r.id;
      d.append(this.badge(r.id), el("code", null, r.st), el("span", "pkv-muted", ` · ${r.no} tok — `),
        el("span", "pkv-text", r.tx || (r.ot.length ? this.tokText(r.ot) : "…")));
      return d;
    });
    this.q("outputs").replaceChildren(...(rows.length ? rows : [el("div", "pkv-muted", "—")]));
  }

  drawTables(snap) {
    const groups = this.run.head.groups || [{}];
    const prevHeld = new Set();
    if (this.prevShown) for (const r of this.prevShown.reqs) for (const t of r.bt) for (const id of t) prevHeld.add(`${r.id}:${id}`);
    const out = [];
    groups.forEach((g, gi) => {
      const reqs = snap.reqs.filter((r) => r.bt[gi] && r.bt[gi].length);
      if (groups.length > 1) out.push(el("div", "pkv-muted", `${this.L.group} ${gi}: ${g.kind || ""}${g.sliding_window ? ` (window ${g.sliding_window})` : ""}`));
      const table = el("table");
      table.dataset.group = String(gi);
      for (const r of reqs) {
        const tr = el("tr");
        tr.dataset.req = r.id;
        const head = el("td"); head.append(this.badge(r.id)); tr.append(head);
        r.bt[gi].forEach((id, li) => {
          const td = el("td");
          const enter = this.prevShown && !prevHeld.has(`${r.id}:${id}`) ? "pkv-enter-table" : "";
          td.append(this.chip(snap.blocks[id], enter), el("div", "pkv-logical", `L${li}`));
          tr.append(td);
        });
        table.append(tr);
      }
      out.push(reqs.length ? table : el("div", "pkv-muted", this.L.no_tables));
    });
    this.q("tables").replaceChildren(...out);
  }

  drawChains(snap) {
    const L = this.L;
    const cached = snap.blocks.filter((b) => b.h);
    if (!cached.length) { this.q("chains").replaceChildren(el("div", "pkv-muted", L.no_chains)); return; }
    const key = (h, g) => `${h}@${g}`;
    const present = new Set(cached.map((b) => key(b.h, b.g)));
    const kids = new Map();
    for (const b of cached) {
      const p = b.p === null || b.p === undefined ? "ROOT" : (present.has(key(b.p, b.g)) ? key(b.p, b.g) : "ORPHAN");
      if (!kids.has(p)) kids.set(p, []);
      kids.get(p).push(b);
    }
    const node = (b, depth) => {
      const li = el("li");
      const row = el("span", "pkv-node" + this.selState(b));
      row.dataset.block = String(b.i);
      row.append(this.chip(b, ""), el("code", null, "#" + b.h.slice(0, 8)), el("span", "pkv-text", `«${this.tokText(b.k)}»`));
      li.append(row);
      const ch = depth < 64 ? kids.get(key(b.h, b.g)) : null;
      if (ch && ch.length) { const ul = el("ul"); ul.append(...ch.map((c) => node(c, depth + 1))); li.append(ul); }
      return li;
    };
    const top = el("ul");
    for (const [rootKey, label] of [["ROOT", L.none_hash], ["ORPHAN", L.orphans]]) {
      const ch = kids.get(rootKey);
      if (!ch) continue;
      const li = el("li"); li.append(el("code", null, label));
      const ul = el("ul"); ul.append(...ch.map((c) => node(c, 0))); li.append(ul);
      top.append(li);
    }
    this.q("chains").replaceChildren(top);
  }

  drawAddress(snap) {
    const L = this.L, box = this.q("address");
    const reqs = snap.reqs.filter((r) => r.bt.some((t) => t.length));
    if (!reqs.length) { box.replaceChildren(el("div", "pkv-muted", L.address_none)); return; }
    if (!reqs.some((r) => r.id === this.addrReq)) this.addrReq = reqs[0].id;
    const r = reqs.find((x) => x.id === this.addrReq);
    const prompt = this.run.head.prompts[r.id] || [];
    const toks = prompt.concat(r.ot);
    const n = Math.max(1, toks.length);
    const pos = this.addrPos === null ? Math.max(0, Math.min(n - 1, r.nc - 1)) : Math.min(this.addrPos, n - 1);
    const bs = this.run.head.block_size;
    const sel = el("select", "pkv-select");
    sel.replaceChildren(...reqs.map((x) => { const o = el("option", null, x.id); o.value = x.id; return o; }));
    sel.value = r.id;
    sel.addEventListener("change", () => { this.addrReq = sel.value; this.addrPos = null; this.draw(); });
    const range = el("input");
    range.type = "range"; range.min = "0"; range.max = String(n - 1); range.value = String(pos);
    range.addEventListener("input", () => { this.addrPos = Number(range.value); this.draw(); });
    const l1 = el("label", null, L.req + " "); l1.append(sel);
    const l2 = el("label", null, `${L.pos_label} ${pos} `); l2.append(range);
    const parts = [l1, l2];
    const nulls = new Set(snap.blocks.filter((b) => b.z).map((b) => b.i));
    const lb = Math.floor(pos / bs), off = pos % bs;
    r.bt.forEach((table, gi) => {
      const pb = lb < table.length ? table[lb] : null;
      const phys = pb === null ? "—" : (nulls.has(pb) ? "∅ (null)" : String(pb));
      const slot = pb === null || nulls.has(pb) ? "—" : String(pb * bs + off);
      const tok = pos < toks.length ? this.tokText([toks[pos]]) : "?";
      const gl = r.bt.length > 1 ? ` [${L.group} ${gi}]` : "";
      const line = el("div", "pkv-addr-line",
        `token ${pos} “${tok}”${gl}: logical block = ${pos} // ${bs} = ${lb}, offset = ${pos} % ${bs} = ${off} → ` +
        `physical block ${phys} → slot ${phys} × ${bs} + ${off} = ${slot}` + (pos < r.nc ? "" : " " + L.not_computed));
      const row = el("div", "pkv-addr-row");
      table.forEach((id, i) => {
        const c = this.chip(snap.blocks[id], i === lb ? "pkv-target" : "");
        c.title = `L${i} → ${id}`;
        row.append(c);
      });
      parts.push(line, row);
    });
    box.replaceChildren(...parts);
  }

  blockLines(snap, b) {
    const L = this.L;
    const qpos = snap.queue.indexOf(b.i);
    return [
      `${L.block} ${b.i}${b.z ? ` (${L.null_block})` : ""}`,
      `${L.ref}: ${b.r} · ${L.owners}: ${b.o.length ? b.o.join(", ") : "—"}`,
      `${L.hash}: ${b.h || "—"}${b.h && (this.run.head.groups || []).length > 1 ? ` (${L.group} ${b.g})` : ""}`
        + (b.h && b.hn ? ` · block_hash_num_tokens: ${b.hn}` : ""),
      `${L.parent}: ${b.h ? (b.p || "NONE_HASH") : "—"}`,
      `${L.tokens}: ${b.k.length}${this.run.head.decoded ? "" : " " + L.decoded_ids}`,
      `${L.text}: «${this.tokText(b.k)}»`,
      `${L.qpos}: ${qpos < 0 ? L.not_free : `${qpos} (${L.head} = 0)`}`,
    ];
  }

  hover(e) {
    const t = e.target.closest ? e.target.closest("[data-block]") : null;
    const tip = this.q("tip");
    if (!t || !this.run) { return; }
    const snap = this.run.snaps[this.cursor];
    const b = snap.blocks[Number(t.dataset.block)];
    if (!b) return;
    tip.textContent = this.blockLines(snap, b).join("\n");
    const rb = this.box.getBoundingClientRect(), rt = t.getBoundingClientRect();
    tip.style.left = `${Math.max(0, rt.left - rb.left)}px`;
    tip.style.top = `${rt.bottom - rb.top + 4}px`;
    tip.hidden = false;
  }

  drawSelected(snap) {
    const panel = this.q("selected-panel"), box = this.q("selected");
    if (!this.sel) { panel.hidden = true; return; }
    panel.hidden = false;
    const L = this.L;
    if (this.sel.type === "block") {
      const b = snap.blocks[this.sel.id];
      box.textContent = b ? this.blockLines(snap, b).join("\n") : "";
      return;
    }
    const r = snap.reqs.find((x) => x.id === this.sel.id);
    if (!r) { box.textContent = `${L.req} ${this.sel.id}: —`; return; }
    box.textContent = [
      `${L.req} ${r.id} · ${L.status}: ${r.st}`,
      `${L.prompt}: ${r.np} tok «${this.tokText(this.run.head.prompts[r.id] || [])}»`,
      `${L.computed}: ${r.nc} · ${L.cached}: ${r.nk} · ${L.preemptions}: ${r.pe}`,
      ...r.bt.map((t, gi) => `${L.tables} [${gi}]: ${t.join(", ") || "—"}`),
      `${L.outputs}: ${r.tx || this.tokText(r.ot)}`,
    ].join("\n");
  }
}

// One document listener for the page, even if this module is evaluated again: it steps the
// player mounted last, so ←/→ work whenever the page (not a text field) has focus.
function onKey(e) {
  const p = globalThis.__pkvActive;
  if (p && p.root.isConnected !== false) p.key(e);
}

// A click on a link to another page (the app's sidebar): the URL changes only once the server
// answers, and a report sent meanwhile would rerun a fragment while the next page loads.
function onLinkClick(e) {
  const a = e.target && e.target.closest ? e.target.closest("a[href]") : null;
  if (!a) return;
  const to = new URL(a.href, location.href);
  if (to.origin === location.origin && to.pathname !== location.pathname) {
    globalThis.__pkvLeaving = { path: location.pathname, t: performance.now() };
  }
}

export default function mountPlayer(component) {
  const { data, parentElement } = component;
  const root = parentElement.querySelector(".pkv") ? parentElement : null;
  if (!root) return;
  let p = PLAYERS.get(parentElement);
  if (!p) {
    p = new Player(parentElement);
    PLAYERS.set(parentElement, p);
  }
  p.component = component;
  globalThis.__pkvActive = p;
  if (!globalThis.__pkvKeys) {
    globalThis.__pkvKeys = true;
    document.addEventListener("keydown", onKey);
    document.addEventListener("click", onLinkClick, true);
  }
  p.receive(data);
}
