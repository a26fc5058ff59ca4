// The player's charts over steps (usage / hit rate / queues, token budget, blocks held) and the
// requests table: plain SVG and DOM, every label set with textContent. PlayerCharts holds the
// drawing methods; the Player (player.js) inherits them through PlayerPanels.

import { el } from "./text.js";

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

export class PlayerCharts {
  // -- the panels under the pictures: requests table and charts over steps -------------
  // The page names them in head.panels (ui/panels.py player_panels; an export without it gets
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
    if (!snap.requests.length) { this.q("requests").replaceChildren(el("div", "pkv-muted", "—")); return; }
    const table = el("table");
    const head = el("tr");
    head.append(...L.req_cols.map((c) => el("th", null, c)));
    const rows = snap.requests.map((r) => {
      const tr = el("tr");
      tr.dataset.req = r.request_id;
      const id = el("td"); id.append(this.badge(r.request_id)); tr.append(id);
      for (const v of [r.status, r.num_prompt_tokens, r.num_output_tokens, r.num_computed_tokens, r.num_cached_tokens,
        r.num_preemptions, r.priority]) tr.append(el("td", null, v));
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
    const hit = (s) => 100 * (s.prefix_cache.hit_rate || 0);
    const y2Max = Math.max(1, ...snaps.map((s) => Math.max(s.running.length, s.waiting.length)));
    const f = stepFrame({ x0: snaps[0].step, x1: snaps[snaps.length - 1].step, yMax: 100, y2Max, intY2: true,
                          xLabel: L.c_step, yLabel: "%", y2Label: L.c_count });
    const w = Math.min(f.slot * 0.36, 18);
    for (const s of shown) {
      f.svg.append(sv("rect", { x: f.x(s.step) - w, y: f.y2(s.running.length), width: w,
                                height: f.bottom - f.y2(s.running.length),
                                fill: "rgba(31,119,180,0.45)", "data-series": "running", "data-step": s.step }),
        sv("rect", { x: f.x(s.step), y: f.y2(s.waiting.length), width: w, height: f.bottom - f.y2(s.waiting.length),
                     fill: "rgba(255,127,14,0.45)", "data-series": "waiting", "data-step": s.step }));
    }
    f.svg.append(...polyline(f, shown.map((s) => [s.step, 100 * s.usage]), "#d62728", "usage", f.y),
      ...polyline(f, shown.map((s) => [s.step, hit(s)]), "#2ca02c", "hit", f.y));
    const byStep = new Map(shown.map((s) => [s.step, s]));
    const text = (step) => {
      const s = byStep.get(step);
      return `${L.c_step} ${step}: ${L.c_usage} ${Math.round(100 * s.usage)} · ${L.c_hit} ${Math.round(hit(s))} · ` +
        `${L.c_running} ${s.running.length} · ${L.c_waiting} ${s.waiting.length}`;
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
    const rids = [...new Set(steps.flatMap((st) => Object.keys(st.scheduled)))];
    const total = (st) => Object.values(st.scheduled).reduce((a, b) => a + b, 0);
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
        const n = st.scheduled[rid] || 0;
        if (!n) continue;
        const a = { x: f.x(step) - w / 2, y: f.y(acc + n), width: w, height: f.y(acc) - f.y(acc + n) };
        const striped = (st.phases || {})[rid] !== "decode";
        f.svg.append(sv("rect", { ...a, fill: this.color(rid), "data-req": rid, "data-step": step,
                                  "data-phase": (st.phases || {})[rid] || "" }));
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
      const ph = st.phases || {};
      const parts = rids.filter((r) => st.scheduled[r]).map((r) => `${r} ${st.scheduled[r]} (${L[ph[r]] || ph[r] || "?"})`);
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
    const nulls = new Set(snaps[0].blocks.filter((b) => b.is_null).map((b) => b.block_id));
    const held = (r) => new Set(r.block_tables.flat().filter((b) => !nulls.has(b))).size;
    const rids = [...new Set(snaps.flatMap((s) => s.requests.map((r) => r.request_id)))];
    const yMax = Math.max(1, ...snaps.flatMap((s) => s.requests.map(held))) * 1.1;
    const f = stepFrame({ x0: snaps[0].step, x1: snaps[snaps.length - 1].step, yMax, intY: true,
                          xLabel: L.c_step, yLabel: L.c_blocks });
    const lines = new Map(rids.map((r) => [r, []]));
    for (const s of shown) for (const r of s.requests) lines.get(r.request_id).push([s.step, held(r)]);
    for (const [rid, pts] of lines) if (pts.length) f.svg.append(...polyline(f, pts, this.color(rid), rid, f.y));
    const byStep = new Map(shown.map((s) => [s.step, s]));
    const text = (step) => `${L.c_step} ${step}: ` +
      (byStep.get(step).requests.map((r) => `${r.request_id} ${held(r)}`).join(", ") || "—");
    const readout = el("div", "pkv-readout");
    stepMarks(f, shown.map((s) => s.step), this.stepOf(this.cursor), text, readout);
    this.q("held").replaceChildren(legend(rids.map((r) => [this.color(r), r])), f.svg, readout);
  }
}
