"""A recorded run as the compact JSON the browser player steps through.

The player gets the state before step 1 whole (``head``) and then one *step* per engine step:
what ran (events with their sentences, scheduled tokens, narration) and what changed in the
snapshot (only the blocks and requests that differ from the step before, the free queue only
when it moved). ``apply_delta`` rebuilds whole snapshots the way player.js does, so tests can
hold the two against the engine's own snapshots.

The steps, applied in order onto the head's snapshot, give exactly ``snapshot_dict`` of every
record's snapshot (tests/test_player.py holds this against an independent engine). No Streamlit here: the app, the static export and the CLI share this module.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Sequence

from record.snapshot import BlockView, RequestView, Snapshot, StepRecord

from words.sentences import changed_blocks, reason, step_sentences

Decode = Callable[[Sequence[int]], str]
Narrate = Callable[[StepRecord], list[str]]

FORMAT = 1
# One colour per request, the same in every panel; none grey/yellow/black (free, cached-free, null).
PALETTE = (
    "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e", "#17becf",
    "#e377c2", "#8c564b", "#1b9e77", "#7570b3", "#e7298a", "#66a61e",
)


def color_map(request_ids: Iterable[str]) -> dict[str, str]:
    """Stable request -> colour, in order of first appearance."""
    out: dict[str, str] = {}
    for rid in request_ids:
        if rid not in out:
            out[rid] = PALETTE[len(out) % len(PALETTE)]
    return out


# -- whole snapshots -------------------------------------------------------------------
def block_dict(b: BlockView) -> dict[str, Any]:
    return {"i": b.block_id, "r": b.ref_cnt, "z": b.is_null, "h": b.block_hash, "p": b.parent_hash,
            "g": b.group, "k": list(b.token_ids), "o": list(b.owners), "hn": b.block_hash_num_tokens}


def request_dict(r: RequestView) -> dict[str, Any]:
    """A request without its prompt ids (they never change: the head carries them once)."""
    return {"id": r.request_id, "st": r.status, "np": r.num_prompt_tokens, "no": r.num_output_tokens,
            "nc": r.num_computed_tokens, "nk": r.num_cached_tokens, "bt": [list(t) for t in r.block_tables],
            "pe": r.num_preemptions, "pri": r.priority, "ar": r.arrival, "ot": list(r.output_token_ids),
            "tx": r.text, "salt": r.cache_salt}


def snapshot_dict(s: Snapshot) -> dict[str, Any]:
    return {"step": s.step, "blocks": [block_dict(b) for b in s.blocks], "queue": list(s.free_queue),
            "reqs": [request_dict(r) for r in s.requests], "wait": list(s.waiting), "run": list(s.running),
            "usage": s.usage, "free": s.num_free_blocks, "pc": dict(s.prefix_cache)}


# -- deltas ----------------------------------------------------------------------------
def delta(prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
    """What ``cur`` changes in ``prev``: changed blocks, changed requests, the request order and
    the queue when they moved, and the small scalars always."""
    d: dict[str, Any] = {k: cur[k] for k in ("step", "wait", "run", "usage", "free", "pc")}
    d["blocks"] = [b for b, p in zip(cur["blocks"], prev["blocks"]) if b != p] + cur["blocks"][len(prev["blocks"]):]
    if cur["queue"] != prev["queue"]:
        d["queue"] = cur["queue"]
    old = {r["id"]: r for r in prev["reqs"]}
    d["reqs"] = [r for r in cur["reqs"] if old.get(r["id"]) != r]
    order = [r["id"] for r in cur["reqs"]]
    if order != [r["id"] for r in prev["reqs"]]:
        d["order"] = order
    return d


def apply_delta(prev: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """The whole snapshot after ``d`` (player.js does the same in the browser)."""
    blocks = list(prev["blocks"])
    for b in d["blocks"]:
        if b["i"] < len(blocks):
            blocks[b["i"]] = b
        else:
            blocks.append(b)
    by_id = {r["id"]: r for r in prev["reqs"]}
    by_id.update({r["id"]: r for r in d["reqs"]})
    order = d.get("order", [r["id"] for r in prev["reqs"]])
    out = {k: d[k] for k in ("step", "wait", "run", "usage", "free", "pc")}
    out.update(blocks=blocks, queue=d.get("queue", prev["queue"]), reqs=[by_id[i] for i in order])
    return out


# -- the run ---------------------------------------------------------------------------
def _summary(rec: StepRecord, lang: str) -> str:
    parts = [f"{e.request_id}: {getattr(e, 'num_tokens', '?')} ({reason(getattr(e, 'phase', ''), lang)})"
             for e in rec.events if e.kind == "scheduled"]
    total = sum(rec.scheduled.values())
    head = f"第 {rec.step} 步：调度 {total} 个 token" if lang == "zh" else f"Step {rec.step}: {total} tokens scheduled"
    return head + (" — " + ", ".join(parts) if parts else "")


class RunEncoder:
    """One recorded run encoded for one language (and narration), step by step, in order.

    Invariant: ``steps[i]`` encodes record i + 1 as a delta on the snapshot before it (plus what
    ran: ``sched`` request -> tokens, ``ph`` request -> phase, the events), and its
    ``vocab`` holds the texts of exactly the token ids no earlier step (nor the head) used: so any
    browser that holds steps 1..k holds every text they need. Encoded steps depend only on the run,
    so one encoder serves every session playing it (``extend`` is safe from several threads).
    """

    def __init__(self, initial: Snapshot | None, *, lang: str = "en", decode: Decode | None = None,
                 narrate: Narrate | None = None, request_ids: Sequence[str] = (),
                 meta: dict[str, Any] | None = None, first_record: StepRecord | None = None) -> None:
        """``initial`` is the state before step 1; a trace without one starts at ``first_record``
        (its step 1): then the browser's position k means step k + 1 (``head["first"]`` is 1)."""
        self.first = 0 if initial is not None else 1
        if initial is None:
            if first_record is None:
                raise ValueError("a run without the state before step 1 needs its first record")
            initial = first_record.snapshot
        self.lang = lang
        self.decode = decode
        self.narrate = narrate
        self._multi = len(initial.groups) > 1
        self._seen: set[int] = set()
        self._lock = threading.Lock()
        self._prev = snapshot_dict(initial)
        self._prompts_seen = {r.request_id for r in initial.requests}
        prompts = {r.request_id: list(r.prompt_token_ids) for r in initial.requests}
        tokens = [t for p in prompts.values() for t in p] + [t for b in initial.blocks for t in b.token_ids]
        ids = list(request_ids) + [r.request_id for r in initial.requests]
        self.head = {"format": FORMAT, "lang": lang, "block_size": initial.block_size,
                     "num_gpu_blocks": initial.num_gpu_blocks, "groups": [dict(g) for g in initial.groups],
                     "colors": color_map(ids), "prompts": prompts, "initial": self._prev,
                     "decoded": decode is not None, "vocab": self._vocab(tokens), "first": self.first,
                     **(meta or {})}
        if first_record is not None and self.first:
            self.head["step0"] = self._step(first_record, self._prev, self._prev)
        self.steps: list[dict[str, Any]] = []

    def _vocab(self, ids: Iterable[int]) -> dict[str, str]:
        out = {}
        for t in ids:
            if t in self._seen:
                continue
            self._seen.add(t)
            if self.decode is not None:
                try:
                    out[str(t)] = self.decode([t])
                except Exception:  # an id the tokenizer does not know is shown as its number
                    out[str(t)] = f"#{t}"
        return out

    def extend(self, records: Sequence[StepRecord]) -> list[dict[str, Any]]:
        """Encode the records not encoded yet (``records[i].step == i + 1``); returns all steps
        (``steps[i]`` is record ``i + first``)."""
        with self._lock:
            for rec in records[self.first + len(self.steps):]:
                cur = snapshot_dict(rec.snapshot)
                self.steps.append(self._step(rec, self._prev, cur))
                self._prev = cur
            return self.steps

    def _step(self, rec: StepRecord, prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
        sentences = step_sentences(rec.events, self.lang, self.decode, self._multi)
        events = [[str(e.kind), e.request_id, list(e.block_ids), text, e.group]
                  for e, (_, text) in zip(rec.events, sentences)]
        new_prompts = {r.request_id: list(r.prompt_token_ids) for r in rec.snapshot.requests
                       if r.request_id not in self._prompts_seen}
        self._prompts_seen.update(new_prompts)
        tokens = [t for p in new_prompts.values() for t in p] + [t for b in cur["blocks"] for t in b["k"]]
        tokens += [t for r in cur["reqs"] for t in r["ot"]]
        d = delta(prev, cur)
        phases = {e.request_id: e.phase for e in rec.events if e.kind == "scheduled"}
        d.update(ev=events, sched=dict(rec.scheduled), ph=phases, changed=sorted(changed_blocks(rec.events)),
                 nar=self.narrate(rec) if self.narrate is not None else [], sum=_summary(rec, self.lang),
                 vocab=self._vocab(tokens))
        if new_prompts:
            d["prompts"] = new_prompts
        return d


def run_payload(initial: Snapshot | None, records: Sequence[StepRecord], *, done: bool = True,
                **encoder_kw) -> dict:
    """A whole recorded run in one payload (the static export, the CLI's --html)."""
    enc = RunEncoder(initial, first_record=records[0] if initial is None else None, **encoder_kw)
    return {"run": "export", "base": 0, "head": enc.head, "steps": list(enc.extend(records)), "done": done,
            "hold_at": None, "goto": None}
