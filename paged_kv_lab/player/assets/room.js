// A player in a room (a class following its teacher): the WebSocket to the room server
// (paged_kv_lab/classroom/rooms.py) and the room's bar above the player. The teacher's player sends
// its step on every move; a student's player shows the teacher's step as soon as it arrives
// (the steps are already in the browser), until the student steps on their own ("on your own")
// and until they snap back (the button or the F key). A question to the class is answered by a
// click on a choice or on its block in the grid. Every text from the room (names, questions) is
// inserted with textContent, never as HTML.

import { el, fmt } from "./text.js";

const RETRY_MS = 2000;     // a dropped connection is tried again this often
const WATCH_MS = 2000;     // how often a link checks that its player is still on the page

// The player's room for this render (data.room, from the page's "Teach this" or "Join a class"):
// one link per room and role; a render without a room leaves it.
export function joinRoom(player, cfg) {
  if (player.link && player.link.same(cfg)) { player.link.rename(cfg.name); return; }
  if (player.link) {
    player.link.close(); player.link = null;
    player.q("room").hidden = true; delete player.box.dataset.room;
  }
  if (cfg && typeof WebSocket !== "undefined") { player.link = new RoomLink(player, cfg); player.link.draw(); }
}

export class RoomLink {
  // cfg: {port, code, role: "teacher"|"student", secret?, name?, lang}
  constructor(player, cfg) {
    this.p = player;
    this.cfg = cfg;
    this.role = cfg.role;
    this.following = true;
    this.teacherStep = null;
    this.poll = null;          // the open question (revealed: with answer/explain/choice/right)
    this.choice = null;
    this.cls = null;           // the teacher's view of the class
    this.status = "";
    this.ended = false;        // refused or closed: no retry
    this.ws = null;
    this.connect();
    this.watch = setInterval(() => {
      const host = this.p.root.host || this.p.root;
      if (host.isConnected === false) this.close();
    }, WATCH_MS);
  }

  same(cfg) {
    return cfg && cfg.code === this.cfg.code && cfg.role === this.cfg.role && cfg.port === this.cfg.port;
  }

  // The student typed (another) name: the teacher's list shows it.
  rename(name) {
    if (this.role !== "student" || (name || "") === (this.cfg.name || "")) return;
    this.cfg = { ...this.cfg, name: name || "" };
    this.send({ op: "name", name: this.cfg.name });
  }

  connect() {
    if (this.ended) return;
    const proto = location.protocol === "https:" ? "wss" : "ws";
    let ws;
    try { ws = new WebSocket(`${proto}://${location.hostname}:${this.cfg.port}/`); } catch (e) { this.lost(); return; }
    this.ws = ws;
    this.setStatus(this.p.L.room_connecting);
    ws.onopen = () => {
      const hello = { op: "hello", room: this.cfg.code, role: this.role, lang: this.cfg.lang || "en" };
      if (this.role === "teacher") hello.secret = this.cfg.secret;
      else hello.name = this.cfg.name || "";
      ws.send(JSON.stringify(hello));
    };
    ws.onmessage = (e) => { let m; try { m = JSON.parse(e.data); } catch (err) { return; } this.on(m); };
    ws.onclose = () => { if (this.ws === ws) { this.ws = null; this.lost(); } };
  }

  lost() {
    if (this.ended) return;
    this.setStatus(this.p.L.room_lost);
    clearTimeout(this.retry);
    this.retry = setTimeout(() => this.connect(), RETRY_MS);
  }

  close() {
    this.ended = true;
    clearInterval(this.watch);
    clearTimeout(this.retry);
    if (this.ws) { const ws = this.ws; this.ws = null; ws.close(); }
  }

  send(obj) { if (this.ws && this.ws.readyState === 1) this.ws.send(JSON.stringify(obj)); }

  // -- frames from the room ------------------------------------------------------------
  on(m) {
    if (m.op === "welcome") {
      this.setStatus("");
      this.teacherStep = m.step;
      if (m.poll !== undefined) this.setPoll(m.poll);
      if (this.role === "teacher") this.send({ op: "step", step: this.p.cursor + this.p.first });
      else if (this.following) this.follow(m.step);
      else this.where();
    } else if (m.op === "step") {
      this.teacherStep = m.step;
      if (this.role === "student" && this.following) this.follow(m.step);
    } else if (m.op === "poll") {
      this.setPoll(m.poll);
    } else if (m.op === "reveal") {
      this.poll = m.poll;
    } else if (m.op === "class") {
      this.cls = m;
      if (m.poll !== undefined) this.poll = m.poll;
    } else if (m.op === "error") {
      this.setStatus(m.text);
      if (String(m.key).startsWith("rooms.error.no_room") || m.key === "rooms.error.secret" || m.key === "rooms.what.students") this.ended = true;
    } else if (m.op === "closed") {
      this.ended = true;
      this.setStatus(m.text);
    }
    this.draw();
  }

  setPoll(poll) {
    if (!poll || !this.poll || poll.step !== this.poll.step || poll.prompt !== this.poll.prompt) this.choice = null;
    this.poll = poll;
  }

  setStatus(text) { this.status = text || ""; this.draw(); }

