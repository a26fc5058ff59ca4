// The player's per-step pictures: narration, metrics, block grid, events, free queue, generated
// text, block tables, hash chains, the PagedAttention address view, hover and the selection.
// Methods of the Player (player.js), drawn from its snapshot at the cursor.

import { el, fmt, mdEl, oneLine } from "./text.js";
import { PlayerCharts } from "./charts.js";

export class PlayerPanels extends PlayerCharts {
  drawNarration(snap, st) {
    const box = this.q("narration");
    const h = this.run.head;
    const texts = st ? st.narration.slice() : (h.intro ? [h.intro] : []);
    if (this.cursor === this.n && this.run.done && this.cursor > 0 && h.outro) texts.push("🏁 " + h.outro);
    // a lesson's own words: its Markdown drawn as nodes (text.js md), never as HTML
    const items = texts.map((t) => mdEl("div", null, "💡 " + t));
    if (!items.length && st) items.push(el("div", "pkv-sum", st.summary));
    box.replaceChildren(...items);
  }

  drawMetrics(snap) {
    const L = this.L;
    const cells = [[L.m_step, snap.step], [L.m_free, snap.num_free_blocks], [L.m_usage, `${Math.round(100 * snap.usage)}%`],
      [L.m_hit, this.hitText(snap.prefix_cache)], [L.m_rw, `${snap.running.length} / ${snap.waiting.length}`]];
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
    if (b.is_null) cls += " null";
    else if (b.owners.length) cls += " used";
    else if (b.block_hash) cls += " cached";
    if (b.ref_cnt > 1) cls += " shared";
    return cls;
  }

  paintOwners(node, b) {
    if (b.is_null || !b.owners.length) return;
    const cols = b.owners.map((o) => this.color(o));
    node.style.background = cols.length === 1 ? cols[0]
      : `linear-gradient(135deg, ${cols.map((c, i) => `${c} ${(100 * i) / cols.length}% ${(100 * (i + 1)) / cols.length}%`).join(", ")})`;
  }

  selState(b) {
    if (!this.sel) return "";
    if (this.sel.type === "block") return b.block_id === this.sel.id ? " pkv-sel" : "";
    return b.owners.includes(this.sel.id) ? " pkv-sel" : " pkv-dim";
  }

  // Each KV cache group's own block size: the head's groups carry one only where the sizes differ
  // (vLLM 0.34: a group with a smaller page per token gets longer blocks; head.block_size is then
  // the scheduler's, their least common multiple); a group without one has head.block_size.
  groupBlockSize(gi) {
    const g = (this.run.head.groups || [])[gi];
    return (g && g.block_size) || this.run.head.block_size;
  }

  sizesDiffer() { return (this.run.head.groups || []).some((g) => g.block_size); }

  // The block size of the group whose table holds block b (a block id sits in one group's tables),
  // else of the group its hash keys it in; the block -> group map is built once per snapshot.
  blockSize(snap, b) {
    if (!this.sizesDiffer()) return this.run.head.block_size;
    if (this.groupOfSnap !== snap) {
      this.groupOfSnap = snap;
      this.groupOf = new Map();
      for (const r of snap.requests) r.block_tables.forEach((t, gi) => t.forEach((id) => this.groupOf.set(id, gi)));
    }
    const gi = this.groupOf.has(b.block_id) ? this.groupOf.get(b.block_id) : b.group;
    return gi === null || gi === undefined ? this.run.head.block_size : this.groupBlockSize(gi);
  }

  drawGrid(snap, changed) {
    const nodes = snap.blocks.map((b) => {
      const d = el("div", this.blockClass(b, "pkv-block") + (changed.has(b.block_id) ? " changed" : "") + this.selState(b));
      d.dataset.block = String(b.block_id);
      d.dataset.ref = String(b.ref_cnt);
      d.dataset.owners = b.owners.join(",");
      this.paintOwners(d, b);
      d.append(el("span", "pkv-id", b.is_null ? "∅" : b.block_id),
        el("span", "pkv-ref", b.is_null ? this.L.null_block : `${this.L.ref_short} ${b.ref_cnt}`));
      // A held block's slots: filled = a computed token's K/V, hollow = allocated, no token yet
      // (the next decode slot, or lookahead slots reserved for a draft model).
      const held = b.token_ids.length, bs = this.blockSize(snap, b);
      if (!b.is_null && b.owners.length && held < bs && bs <= 64) {
        const strip = el("span", "pkv-slots");
        for (let i = 0; i < bs; i++) strip.append(el("i", i < held ? null : "empty"));
        d.dataset.empty = String(bs - held);
        d.append(strip);
      }
      return d;
    });
    this.q("grid").replaceChildren(...nodes);
  }

