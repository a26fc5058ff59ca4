// The step player: steps a recorded run in the browser, with no server round-trip.
// Used as a Streamlit v2 component (the default export is called on every render with the
// latest `data`) and inside the static export (called once). Every string that comes from the
// run (token text, prompts, request ids, sentences) is inserted with textContent, never as HTML.

// The per-step pictures are in panels.js and charts.js, the words in text.js, the decoder of the
// server's payload in decode.js; the static export (player/export.py) inlines all five files in
// one module.

import { addStrings, el, fmt, md, wordsFor } from "./text.js";
import { applyDelta, decodeSnapshot, decodeStep, hasWire, setWire } from "./decode.js";
import { PlayerPanels } from "./panels.js";
import { joinRoom } from "./room.js";

const SPEEDS = [0.5, 1, 2, 4];
const PLAY_MS = 800;
const REPORT_MS = 700;      // the cursor is reported once the learner pauses: each report reruns Python
const POLL_MS = 500;        // while the server still records the run, ask it for new steps this often
const LEAVING_MS = 3000;    // after a click on a link to another page, how long this page's players keep still
const RUNS = new Map();      // run key -> {head, snaps, steps, done}: survives a remount of the element
const MAX_RUNS = 4;
const PLAYERS = new WeakMap();
let PLAYER_UIDS = 0;

class Player extends PlayerPanels {
  constructor(root) {
    super();
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
    this.link = null;           // the RoomLink while this player is in a room (room.js)
    this.bind();
  }

  // The player's words in the run's language, with the page's own words (head.words) over them.
  get L() {
    if (this._lRun !== this.run) {
      this._lRun = this.run;
      this._L = { ...wordsFor((this.run && this.run.head.lang) || "en"), ...((this.run && this.run.head.words) || {}) };
    }
    return this._L;
  }
  get n() { return this.run ? this.run.steps.length : 0; }