  // -- the player's side ----------------------------------------------------------------
  // The teacher's step, shown now where this browser holds it, else asked of the server.
  follow(step) {
    const p = this.p, k = step - p.first;
    p.stopPlay(); p.seek = null; p.notice(null);
    if (k <= p.n || !p.report) { if (k !== p.cursor) p.show(k, Math.abs(k - p.cursor) === 1); }
    else { p.pendingGoto = k; p.report("want", { run: p.runKey, step: step }, true); }
  }

  // The player moved (its cursor is ``step``): the teacher's move is the room's.
  moved(step) {
    if (this.role === "teacher") this.send({ op: "step", step });
    else if (!this.following) this.where();
    this.draw();
  }

  // The learner moved the player themself: a student goes on their own.
  userMove() {
    if (this.role === "student" && this.following) { this.following = false; this.where(); this.draw(); }
  }

  where() { this.send({ op: "where", step: this.p.cursor + this.p.first, follow: this.following }); }

  snapBack() {
    if (this.role !== "student") return;
    this.following = true;
    this.where();
    if (this.teacherStep !== null) this.follow(this.teacherStep);
    this.draw();
  }

  answer(i) {
    if (this.role !== "student" || !this.poll || this.poll.answer !== undefined) return false;
    this.choice = i;
    this.send({ op: "answer", choice: i });
    this.draw();
    return true;
  }

  // A click on block ``id`` of the grid: the answer to a question about blocks, if it names it.
  clickBlock(id) {
    if (!this.poll || !this.poll.blocks || this.role !== "student") return false;
    const i = this.poll.blocks.indexOf(id);
    return i >= 0 && this.answer(i);
  }

  // -- the bar ------------------------------------------------------------------------------
  draw() {
    const bar = this.p.q("room");
    if (!bar || !this.p.run) return;
    const L = this.p.L, box = this.p.box;
    bar.hidden = false;
    const head = el("div", "pkv-room-head");
    if (this.role === "teacher") {
      box.dataset.room = "teacher";
      head.append(el("b", null, fmt(L.room_teacher, { code: this.cfg.code })));
      const c = this.cls || { students: 0, follow: 0, wander: 0, names: [] };
      const count = el("span", "pkv-room-count", fmt(L.room_class, c));
      count.dataset.role = "room-count";
      count.dataset.follow = String(c.follow); count.dataset.wander = String(c.wander);
      head.append(count);
      if (c.names && c.names.length) head.append(el("span", "pkv-room-names", c.names.join(", ")));
    } else {
      box.dataset.room = this.following ? "following" : "wander";
      const badge = el("span", "pkv-room-badge" + (this.following ? "" : " wander"),
        this.following ? L.room_following : fmt(L.room_wander, { step: this.teacherStep === null ? "?" : this.teacherStep }));
      badge.dataset.role = "room-badge";
      head.append(badge);
      if (!this.following) {
        const back = el("button", "pkv-btn pkv-primary", L.room_back);
        back.type = "button"; back.dataset.role = "room-back";
        back.addEventListener("click", (e) => { e.stopPropagation(); this.snapBack(); });
        head.append(back);
      }
    }
    const parts = [head];
    if (this.status) { const s = el("div", "pkv-room-status", this.status); s.dataset.role = "room-status"; parts.push(s); }
    if (this.poll) parts.push(this.pollBox(L));
    bar.replaceChildren(...parts);
  }

  pollBox(L) {
    const poll = this.poll, revealed = poll.answer !== undefined;
    const box = el("div", "pkv-room-poll");
    box.dataset.role = "room-poll";
    box.dataset.revealed = String(revealed);
    box.append(el("div", "pkv-room-q", fmt(L.room_question, { step: poll.step })), el("b", null, poll.prompt));
    const tally = this.role === "teacher" ? (this.cls && this.cls.tally) || [] : poll.tally || [];
    if (tally.length) box.dataset.tally = tally.join(",");
    const opts = el("div", "pkv-room-opts");
    poll.options.forEach((text, i) => {
      const b = el("button", "pkv-btn pkv-room-opt", text);
      b.type = "button"; b.dataset.choice = String(i);
      if (i === this.choice || (revealed && i === poll.choice)) b.classList.add("chosen");
      if (revealed && i === poll.answer) b.classList.add("answer");
      if (tally.length) b.append(el("span", "pkv-room-n", String(tally[i] || 0)));
      b.disabled = this.role !== "student" || revealed;
      b.addEventListener("click", (e) => { e.stopPropagation(); this.answer(i); });
      opts.append(b);
    });
    box.append(opts);
    let line = "";
    if (this.role === "teacher") {
      const c = this.cls || { students: 0 };
      line = revealed ? fmt(L.room_answer_is, { answer: poll.options[poll.answer] })
        : fmt(L.room_answered, { answered: (this.cls && this.cls.answered) || 0, students: c.students });
    } else if (revealed) {
      const answer = poll.options[poll.answer];
      line = poll.choice === null || poll.choice === undefined ? fmt(L.room_none, { answer })
        : fmt(poll.right ? L.room_right : L.room_wrong, { answer });
      box.dataset.right = String(!!poll.right);
    } else {
      line = this.choice === null ? (poll.blocks && poll.blocks.length ? L.room_pick_block : L.room_pick)
        : fmt(L.room_chosen, { choice: poll.options[this.choice] });
    }
    const res = el("div", "pkv-room-line", line);
    res.dataset.role = "room-result";
    box.append(res);
    if (revealed && poll.explain) box.append(el("div", "pkv-room-explain", poll.explain));
    return box;
  }
}