  drawEvents(st) {
    const box = this.q("events");
    if (!st) { box.replaceChildren(el("li", "pkv-muted", this.L.events_none)); return; }
    box.replaceChildren(...st.events.map(({ kind, request_id: rid, block_ids: blocks, text }) => {
      const li = el("li", null, text);
      li.dataset.kind = kind;
      if (rid !== null && rid !== undefined) { li.style.borderLeft = `4px solid ${this.color(rid)}`; li.style.paddingLeft = "4px"; }
      if (this.sel && ((this.sel.type === "req" && this.sel.id === rid) || (this.sel.type === "block" && blocks.includes(this.sel.id)))) li.className = "pkv-sel-ev";
      return li;
    }));
  }

  chip(b, enterCls) {
    const c = el("span", this.blockClass(b, "pkv-chip") + this.selState(b) + (enterCls ? " " + enterCls : ""),
      b.is_null ? "∅" : b.block_id);
    c.dataset.block = String(b.block_id);
    this.paintOwners(c, b);
    return c;
  }

  drawQueue(snap) {
    const prevQ = this.prevShown ? new Set(this.prevShown.free_queue) : null;
    const items = [el("span", "pkv-end", this.L.head + " →")];
    for (const id of snap.free_queue) items.push(this.chip(snap.blocks[id], prevQ && !prevQ.has(id) ? "pkv-enter-queue" : ""));
    items.push(el("span", "pkv-end", "→ " + this.L.tail));
    this.q("queue").replaceChildren(...items);
  }

  // The CPU tier (SimpleCPUOffloadConnector): its own pool and free queue, as the step left them.
  // A run without one has no cpu_pool on its steps: the panel stays hidden.
  drawCpuPool(st) {
    const cpu = st ? st.cpu_pool : null;
    const panel = this.q("cpu-panel");
    if (!panel) return;
    panel.hidden = !cpu;
    if (!cpu) return;
    const cls = (i) => (cpu.ref_cnts[i] > 0 ? " pkv-pinned" : "") + (cpu.block_hashes[i] ? " cached" : "");
    const cells = [];
    for (let i = 1; i < cpu.num_blocks; i++) {
      const d = el("div", "pkv-block" + cls(i));
      d.dataset.cpuBlock = String(i);
      d.title = cpu.block_hashes[i] ? `#${cpu.block_hashes[i].slice(0, 12)}` : "";
      d.append(el("span", "pkv-id", i), el("span", "pkv-ref", `${this.L.ref_short} ${cpu.ref_cnts[i]}`));
      cells.push(d);
    }
    this.q("cpu-grid").replaceChildren(...cells);
    const items = [el("span", "pkv-end", this.L.head + " →")];
    for (const i of cpu.free_queue) {
      const c = el("span", "pkv-chip" + cls(i), i);
      c.dataset.cpuBlock = String(i);
      items.push(c);
    }
    items.push(el("span", "pkv-end", "→ " + this.L.tail));
    this.q("cpu-queue").replaceChildren(...items);
  }

  badge(rid) {
    const b = el("span", "pkv-badge" + (this.sel && this.sel.type === "req" && this.sel.id === rid ? " pkv-sel" : ""), rid);
    b.style.background = this.color(rid);
    b.dataset.req = rid;
    return b;
  }

  // A step where some request waits outside plain `waiting` carries waiting_queues: each waiting
  // request's row then names its vLLM 0.34 queue, linked to vLLM's scheduler.py.
  queueLabel(rid, wq) {
    const name = wq.queues[rid];
    if (!name) return null;
    const a = el("a", "pkv-queue", name);
    a.href = wq.source; a.target = "_blank"; a.rel = "noopener noreferrer";
    a.dataset.queue = name;
    a.title = `${this.L["queue_" + name] || name} — ${this.L.queue_source}`;
    return a;
  }

