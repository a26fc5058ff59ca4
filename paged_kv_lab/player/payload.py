"""A recorded run as the compact JSON the browser player steps through.

The player gets the state before step 1 whole (``head``) and then one *step* per engine step:
what ran (events with their sentences, scheduled tokens, narration) and what changed in the
snapshot (only the blocks and requests that differ from the step before, the free queue only
when it moved). The keys on the wire are short; each is defined once, in assets/wire.json, which
this module encodes with and the browser's decoder (assets/decode.js) decodes with.

The steps, applied in order onto the head's snapshot by the decoder, give exactly
``snapshot_dict`` of every record's snapshot (tests/browser/test_browser_decoder.py holds this in a
real
browser). No Streamlit here: the app, the static export and the CLI share this module.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from paged_kv_lab.recording.snapshot import BlockView, RequestView, Snapshot, StepRecord
from paged_kv_lab.text.i18n import player_strings, tr
from paged_kv_lab.why.sentences import changed_blocks, kept_blocks, reason, step_sentences
from paged_kv_lab.why.source_links import VLLM_REPO, VLLM_TAG

# The wire keys, per kind: the name the code uses -> the key on the wire (assets/wire.json).
WIRE: dict[str, Any] = {
    k: v
    for k, v in json.loads(
        (Path(__file__).parent / "assets" / "wire.json").read_text(encoding="utf-8")
    ).items()
    if not k.startswith("_")
}
B, R, S, T = WIRE["block"], WIRE["request"], WIRE["snapshot"], WIRE["step"]

# where vLLM 0.34.0 keeps its three waiting queues (Scheduler.__init__ makes them; schedule()
# takes kv_holding_waiting first): the player's labels link here
WAITING_QUEUES_SOURCE = f"{VLLM_REPO}/blob/{VLLM_TAG}/vllm/v1/core/sched/scheduler.py"

Decode = Callable[[Sequence[int]], str]
Narrate = Callable[[StepRecord], list[str]]

FORMAT = 1
# One colour per request, the same in every panel; none grey/yellow/black (free, cached-free, null).
PALETTE = (
    "#1f77b4",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#e377c2",
    "#8c564b",
    "#1b9e77",
    "#7570b3",
    "#e7298a",
    "#66a61e",
)


def color_map(request_ids: Iterable[str]) -> dict[str, str]:
    """Stable request -> colour, in order of first appearance."""
    out: dict[str, str] = {}
    for rid in request_ids:
        if rid not in out:
            out[rid] = PALETTE[len(out) % len(PALETTE)]
    return out


# -- whole snapshots -------------------------------------------------------------------
def _encoder(name: str, spec: dict[str, str], as_json: dict[str, str]) -> Callable[[Any], dict]:
    """``view -> wire dict`` for ``spec``: each field, in order, under its wire key, made plain JSON
    by the helper ``as_json`` names where it is not already. Compiled from ``spec`` once (as
    dataclasses builds ``__init__``), so it costs what the dict written out by hand would; its
    text is the function's ``source``."""
    if not all(field.isidentifier() and isinstance(key, str) for field, key in spec.items()):
        raise ValueError(f"wire.json: bad {name} field names")
    items = ", ".join(
        f"{key!r}: {as_json[f]}(v.{f})" if f in as_json else f"{key!r}: v.{f}"
        for f, key in spec.items()
    )
    source = f"def {name}(v):\n    return {{{items}}}\n"
    scope = {"_lists": _lists, "_blocks": _blocks, "_requests": _requests}
    exec(source, scope)
    fn = scope[name]
    fn.source = source
    return fn


def _lists(tables: Sequence[Sequence[int]]) -> list[list[int]]:
    return [list(t) for t in tables]


def _blocks(blocks: Sequence[BlockView]) -> list[dict[str, Any]]:
    return [block_dict(b) for b in blocks]


def _requests(requests: Sequence[RequestView]) -> list[dict[str, Any]]:
    return [request_dict(r) for r in requests]


block_dict = _encoder("block_dict", B, {"token_ids": "list", "owners": "list"})
# a request without its prompt ids: they never change, and the head carries them once
request_dict = _encoder("request_dict", R, {"block_tables": "_lists", "output_token_ids": "list"})
snapshot_dict = _encoder(
    "snapshot_dict",
    S,
    {
        "blocks": "_blocks",
        "free_queue": "list",
        "requests": "_requests",
        "waiting": "list",
        "running": "list",
        "prefix_cache": "dict",
    },
)


_SCALARS = [key for name, key in S.items() if name not in ("blocks", "free_queue", "requests")]


