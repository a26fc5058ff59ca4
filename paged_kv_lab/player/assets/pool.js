// The large-pool player: a replayed trace's recorded steps on a pool of thousands of blocks.
// The server sends keyframes plus deltas (recording/pool_frames.py, encoded by
// player/pool_payload.py); the browser keeps one state (typed arrays, one slot per block) and
// moves it: one delta forward, or the nearest keyframe and the deltas after it for a jump.
// The block grid is a canvas (one cell per block, zoomable to a range), the free queue a summary
// (its two ends and counts by kind), the tables paged. Every string from the run is inserted with
// textContent, never as HTML.

import { addStrings, el, fmt, wordsFor } from "./text.js";
import { joinRoom } from "./room.js";

// One colour per request (as player/payload.py's PALETTE), chosen by a hash of its id, so a
// request keeps its colour whichever step the player opened at.
const PALETTE = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e", "#17becf", "#e377c2",
  "#8c564b", "#1b9e77", "#7570b3", "#e7298a", "#66a61e"];
const FREE = "#e6e6e6", CACHED = "#f7e08a", NULLC = "#303030";
const PLAY_MS = 400;
const REQ_PAGE = 20, CHIP_PAGE = 256, MAX_EVENTS = 200, MAX_CELL = 28, STRIP_H = 300;
const RUNS = new Map();
const PLAYERS = new WeakMap();