  drawOutputs(snap, st) {
    const wq = st && st.waiting_queues;
    const rows = snap.requests.map((r) => {
      const d = el("div");
      d.dataset.req = r.request_id;
      const queue = wq ? this.queueLabel(r.request_id, wq) : null;
      d.append(this.badge(r.request_id), el("code", null, r.status), ...(queue ? [" ", queue] : []),
        el("span", "pkv-muted", ` · ${r.num_output_tokens} ${this.L.tok} — `),
        el("span", "pkv-text", oneLine(r.text || (r.output_token_ids.length ? this.tokText(r.output_token_ids) : "…"))));
      return d;
    });
    this.q("outputs").replaceChildren(...(rows.length ? rows : [el("div", "pkv-muted", "—")]));
  }

  drawTables(snap) {
    const groups = this.run.head.groups || [{}];
    const prevHeld = new Set();
    if (this.prevShown) {
      for (const r of this.prevShown.requests) for (const t of r.block_tables) for (const id of t) prevHeld.add(`${r.request_id}:${id}`);
    }
    const out = [], differ = this.sizesDiffer();
    groups.forEach((g, gi) => {
      const reqs = snap.requests.filter((r) => r.block_tables[gi] && r.block_tables[gi].length);
      const gbs = this.groupBlockSize(gi);
      if (groups.length > 1) {
        const win = g.sliding_window ? ` (${this.L.window} ${g.sliding_window})` : "";
        const size = differ ? ` · ${fmt(this.L.group_block_size, { block_size: gbs })}` : "";
        const label = el("div", "pkv-muted", `${this.L.group} ${gi}: ${g.kind || ""}${win}${size}`);
        label.dataset.group = String(gi);
        if (differ) label.dataset.blockSize = String(gbs);
        out.push(label);
      }
      const table = el("table");
      table.dataset.group = String(gi);
      for (const r of reqs) {
        const tr = el("tr");
        tr.dataset.req = r.request_id;
        const head = el("td"); head.append(this.badge(r.request_id)); tr.append(head);
        r.block_tables[gi].forEach((id, li) => {
          const td = el("td");
          const enter = this.prevShown && !prevHeld.has(`${r.request_id}:${id}`) ? "pkv-enter-table" : "";
          // where the groups' sizes differ, each logical block names the tokens it covers
          const span = differ ? ` · ${fmt(this.L.block_tokens, { first: li * gbs, last: (li + 1) * gbs - 1 })}` : "";
          td.append(this.chip(snap.blocks[id], enter), el("div", "pkv-logical", `L${li}${span}`));
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
    const cached = snap.blocks.filter((b) => b.block_hash);
    if (!cached.length) { this.q("chains").replaceChildren(el("div", "pkv-muted", L.no_chains)); return; }
    const key = (h, g) => `${h}@${g}`;
    const present = new Set(cached.map((b) => key(b.block_hash, b.group)));
    const kids = new Map(), holders = new Map();
    for (const b of cached) {
      // One hash held by several blocks (two requests computed the same content): one node.
      const k = key(b.block_hash, b.group);
      if (holders.has(k)) { holders.get(k).push(b); continue; }
      holders.set(k, [b]);
      const p = b.parent_hash === null || b.parent_hash === undefined ? "ROOT"
        : (present.has(key(b.parent_hash, b.group)) ? key(b.parent_hash, b.group) : "ORPHAN");
      if (!kids.has(p)) kids.set(p, []);
      kids.get(p).push(b);
    }
    const node = (b, depth) => {
      const li = el("li");
      const row = el("span", "pkv-node" + this.selState(b));
      row.dataset.block = String(b.block_id);
      row.append(...holders.get(key(b.block_hash, b.group)).map((x) => this.chip(x, "")),
        el("code", null, "#" + b.block_hash.slice(0, 8)),
        el("span", "pkv-text", `«${oneLine(this.tokText(b.token_ids))}»`));
      li.append(row);
      const ch = depth < 64 ? kids.get(key(b.block_hash, b.group)) : null;
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
    const reqs = snap.requests.filter((r) => r.block_tables.some((t) => t.length));
    if (!reqs.length) { box.replaceChildren(el("div", "pkv-muted", L.address_none)); return; }
    if (!reqs.some((r) => r.request_id === this.addrReq)) this.addrReq = reqs[0].request_id;
    const r = reqs.find((x) => x.request_id === this.addrReq);
    const prompt = this.run.head.prompts[r.request_id] || [];
    const toks = prompt.concat(r.output_token_ids);
    const n = Math.max(1, toks.length);
    const pos = this.addrPos === null ? Math.max(0, Math.min(n - 1, r.num_computed_tokens - 1)) : Math.min(this.addrPos, n - 1);
    const sel = el("select", "pkv-select");
    sel.replaceChildren(...reqs.map((x) => { const o = el("option", null, x.request_id); o.value = x.request_id; return o; }));
    sel.value = r.request_id;
    sel.addEventListener("change", () => { this.addrReq = sel.value; this.addrPos = null; this.draw(); });
    const range = el("input");
    range.type = "range"; range.min = "0"; range.max = String(n - 1); range.value = String(pos);
    range.addEventListener("input", () => { this.addrPos = Number(range.value); this.draw(); });
    const l1 = el("label", null, L.req + " "); l1.append(sel);
    const l2 = el("label", null, `${L.pos_label} ${pos} `); l2.append(range);
    const parts = [l1, l2];
    const nulls = new Set(snap.blocks.filter((b) => b.is_null).map((b) => b.block_id));
    const differ = this.sizesDiffer();
    r.block_tables.forEach((table, gi) => {
      // each group's own arithmetic: vLLM's slot_mapping is block id × that group's block size + offset
      const bs = this.groupBlockSize(gi);
      const lb = Math.floor(pos / bs), off = pos % bs;
      const pb = lb < table.length ? table[lb] : null;
      const phys = pb === null ? "—" : (nulls.has(pb) ? L.null_slot : String(pb));
      const slot = pb === null || nulls.has(pb) ? "—" : String(pb * bs + off);
      const tok = pos < toks.length ? this.tokText([toks[pos]]) : "?";
      const size = differ ? `, ${fmt(L.group_block_size, { block_size: bs })}` : "";
      const gl = r.block_tables.length > 1 ? ` [${L.group} ${gi}${size}]` : "";
      const line = el("div", "pkv-addr-line",
        fmt(L.address_line, { pos, token: tok, group: gl, block_size: bs, logical: lb, offset: off, physical: phys, slot }) +
        (pos < r.num_computed_tokens ? "" : " " + L.not_computed));
      line.dataset.group = String(gi);
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
    const qpos = snap.free_queue.indexOf(b.block_id), bs = this.blockSize(snap, b);
    return [
      `${L.block} ${b.block_id}${b.is_null ? ` (${L.null_block})` : ""}`,
      `${L.ref}: ${b.ref_cnt} · ${L.owners}: ${b.owners.length ? b.owners.join(", ") : "—"}`,
      `${L.hash}: ${b.block_hash || "—"}${b.block_hash && (this.run.head.groups || []).length > 1 ? ` (${L.group} ${b.group})` : ""}`
        + (b.block_hash && b.block_hash_num_tokens ? ` · block_hash_num_tokens: ${b.block_hash_num_tokens}` : ""),
      `${L.parent}: ${b.block_hash ? (b.parent_hash || "NONE_HASH") : "—"}`,
      `${L.tokens}: ${b.token_ids.length}${this.run.head.decoded ? "" : " " + L.decoded_ids}`,
      ...(b.owners.length && !b.is_null && b.token_ids.length < bs
        ? [fmt(L.slots_line, { held: b.token_ids.length, empty: bs - b.token_ids.length })] : []),
      `${L.text}: «${this.tokText(b.token_ids)}»`,
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
    const r = snap.requests.find((x) => x.request_id === this.sel.id);
    if (!r) { box.textContent = `${L.req} ${this.sel.id}: —`; return; }
    box.textContent = [
      `${L.req} ${r.request_id} · ${L.status}: ${r.status}`,
      `${L.prompt}: ${r.num_prompt_tokens} ${L.tok} «${this.tokText(this.run.head.prompts[r.request_id] || [])}»`,
      `${L.computed}: ${r.num_computed_tokens} · ${L.cached}: ${r.num_cached_tokens} · ${L.preemptions}: ${r.num_preemptions}`,
      ...r.block_tables.map((t, gi) => `${L.tables} [${gi}]: ${t.join(", ") || "—"}`),
      `${L.outputs}: ${r.text || this.tokText(r.output_token_ids)}`,
    ].join("\n");
  }
}
