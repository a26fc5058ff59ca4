// The decoder: a run's head and steps as the server wrote them (player/payload.py) into the
// snapshots and steps the player draws. It is the only one: tests/test_browser_decoder.py holds
// what it rebuilds against the engine's own snapshots, in a real browser.
//
// The wire's short keys are not written here either: they are player/assets/wire.json, sent
// with a run's head (or inlined by the static export). Every object comes out under the names
// of recording/snapshot.py (vLLM's names): block.ref_cnt, request.block_tables, snap.free_queue...

let WIRE = null;

export function setWire(wire) { if (wire) WIRE = wire; }

export function hasWire() { return WIRE !== null; }

function named(spec, o) {
  const out = {};
  for (const name in spec) out[name] = o[spec[name]];
  return out;
}

function block(b) { return named(WIRE.block, b); }
function request(r) { return named(WIRE.request, r); }

// A whole snapshot (the head's state before step 1).
export function decodeSnapshot(s) {
  const snap = named(WIRE.snapshot, s);
  snap.blocks = snap.blocks.map(block);
  snap.requests = snap.requests.map(request);
  return snap;
}

// The snapshot after step d: the one before with d's changed blocks and requests put in, the
// request order and the free queue where d moved them, and d's scalars.
export function applyDelta(prev, d) {
  const S = WIRE.snapshot;
  const snap = named(S, d);
  const blocks = prev.blocks.slice();
  for (const b of d[S.blocks]) { const x = block(b); blocks[x.block_id] = x; }
  const byId = new Map(prev.requests.map((r) => [r.request_id, r]));
  for (const r of d[S.requests]) { const x = request(r); byId.set(x.request_id, x); }
  const order = d[WIRE.step.request_order] || prev.requests.map((r) => r.request_id);
  snap.blocks = blocks;
  snap.free_queue = d[S.free_queue] || prev.free_queue;
  snap.requests = order.map((id) => byId.get(id));
  return snap;
}

// What ran in step d: its events (each {kind, request_id, block_ids, text, group}), the tokens
// scheduled and their phases, the blocks it changed, narration, summary, new vocab and prompts.
export function decodeStep(d) {
  const st = named(WIRE.step, d);
  st.events = st.events.map((e) => Object.fromEntries(WIRE.event.map((name, i) => [name, e[i]])));
  return st;
}
