// The player's per-step pictures: narration, metrics, block grid, events, free queue, generated
// text, block tables, hash chains, the PagedAttention address view, hover and the selection.
// Methods of the Player (player.js), drawn from its snapshot at the cursor.

import { el } from "./text.js";
import { PlayerCharts } from "./charts.js";

export class PlayerPanels extends PlayerCharts {
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