def delta(prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
    """What ``cur`` changes in ``prev`` (wire dicts): changed blocks, changed requests, the request
    order and the queue when they moved, and the small scalars always."""
    blocks, queue, reqs, rid = S["blocks"], S["free_queue"], S["requests"], R["request_id"]
    d: dict[str, Any] = {k: cur[k] for k in _SCALARS}
    d[blocks] = [b for b, p in zip(cur[blocks], prev[blocks]) if b != p] + cur[blocks][
        len(prev[blocks]) :
    ]
    if cur[queue] != prev[queue]:
        d[queue] = cur[queue]
    old = {r[rid]: r for r in prev[reqs]}
    d[reqs] = [r for r in cur[reqs] if old.get(r[rid]) != r]
    order = [r[rid] for r in cur[reqs]]
    if order != [r[rid] for r in prev[reqs]]:
        d[T["request_order"]] = order
    return d


def head_groups(
    groups: Sequence[dict[str, Any]], group_block_sizes: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """The head's KV cache groups: each group's description, with its own ``block_size`` where the
    groups' sizes differ (``Snapshot.group_block_sizes``, empty otherwise). A group without one has
    the head's ``block_size``, so a run whose groups share one size is encoded as before the field
    existed. The step player's head and the pool player's both take theirs from here."""
    if not group_block_sizes:
        return [dict(g) for g in groups]
    return [{**g, "block_size": bs} for g, bs in zip(groups, group_block_sizes)]


def player_book(lang: str) -> dict[str, Any]:
    """What the browser needs besides a run to play it: the wire keys and its words in ``lang``
    (paged_kv_lab/text/catalogue/). Sent with a run's head, never inside it."""
    return {"wire": WIRE, "strings": {lang: player_strings(lang)}}


# -- the run ---------------------------------------------------------------------------
def _summary(rec: StepRecord, lang: str) -> str:
    parts = [
        f"{e.request_id}: {getattr(e, 'num_tokens', '?')} ({reason(getattr(e, 'phase', ''), lang)})"
        for e in rec.events
        if e.kind == "scheduled"
    ]
    total = sum(rec.scheduled.values())
    return tr("step_summary", lang, step=rec.step, total=total) + (
        " — " + ", ".join(parts) if parts else ""
    )


class RunEncoder:
    """One recorded run encoded for one language (and narration), step by step, in order.

    Invariant: ``steps[i]`` encodes record i + 1 as a delta on the snapshot before it (plus what
    ran: ``sched`` request -> tokens, ``ph`` request -> phase, the events), and its
    ``vocab`` holds the texts of exactly the token ids no earlier step (nor the head) used: so any
    browser that holds steps 1..k holds every text they need. Encoded steps depend only on the run,
    so one encoder serves every session playing it (``extend`` is safe from several threads).
    """

    def __init__(
        self,
        initial: Snapshot | None,
        *,
        lang: str = "en",
        decode: Decode | None = None,
        narrate: Narrate | None = None,
        request_ids: Sequence[str] = (),
        meta: dict[str, Any] | None = None,
        first_record: StepRecord | None = None,
    ) -> None:
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
        tokens = [t for p in prompts.values() for t in p] + [
            t for b in initial.blocks for t in b.token_ids
        ]
        ids = list(request_ids) + [r.request_id for r in initial.requests]
        self.head = {
            "format": FORMAT,
            "lang": lang,
            "block_size": initial.block_size,
            "num_gpu_blocks": initial.num_gpu_blocks,
            "groups": head_groups(initial.groups, initial.group_block_sizes),
            "colors": color_map(ids),
            "prompts": prompts,
            "initial": self._prev,
            "decoded": decode is not None,
            "vocab": self._vocab(tokens),
            "first": self.first,
            **(meta or {}),
        }
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
            for rec in records[self.first + len(self.steps) :]:
                cur = snapshot_dict(rec.snapshot)
                self.steps.append(self._step(rec, self._prev, cur))
                self._prev = cur
            return self.steps

    def _step(self, rec: StepRecord, prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
        sentences = step_sentences(
            rec.events, self.lang, self.decode, self._multi, kept_blocks(rec.snapshot)
        )
        events = [
            [
                {
                    "kind": str(e.kind),
                    "request_id": e.request_id,
                    "block_ids": list(e.block_ids),
                    "text": text,
                    "group": e.group,
                }[name]
                for name in WIRE["event"]
            ]
            for e, (_, text) in zip(rec.events, sentences)
        ]
        new_prompts = {
            r.request_id: list(r.prompt_token_ids)
            for r in rec.snapshot.requests
            if r.request_id not in self._prompts_seen
        }
        self._prompts_seen.update(new_prompts)
        tokens = [t for p in new_prompts.values() for t in p] + [
            t for b in cur[S["blocks"]] for t in b[B["token_ids"]]
        ]
        tokens += [t for r in cur[S["requests"]] for t in r[R["output_token_ids"]]]
        d = delta(prev, cur)
        phases = {e.request_id: e.phase for e in rec.events if e.kind == "scheduled"}
        d.update(
            {
                T["events"]: events,
                T["scheduled"]: dict(rec.scheduled),
                T["phases"]: phases,
                T["changed_blocks"]: sorted(changed_blocks(rec.events)),
                T["narration"]: self.narrate(rec) if self.narrate is not None else [],
                T["summary"]: _summary(rec, self.lang),
                T["vocab"]: self._vocab(tokens),
            }
        )
        if new_prompts:
            d[T["new_prompts"]] = new_prompts
        if rec.snapshot.cpu_pool is not None:  # the CPU tier's pool, whole (it is small)
            d[T["cpu_pool"]] = asdict(rec.snapshot.cpu_pool)
        if rec.snapshot.waiting_queues:  # only where a request waits outside plain "waiting"
            d[T["waiting_queues"]] = {
                "queues": dict(zip(rec.snapshot.waiting, rec.snapshot.waiting_queues)),
                "source": WAITING_QUEUES_SOURCE,
            }
        return d


def run_payload(
    initial: Snapshot | None, records: Sequence[StepRecord], *, done: bool = True, **encoder_kw
) -> dict:
    """A whole recorded run in one payload (the static export, the CLI's --html)."""
    enc = RunEncoder(initial, first_record=records[0] if initial is None else None, **encoder_kw)
    return {
        "run": "export",
        "base": 0,
        "head": enc.head,
        "steps": list(enc.extend(records)),
        "done": done,
        "hold_at": None,
        "goto": None,
    }