const PIXELS = new Map();
// "#rrggbb" as one canvas pixel (RGBA bytes, read as a little-endian 32-bit word); dimmed: 25%
// of the colour over white.
function pixel(hex, dim) {
  const key = dim ? "d" + hex : hex;
  let px = PIXELS.get(key);
  if (px === undefined) {
    let [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
    if (dim) [r, g, b] = [r, g, b].map((c) => Math.round(255 - (255 - c) * 0.25));
    px = ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0;
    PIXELS.set(key, px);
  }
  return px;
}

const COLORS = new Map();
function colorOf(rid) {
  let c = COLORS.get(rid);
  if (c === undefined) {
    let h = 0;
    for (let i = 0; i < rid.length; i++) h = (h * 31 + rid.charCodeAt(i)) | 0;
    c = PALETTE[Math.abs(h) % PALETTE.length];
    if (COLORS.size > 100000) COLORS.clear();
    COLORS.set(rid, c);
  }
  return c;
}

// The state after one frame: per block ref_cnt, hash, parent, tokens held, owners, its KV cache
// group (-1: none, or the groups share one block size and the frames name none); the requests.
class PoolState {
  constructor(n) {
    this.n = n;
    this.ref = new Int32Array(n);
    this.ntok = new Int32Array(n);
    this.grp = new Int16Array(n).fill(-1);
    this.hash = new Array(n).fill(null);
    this.parent = new Array(n).fill(null);
    this.owners = new Array(n).fill(null);
    this.reqs = new Map();
    this.at = -1;
  }

  reset() {
    this.ref.fill(0); this.ntok.fill(0); this.grp.fill(-1); this.hash.fill(null); this.parent.fill(null); this.owners.fill(null);
    this.reqs = new Map();
  }

  apply(f, i) {
    if (f.k) this.reset();
    const bg = f.bg;   // each listed block's group, only where the groups' block sizes differ
    f.b.forEach((b, j) => {
      const [id, ref, nt, own] = b;
      if (id < 0 || id >= this.n) return;
      this.ref[id] = ref; this.ntok[id] = nt;
      const g = bg ? bg[j] : null;
      this.grp[id] = g === null || g === undefined ? -1 : g;
      this.owners[id] = own && own.length ? own : null;
      if (b.length > 4) { this.hash[id] = b[4]; this.parent[id] = b[5]; }
    });
    for (const rid of f.g || []) this.reqs.delete(rid);
    for (const [id, st, np, no, nc, nk, pe, bt] of f.r) {
      const old = this.reqs.get(id);
      const tables = bt.map(([keep, ...ids], gi) => (keep && old ? old.bt[gi].slice(0, keep) : []).concat(ids));
      this.reqs.set(id, { id, st, np, no, nc, nk, pe, bt: tables });
    }
    this.at = i;
  }
}

class PoolPlayer {
  constructor(root) {
    this.root = root;
    this.box = root.querySelector(".pkv");
    this.q = (role) => root.querySelector(`[data-role="${role}"]`);
    this.run = null;
    this.cursor = 0;
    this.sel = null;
    this.lo = 0; this.hi = 0;
    this.reqPage = 0; this.chipPage = 0;
    this.playing = false; this.timer = null;
    this.gotoSeq = null;
    this.layout = null;
    this.first = 0;             // a room's step is the frame's index in the window
    this.link = null;           // the RoomLink while this player is in a room (room.js)
    this.bind();
  }

  get L() { return wordsFor((this.run && this.run.head.lang) || "en"); }
  get n() { return this.run ? this.run.frames.length : 0; }

  // Each KV cache group's own block size, as the step player reads it (panels.js): the head's
  // groups come, each with its block_size, only where the groups' sizes differ (head.block_size
  // is then the scheduler's, their least common multiple).
  sizesDiffer() { return (this.run.head.groups || []).some((g) => g.block_size); }

  groupBlockSize(gi) {
    const g = (this.run.head.groups || [])[gi];
    return (g && g.block_size) || this.run.head.block_size;
  }

  groupLabel(gi) {
    const L = this.L, g = (this.run.head.groups || [])[gi] || {};
    const win = g.sliding_window ? ` (${L.window} ${g.sliding_window})` : "";
    return `${L.group} ${gi}: ${g.kind || ""}${win} · ${fmt(L.group_block_size, { block_size: this.groupBlockSize(gi) })}`;
  }

  // The frames come once per window; afterwards the page sends only the run's name and where to
  // go. The browser says which window it holds ("have"), or that it lost it (asks again). A window
  // whose head names the one shown as the one it extends (the page's first glimpse of a moment,
  // then the whole window around it) keeps the step shown, the zoom and the selection.
  receive(data) {
    if (!data || !data.run) return;
    addStrings(data.strings);
    let run = RUNS.get(data.run);
    if (!run && data.head) {
      run = { head: data.head, frames: data.frames || [] };
      run.keys = run.frames.map((f, i) => (f.k ? i : -1)).filter((i) => i >= 0);
      run.state = new PoolState(run.head.num_gpu_blocks);
      RUNS.set(data.run, run);
      if (RUNS.size > 3) RUNS.delete(RUNS.keys().next().value);
    }
    if (this.component && this.component.setStateValue) {
      this.asks = (this.asks || 0) + 1;
      const have = run ? { run: data.run } : { run: null, ask: this.asks };
      const said = JSON.stringify(have), component = this.component;
      // told after the step is drawn: telling the page starts its rerun, and the browser's
      // work for it would come before the drawing
      if (said !== this.told) { this.told = said; setTimeout(() => component.setStateValue("have", have), 0); }
    }
    if (!run) return;
    const fresh = this.run !== run;
    const grown = fresh && this.run && run.head.extends && RUNS.get(run.head.extends) === this.run;
    const at = grown ? this.run.frames[this.cursor].s : null;
    this.run = run;
    if (grown) {
      const i = run.frames.findIndex((f) => f.s === at);
      this.cursor = i >= 0 ? i : Math.max(0, Math.min(run.head.start || 0, this.n - 1));
    } else if (fresh) {
      this.lo = 0; this.hi = run.head.num_gpu_blocks; this.sel = null; this.reqPage = 0;
      this.staticLabels();
      this.cursor = Math.max(0, Math.min(run.head.start || 0, this.n - 1));
    }
    if (data.goto && data.goto.seq !== this.gotoSeq) {
      this.gotoSeq = data.goto.seq;
      this.cursor = Math.max(0, Math.min(data.goto.index, this.n - 1));
      if (data.goto.request) this.sel = { type: "req", id: data.goto.request };
    }
    this.draw();
    joinRoom(this, data.room);
  }

  // The state at frame i: one delta from the frame before, else the keyframe at or before i.
  moveTo(i) {
    const s = this.run.state, frames = this.run.frames;
    let k = 0;
    for (const j of this.run.keys) { if (j <= i) k = j; else break; }
    let from = s.at;
    if (from > i || from < k) { s.apply(frames[k], k); from = k; }
    for (let j = from + 1; j <= i; j++) s.apply(frames[j], j);
    return s;
  }

  bind() {
    this.root.addEventListener("click", (e) => {
      const t = e.target.closest ? e.target.closest("[data-act],[data-block],[data-req],[data-page]") : null;
      if (!t) return;
      if (t.dataset.act) { this.act(t.dataset.act); return; }
      if (t.dataset.page) { this.page(t.dataset.page); return; }
      if (t.dataset.block !== undefined) this.select({ type: "block", id: Number(t.dataset.block) });
      else if (t.dataset.req !== undefined) this.select({ type: "req", id: t.dataset.req });
    });
    const tl = this.q("timeline");
    tl.addEventListener("input", () => { if (this.link) this.link.userMove(); this.stopPlay(); this.show(Number(tl.value)); });
    const cv = this.q("strip");
    cv.addEventListener("mousemove", (e) => this.hover(e));
    cv.addEventListener("mouseleave", () => { this.q("tip").hidden = true; });
    cv.addEventListener("click", (e) => {
      const id = this.blockAt(e);
      if (id !== null) this.select({ type: "block", id });
    });
    this.root.addEventListener("mouseover", (e) => {
      const t = e.target.closest ? e.target.closest("[data-block]") : null;
      if (t && this.run) this.tipFor(Number(t.dataset.block), t.getBoundingClientRect());
    });
    this.root.addEventListener("mouseout", (e) => {
      if (e.target.closest && e.target.closest("[data-block]")) this.q("tip").hidden = true;
    });
  }

  act(what) {
    if (!this.run) return;
    if (this.link && ["step", "back", "home", "last", "play"].includes(what)) this.link.userMove();
    if (what === "step") { this.stopPlay(); this.show(this.cursor + 1); }
    else if (what === "back") { this.stopPlay(); this.show(this.cursor - 1); }
    else if (what === "home") { this.stopPlay(); this.show(0); }
    else if (what === "last") { this.stopPlay(); this.show(this.n - 1); }
    else if (what === "play") this.togglePlay();
    else if (what === "zoom") {
      const N = this.run.head.num_gpu_blocks;
      const lo = Math.max(0, Math.min(N - 1, Math.floor(Number(this.q("zlo").value) || 0)));
      const hi = Math.max(lo + 1, Math.min(N, Math.floor(Number(this.q("zhi").value) || N)));
      this.lo = lo; this.hi = hi; this.draw();
    } else if (what === "zoomsel") this.zoomToSelection();
    else if (what === "whole") { this.lo = 0; this.hi = this.run.head.num_gpu_blocks; this.draw(); }
  }

  zoomToSelection() {
    const N = this.run.head.num_gpu_blocks, s = this.moveTo(this.cursor);
    let ids = [];
    if (this.sel && this.sel.type === "block") ids = [this.sel.id];
    else if (this.sel && this.sel.type === "req") {
      const r = s.reqs.get(this.sel.id);
      if (r) ids = r.bt.flat();
    }
    if (!ids.length) { this.notice(this.L.pool_zoom_nothing); return; }
    const a = Math.min(...ids), b = Math.max(...ids) + 1, pad = Math.max(8, Math.round((b - a) * 0.1));
    this.lo = Math.max(0, a - pad); this.hi = Math.min(N, Math.max(b + pad, this.lo + 64));
    this.notice(null);
    this.draw();
  }

  page(what) {
    const [which, dir] = what.split(":");
    if (which === "req") this.reqPage = Math.max(0, this.reqPage + Number(dir));
    else this.chipPage = Math.max(0, this.chipPage + Number(dir));
    this.draw();
  }

  key(e) {
    const t = (e.composedPath ? e.composedPath() : [e.target])[0];
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    if (t && (t.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(t.tagName))) return;
    const acts = { ArrowRight: "step", ArrowLeft: "back", Home: "home", End: "last" };
    if ((e.key === "f" || e.key === "F") && this.link) { e.preventDefault(); this.link.snapBack(); return; }
    if (acts[e.key]) { e.preventDefault(); this.act(acts[e.key]); }
  }

  select(sel) {
    const same = this.sel && this.sel.type === sel.type && this.sel.id === sel.id;
    this.sel = same ? null : sel;
    this.chipPage = 0;
    this.draw();
  }

  show(i) {
    this.cursor = Math.max(0, Math.min(i, this.n - 1));
    this.notice(null);
    this.draw();
    if (this.link) this.link.moved(this.cursor);
  }

  togglePlay() {
    if (this.playing) { this.stopPlay(); this.draw(); return; }
    this.playing = true;
    const tick = () => {
      if (!this.playing) return;
      if (this.cursor >= this.n - 1) { this.stopPlay(); this.draw(); return; }
      this.show(this.cursor + 1);
      this.timer = setTimeout(tick, PLAY_MS);
    };
    this.draw();
    this.timer = setTimeout(tick, PLAY_MS);
  }

  stopPlay() { this.playing = false; clearTimeout(this.timer); this.timer = null; }

  notice(text) { const b = this.q("notice"); b.hidden = !text; b.textContent = text || ""; }

  staticLabels() {
    const L = this.L;
    const labels = { pool_strip: L.pool_strip, pool_from: L.pool_from, pool_to: L.pool_to,
      pool_strip_caption: L.pool_strip_caption, pool_queue_caption: L.pool_queue_caption,
      queue: L.queue, events: L.events, selected: L.selected, requests: L.requests };
    for (const h of this.root.querySelectorAll("[data-label]")) h.textContent = labels[h.dataset.label] || "";
    const acts = { back: L.back, step: L.step, play: L.play, zoom: L.pool_zoom, zoomsel: L.pool_zoom_sel, whole: L.pool_whole };
    for (const b of this.root.querySelectorAll("[data-act]")) if (acts[b.dataset.act]) b.textContent = acts[b.dataset.act];
    const legend = [[FREE, L.pool_free], [CACHED, L.pool_cached], [NULLC, L.null_block], ["#1f77b4", L.pool_used]];
    const items = legend.map(([c, t]) => {
      const s = el("span", "pkv-legend-item"), sw = el("span", "pkv-swatch"); sw.style.background = c;
      s.append(sw, el("span", null, t)); return s;
    });
    // where the groups' block sizes differ, each group with its own
    if (this.sizesDiffer()) {
      this.run.head.groups.forEach((g, gi) => {
        const s = el("span", "pkv-legend-item", this.groupLabel(gi));
        s.dataset.group = String(gi); s.dataset.blockSize = String(this.groupBlockSize(gi));
        items.push(s);
      });
    }
    this.q("legend").replaceChildren(...items);
  }

  // -- drawing ---------------------------------------------------------------------------
  draw() {
    if (!this.run || !this.n) return;
    const t0 = performance.now();
    const L = this.L, f = this.run.frames[this.cursor], s = this.moveTo(this.cursor);
    this.box.dataset.step = String(f.s);
    this.box.dataset.index = String(this.cursor);
    this.box.dataset.total = String(this.n);
    const tl = this.q("timeline");
    tl.max = String(Math.max(this.n - 1, 0)); tl.value = String(this.cursor);
    const first = this.run.frames[0].s, last = this.run.frames[this.n - 1].s;
    this.q("pos").textContent = fmt(L.pool_pos, { step: f.s, first, last });
    const btn = (a) => this.root.querySelector(`[data-act="${a}"]`);
    btn("back").disabled = btn("home").disabled = this.cursor === 0;
    btn("step").disabled = btn("last").disabled = this.cursor >= this.n - 1;
    btn("play").textContent = this.playing ? L.pause : L.play;
    this.q("narration").replaceChildren(el("div", "pkv-sum", f.sum || ""));
    this.drawMetrics(f);
    this.drawStrip(s, f);
    this.drawQueue(s, f);
    this.drawEvents(f);
    this.drawRequests(s, f);
    this.drawSelected(s, f);
    this.box.dataset.paintMs = (performance.now() - t0).toFixed(2);
  }

  drawMetrics(f) {
    const L = this.L, pc = f.pc || {};
    const cells = [[L.m_step, f.s], [L.m_free, f.q[2]], [L.m_usage, `${Math.round(100 * f.us)}%`],
      [L.m_hit, `${Math.round(100 * (pc.hit_rate || 0))}% · ${pc.hits || 0}/${pc.queries || 0}`],
      [L.m_rw, `${f.u.length} / ${f.w.length}`]];
    this.q("metrics").replaceChildren(...cells.map(([k, v]) => {
      const c = el("div", "pkv-metric"); c.append(el("small", null, k), el("b", null, v)); return c;
    }));
  }

  cellColor(s, id) {
    if (id === 0) return NULLC;
    const own = s.owners[id];
    if (own) return colorOf(own[0]);
    return s.hash[id] ? CACHED : FREE;
  }

  drawStrip(s, f) {
    const cv = this.q("strip"), L = this.L;
    const lo = this.lo, hi = this.hi, count = hi - lo;
    const width = Math.max(240, Math.floor(cv.parentElement.clientWidth || 960));
    const cell = Math.max(2, Math.min(MAX_CELL, Math.floor(Math.sqrt((width * STRIP_H) / count))));
    const cols = Math.max(1, Math.floor(width / cell)), rows = Math.ceil(count / cols);
    const dpr = (typeof window !== "undefined" && window.devicePixelRatio) || 1;
    const w = Math.round(cols * cell * dpr), h = Math.round(rows * cell * dpr);
    if (cv.width !== w || cv.height !== h) {   // resizing reallocates the canvas: only on a change
      cv.width = w; cv.height = h;
      cv.style.width = `${cols * cell}px`; cv.style.height = `${rows * cell}px`;
    }
    this.layout = { lo, hi, cell, cols };
    Object.assign(cv.dataset, { lo: String(lo), hi: String(hi), cell: String(cell), cols: String(cols) });
    const g = cv.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    const gap = cell >= 6 ? 1 : 0;
    const changed = new Set();
    for (const e of f.ev) for (const b of e[2]) changed.add(b);
    let selReq = null, selBlock = null;
    if (this.sel && this.sel.type === "req") selReq = this.sel.id;
    if (this.sel && this.sel.type === "block") selBlock = this.sel.id;
    // Cells are written as pixels into one ImageData and put once: ten thousand fillRect calls
    // cost more than the picture. A dimmed cell is its colour over white at 25%.
    const W = cv.width, H = cv.height;
    if (!this.img || this.img.width !== W || this.img.height !== H) this.img = g.createImageData(W, H);
    const img = this.img, buf = new Uint32Array(img.data.buffer);
    buf.fill(0);
    const side = Math.max(1, Math.floor((cell - gap) * dpr)), bar = Math.max(1, Math.floor(((cell >> 3) || 1) * dpr));
    const rect = (id, dx, dy, w, h, px) => {
      const k = id - lo, x0 = Math.floor((k % cols) * cell * dpr) + dx, y0 = Math.floor(Math.floor(k / cols) * cell * dpr) + dy;
      for (let y = y0; y < Math.min(H, y0 + h); y++) buf.fill(px, y * W + x0, y * W + Math.min(W, x0 + w));
    };
    for (let id = lo; id < hi; id++) {
      const dim = selReq !== null && !(s.owners[id] && s.owners[id].includes(selReq));
      rect(id, 0, 0, side, side, pixel(this.cellColor(s, id), dim));
      if (s.ref[id] > 1 && cell >= 4) rect(id, 0, side - bar, side, bar, pixel("#111111", dim));
    }
    if (cell >= 6) for (const id of changed) if (id >= lo && id < hi) rect(id, side - Math.ceil(3 * dpr), 0, Math.ceil(3 * dpr), Math.ceil(3 * dpr), pixel("#e00000", false));
    g.putImageData(img, 0, 0);
    if (cell >= 22) {
      g.font = `${Math.floor(cell / 3)}px sans-serif`; g.textAlign = "center"; g.textBaseline = "middle";
      for (let id = lo; id < hi; id++) {
        const k = id - lo;
        g.fillStyle = s.owners[id] || id === 0 ? "#fff" : "#222";
        g.fillText(String(id), (k % cols) * cell + cell / 2, Math.floor(k / cols) * cell + cell / 2);
      }
    }
    if (selBlock !== null && selBlock >= lo && selBlock < hi) {
      const k = selBlock - lo;
      g.strokeStyle = "#e00000"; g.lineWidth = 2;
      g.strokeRect((k % cols) * cell, Math.floor(k / cols) * cell, cell - gap, cell - gap);
    }
    // the fields say the range drawn when it changes; a redraw of the same range (the page's
    // rerun, the whole window after its glimpse) leaves what the learner is typing there
    if (this.fieldsSay !== `${lo}:${hi}`) {
      this.fieldsSay = `${lo}:${hi}`;
      this.q("zlo").value = String(lo); this.q("zhi").value = String(hi);
    }
    this.q("range").textContent = fmt(L.pool_range, { lo, hi: hi - 1, n: count, cell });
  }

  blockAt(e) {
    if (!this.layout) return null;
    const r = this.q("strip").getBoundingClientRect(), { lo, hi, cell, cols } = this.layout;
    const c = Math.floor((e.clientX - r.left) / cell), w = Math.floor((e.clientY - r.top) / cell);
    if (c < 0 || c >= cols || w < 0) return null;
    const id = lo + w * cols + c;
    return id < hi ? id : null;
  }

  hover(e) {
    const id = this.blockAt(e);
    if (id === null) { this.q("tip").hidden = true; return; }
    this.tipFor(id, { left: e.clientX, bottom: e.clientY + 12 });
  }

  tipFor(id, at) {
    const s = this.moveTo(this.cursor), tip = this.q("tip");
    tip.textContent = this.blockLines(s, this.run.frames[this.cursor], id).join("\n");
    tip.dataset.block = String(id);
    const rb = this.box.getBoundingClientRect();
    tip.style.left = `${Math.max(0, at.left - rb.left)}px`;
    tip.style.top = `${at.bottom - rb.top + 4}px`;
    tip.hidden = false;
  }

  queueWhere(f, id) {
    const L = this.L, [head, tail, nfree] = f.q;
    const h = head.indexOf(id);
    if (h >= 0) return fmt(L.pool_q_head, { pos: h });
    const t = tail.indexOf(id);
    if (t >= 0) return fmt(L.pool_q_tail, { pos: nfree - tail.length + t, n: nfree });
    return null;
  }

  blockLines(s, f, id) {
    const L = this.L;
    if (id === 0) return [`${L.block} 0 (${L.null_block})`];
    const own = s.owners[id];
    const free = s.ref[id] === 0;
    const where = this.queueWhere(f, id);
    // where the groups' sizes differ: the block's group and its size, and a held block's empty
    // slots counted against that size (its own group's, not the scheduler's)
    const gi = this.sizesDiffer() ? s.grp[id] : -1, bs = gi >= 0 ? this.groupBlockSize(gi) : 0;
    const size = gi >= 0 ? ` · ${L.group} ${gi}, ${fmt(L.group_block_size, { block_size: bs })}` : "";
    const slots = gi >= 0 && own && s.ntok[id] < bs ? [fmt(L.slots_line, { held: s.ntok[id], empty: bs - s.ntok[id] })] : [];
    return [
      `${L.block} ${id}`,
      `${L.ref}: ${s.ref[id]} · ${L.owners}: ${own ? own.join(", ") : "—"}`,
      `${L.hash}: ${s.hash[id] || "—"}`,
      `${L.parent}: ${s.hash[id] ? (s.parent[id] || L.pool_parent_unknown) : "—"}`,
      `${L.tokens}: ${s.ntok[id]}${size}`,
      ...slots,
      `${L.qpos}: ${free ? (where || L.pool_q_middle) : L.not_free}`,
    ];
  }

  chip(s, id) {
    const c = el("span", "pkv-chip" + (id === 0 ? " null" : s.owners[id] ? " used" : s.hash[id] ? " cached" : ""), id === 0 ? "∅" : id);
    if (s.owners[id]) c.style.background = colorOf(s.owners[id][0]);
    if (this.sel && this.sel.type === "block" && this.sel.id === id) c.classList.add("pkv-sel");
    c.dataset.block = String(id);
    return c;
  }

  drawQueue(s, f) {
    const L = this.L, [head, tail, nfree, ncf] = f.q;
    this.q("qcounts").textContent = fmt(L.pool_q_counts, { free: nfree, cached: ncf, empty: nfree - ncf });
    const items = [el("span", "pkv-end", L.head + " →")];
    for (const id of head) items.push(this.chip(s, id));
    const hidden = nfree - head.length - tail.length;
    if (hidden > 0) items.push(el("span", "pkv-gap", fmt(L.pool_q_more, { n: hidden })));
    const shown = new Set(head);
    for (const id of tail) if (!shown.has(id)) items.push(this.chip(s, id));
    items.push(el("span", "pkv-end", "→ " + L.tail));
    this.q("queue").replaceChildren(...items);
  }

  badge(rid) {
    const b = el("span", "pkv-badge" + (this.sel && this.sel.type === "req" && this.sel.id === rid ? " pkv-sel" : ""), rid);
    b.style.background = colorOf(rid);
    b.dataset.req = rid;
    return b;
  }

  drawEvents(f) {
    const box = this.q("events");
    if (!f.ev.length) { box.replaceChildren(el("li", "pkv-muted", this.L.events_none)); return; }
    const items = f.ev.slice(0, MAX_EVENTS).map(([kind, rid, blocks, text]) => {
      const li = el("li", null, text);
      li.dataset.kind = kind;
      if (rid !== null && rid !== undefined) { li.style.borderLeft = `4px solid ${colorOf(rid)}`; li.style.paddingLeft = "4px"; }
      if (this.sel && ((this.sel.type === "req" && this.sel.id === rid) || (this.sel.type === "block" && blocks.includes(this.sel.id)))) li.className = "pkv-sel-ev";
      return li;
    });
    if (f.ev.length > MAX_EVENTS) items.push(el("li", "pkv-muted", fmt(this.L.pool_more_events, { n: f.ev.length - MAX_EVENTS })));
    box.replaceChildren(...items);
  }

  pager(which, pageNo, pages) {
    const box = el("div", "pkv-pager");
    const prev = el("button", "pkv-btn", "‹"), next = el("button", "pkv-btn", "›");
    prev.type = next.type = "button";
    prev.dataset.page = `${which}:-1`; next.dataset.page = `${which}:1`;
    prev.disabled = pageNo <= 0; next.disabled = pageNo >= pages - 1;
    box.append(prev, el("span", null, fmt(this.L.pool_page, { page: pageNo + 1, pages })), next);
    return box;
  }

  drawRequests(s, f) {
    const L = this.L;
    const order = [...f.u, ...f.w];
    const seen = new Set(order);
    for (const id of s.reqs.keys()) if (!seen.has(id)) order.push(id);
    const pages = Math.max(1, Math.ceil(order.length / REQ_PAGE));
    this.reqPage = Math.min(this.reqPage, pages - 1);
    const table = el("table"), head = el("tr");
    for (const h of L.pool_req_cols) head.append(el("th", null, h));
    table.append(head);
    for (const id of order.slice(this.reqPage * REQ_PAGE, (this.reqPage + 1) * REQ_PAGE)) {
      const r = s.reqs.get(id);
      if (!r) continue;
      const tr = el("tr" ); tr.dataset.req = id;
      if (this.sel && this.sel.type === "req" && this.sel.id === id) tr.className = "pkv-sel";
      const c = el("td"); c.append(this.badge(id)); tr.append(c);
      for (const v of [r.st, r.np, r.nc, r.nk, r.no, r.bt.reduce((a, t) => a + t.length, 0), r.pe, f.sc[id] || 0]) tr.append(el("td", null, v));
      table.append(tr);
    }
    this.q("requests").replaceChildren(order.length ? table : el("div", "pkv-muted", "—"));
    this.q("reqpager").replaceChildren(...(pages > 1 ? [this.pager("req", this.reqPage, pages)] : []));
  }

  drawSelected(s, f) {
    const panel = this.q("selected-panel"), box = this.q("selected"), L = this.L;
    const chips = this.q("seltable"), pager = this.q("selpager");
    if (!this.sel) { panel.hidden = true; return; }
    panel.hidden = false;
    chips.replaceChildren(); pager.replaceChildren();
    if (this.sel.type === "block") { box.textContent = this.blockLines(s, f, this.sel.id).join("\n"); return; }
    const r = s.reqs.get(this.sel.id);
    if (!r) { box.textContent = fmt(L.pool_req_gone, { id: this.sel.id }); return; }
    box.textContent = [
      `${L.req} ${r.id} · ${L.status}: ${r.st}`,
      `${L.prompt}: ${r.np} ${L.tok} · ${L.computed}: ${r.nc} · ${L.cached}: ${r.nk} · ${L.preemptions}: ${r.pe}`,
      `${L.tables}: ${r.bt.map((t, gi) => (this.sizesDiffer() ? `${t.length} (${this.groupLabel(gi)})` : t.length)).join(" + ")}`,
    ].join("\n");
    const table = r.bt[0] || [];
    const pages = Math.max(1, Math.ceil(table.length / CHIP_PAGE));
    this.chipPage = Math.min(this.chipPage, pages - 1);
    chips.replaceChildren(...table.slice(this.chipPage * CHIP_PAGE, (this.chipPage + 1) * CHIP_PAGE).map((id) => this.chip(s, id)));
    if (pages > 1) pager.replaceChildren(this.pager("chip", this.chipPage, pages));
  }
}

function onKey(e) {
  const p = globalThis.__pkvPoolActive;
  if (p && p.root.isConnected !== false) p.key(e);
}

export default function mountPoolPlayer(component) {
  const { data, parentElement } = component;
  if (!parentElement.querySelector(".pkv-pool")) return;
  let p = PLAYERS.get(parentElement);
  if (!p) { p = new PoolPlayer(parentElement); PLAYERS.set(parentElement, p); }
  p.component = component;
  globalThis.__pkvPoolActive = p;
  if (!globalThis.__pkvPoolKeys) { globalThis.__pkvPoolKeys = true; document.addEventListener("keydown", onKey); }
  p.receive(data);
}