  // -- data in -----------------------------------------------------------------------
  // A run's head comes with what decodes and words it (data.wire, data.strings: player_book in
  // player/payload.py); steps come decoded into run.snaps (whole snapshots) and run.steps.
  receive(data) {
    if (!data || !data.run) return;
    setWire(data.wire);
    addStrings(data.strings);
    let run = RUNS.get(data.run);
    if (!run) {
      if (!data.head || !hasWire()) { this.report("have", { run: data.run, n: -1 }, true); return; }
      const { initial, step0, ...head } = data.head;
      run = { head, snaps: [decodeSnapshot(initial)], step0: step0 ? decodeStep(step0) : null, steps: [],
              done: false, vocab: {} };
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
        const st = decodeStep(data.steps[i]);
        Object.assign(run.vocab, st.vocab || {});
        if (st.new_prompts) Object.assign(run.head.prompts, st.new_prompts);
        run.snaps.push(applyDelta(run.snaps[run.snaps.length - 1], data.steps[i]));
        run.steps.push(st);
      }
      run.done = !!data.done;
      if (data.stop) run.stop = data.stop;
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
    joinRoom(this, data.room);
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
    if (this.link) this.link.moved(k + this.first);
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
    if (!(s.waiting.length || s.running.length)) return this.L.all_done;
    // stopped by the server's step cap: say which limit, and its variable
    if (this.run.stop && this.cursor >= this.n) return fmt(this.L.step_cap, this.run.stop);
    return this.L.trace_end;
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
    const name = this.seek.kind ? (L[`kind_${this.seek.kind}`] || this.seek.kind) : "";
    const limit = this.maxStep();
    if (this.seek.end) {
      if (this.cursor !== limit) this.show(limit, false);
      if (this.run.done || limit < this.n) { this.seek = null; this.notice(this.endText()); }
      else { this.notice(L.waiting_step); this.report("want", { run: this.runKey, step: this.n + 1 + this.first }, true); }
      this.draw();
      return;
    }
    for (let k = this.cursor + 1; k <= limit; k++) {
      if (this.run.steps[k - 1].events.some((e) => e.kind === this.seek.kind)) {
        this.seek = null;
        this.show(k, false);
        this.notice(fmt(L.found, { kind: name, step: k + this.first }));
        return;
      }
    }
    if (limit < this.n || this.run.done) {
      this.seek = null;
      this.show(limit, false);
      this.notice(limit < this.n ? L.hold : fmt(L.not_found, { kind: name }));
    } else {
      this.show(limit, false);
      this.notice(fmt(L.searching, { kind: name }));
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
      if (block !== undefined && this.link) this.link.clickBlock(Number(block));
      if (block !== undefined && t.dataset.follow !== "0") this.select({ type: "block", id: Number(block) });
      else if (req !== undefined) this.select({ type: "req", id: req });
    });
    const tl = this.q("timeline");
    tl.addEventListener("input", () => { if (this.link) this.link.userMove(); this.stopPlay(); this.notice(null); this.show(Math.min(Number(tl.value), this.maxStep()), false); });
    const over = this.q("metrics-panel");
    over.addEventListener("toggle", () => { if (this.run && over.open) this.drawOverTime(); });
    this.root.addEventListener("mouseover", (e) => this.hover(e));
    this.root.addEventListener("mouseout", (e) => { if (e.target.closest && e.target.closest("[data-block]")) this.q("tip").hidden = true; });
  }

  act(what) {
    if (!this.run) return;
    if (this.link) this.link.userMove();
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
    if ((e.key === "f" || e.key === "F") && this.link) { e.preventDefault(); this.link.snapBack(); return; }
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
    for (const h of this.root.querySelectorAll("[data-label]")) {
      // a caption is a sentence in the catalogue's small Markdown (text.js md); a title is plain
      if (h.classList.contains("pkv-caption")) h.replaceChildren(...md(L[h.dataset.label] || ""));
      else h.textContent = L[h.dataset.label] || "";
    }
    for (const b of this.root.querySelectorAll("[data-act]")) {
      if (b.dataset.act !== "home" && L[b.dataset.act]) b.textContent = L[b.dataset.act];
    }
    const sp = this.q("speed");
    sp.replaceChildren(...SPEEDS.map((s) => { const o = el("option", null, fmt(L.speed, { speed: s })); o.value = String(s); return o; }));
    sp.value = "1";
    const kinds = this.run.head.until_kinds || Object.keys(L).filter((k) => k.startsWith("kind_")).map((k) => k.slice(5));
    const un = this.q("until");
    un.replaceChildren(...kinds.map((k) => { const o = el("option", null, fmt(L.until_option, { kind: L[`kind_${k}`] || k })); o.value = k; return o; }));
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
    const st = this.cursor ? this.run.steps[this.cursor - 1] : this.run.step0;
    this.box.dataset.step = String(this.cursor + this.first);
    // When the first picture was drawn, in ms since the page's navigation began (read by the bench).
    if (!this.box.dataset.firstDraw && typeof performance !== "undefined") this.box.dataset.firstDraw = String(Math.round(performance.now()));
    this.box.dataset.total = String(this.n + this.first);
    this.box.dataset.done = String(this.run.done);
    const tl = this.q("timeline");
    tl.max = String(Math.max(this.n, 1)); tl.value = String(this.cursor); tl.disabled = this.n === 0;
    this.q("pos").textContent = fmt(L.pos, { step: this.cursor + this.first, total: this.n + this.first });
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
    const changed = new Set(st ? st.changed_blocks : []);
    this.drawNarration(snap, st);
    this.drawMetrics(snap);
    this.drawGrid(snap, changed);
    this.drawEvents(st);
    this.drawQueue(snap);
    this.drawCpuPool(st);
    this.drawOutputs(snap, st);
    this.drawTables(snap);
    this.drawChains(snap);
    this.drawAddress(snap);
    this.drawSelected(snap);
    this.drawPanels(snap);
    this.prevShown = null;
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
