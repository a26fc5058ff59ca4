"""Lessons as data: a scenario in the engine's format, narration and questions.

Narration is tied to what really happens, not to step numbers: a ``Moment``
names an event kind (and optionally a request and a predicate on the event) and
its text is shown at the first step where such an event occurs. Tests check
that every moment of every lesson does occur.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from paged_kv_lab.record.events import Allocated, Cached, CacheHit, Event, Freed, Scheduled, Touched
from paged_kv_lab.record.snapshot import StepRecord

Text = dict  # {"en": ..., "zh": ...}


@dataclass(frozen=True)
class Moment:
    kind: str  # event kind
    text: Text
    request: str | None = None  # only events of this request
    where: str | None = None  # name of a predicate in PREDICATES
    key: bool = True  # the lesson claims to show this (tests assert it happens)


@dataclass(frozen=True)
class Question:
    prompt: Text
    options: tuple[Text, ...]
    answer: int
    explain: Text


@dataclass(frozen=True)
class Toggle:
    """An engine setting the lesson page offers as a switch."""

    setting: str
    label: Text
    options: tuple[Any, ...]
    option_labels: tuple[Text, ...] = ()
    help: Text = field(default_factory=dict)


@dataclass(frozen=True)
class Lesson:
    id: str
    number: int
    icon: str
    title: Text
    summary: Text
    scenario: dict
    intro: Text
    moments: tuple[Moment, ...] = ()
    outro: Text = field(default_factory=dict)
    questions: tuple[Question, ...] = ()
    toggles: tuple[Toggle, ...] = ()
    focus: tuple[str, ...] = ("cache_hit",)  # event kinds offered first in "run until"
    panels: tuple[str, ...] = ()  # extra panels: memory, budget, held, myths
    # the "hybrid" layer mix, repeated over the model's layers
    layer_pattern: tuple[str, ...] | None = None

    def scenario_dict(self, num_layers: int | None = None, overrides: dict | None = None) -> dict:
        """The scenario in the engine's format, with settings overridden.

        The pseudo-setting ``layers`` ("uniform" / "hybrid") expands ``layer_pattern``
        over the loaded model's layer count into ``engine.layer_types``.
        """
        d = copy.deepcopy(self.scenario)
        eng = d.setdefault("engine", {})
        overrides = dict(overrides or {})
        layers = overrides.pop("layers", None)
        # pseudo-setting: which drafter a speculative lesson uses ("ngram" / "draft_model")
        spec_method = overrides.pop("spec_method", None)
        # pseudo-setting: "<request id>:<kv_load_failure_policy>" makes that request's first
        # load from the CPU tier fail ("none": every load succeeds)
        failed_load = overrides.pop("failed_load", None)
        eng.update(overrides)
        if (
            isinstance(failed_load, str)
            and ":" in failed_load
            and isinstance(eng.get("cpu_offload"), dict)
        ):
            rid, policy = failed_load.rsplit(":", 1)
            eng["cpu_offload"] = {
                **eng["cpu_offload"],
                "fail_loads": [rid],
                "kv_load_failure_policy": policy,
            }
        if spec_method and isinstance(eng.get("speculative"), dict):
            eng["speculative"] = {**eng["speculative"], "method": spec_method}
        if layers == "hybrid" and self.layer_pattern and num_layers and eng.get("sliding_window"):
            eng["layer_types"] = [
                self.layer_pattern[i % len(self.layer_pattern)] for i in range(num_layers)
            ]
        return d


# -- predicates on events: (event, record) -> bool -----------------------------------
# Each reads the fields of the one kind its moments name (record.events).
def _rescue(e: Touched, rec: StepRecord) -> bool:
    """A touch that pulled a free cached block out of the middle of the queue."""
    return any(p > 0 for p in e.queue_positions) and bool(e.from_queue)


def _shared(e: Touched, rec: StepRecord) -> bool:
    """A touch of blocks another running request still holds (ref_cnt becomes > 1)."""
    return len(e.from_queue) < len(e.block_ids)


def _evicts(e: Allocated, rec: StepRecord) -> bool:
    return bool(e.evicted_hashes)


def _to_head(e: Freed, rec: StepRecord) -> bool:
    return bool(e.to_head)


def _to_tail(e: Freed, rec: StepRecord) -> bool:
    return bool(e.to_tail)


def _self_hit(e: CacheHit, rec: StepRecord) -> bool:
    return e.preempted_before


def _chunk_with_decodes(e: Scheduled, rec: StepRecord) -> bool:
    phases = {x.phase for x in rec.events if isinstance(x, Scheduled)}
    return e.phase == "chunk" and "decode" in phases


def _reused_unhashed(e: Allocated, rec: StepRecord) -> bool:
    """Allocated blocks that were freed without a hash earlier (they sat at the head)."""
    return not e.evicted_hashes


def _still_used(e: Freed, rec: StepRecord) -> bool:
    return bool(e.still_used)


def _decode_alloc(e: Allocated, rec: StepRecord) -> bool:
    return any(
        isinstance(x, Scheduled) and x.request_id == e.request_id and x.phase == "decode"
        for x in rec.events
    )


def _with_drafts(e: Scheduled, rec: StepRecord) -> bool:
    """A decode that carries draft tokens after its last token (speculative decoding)."""
    return e.phase == "decode" and e.num_tokens > 1


def _lookahead_only(e: Allocated, rec: StepRecord) -> bool:
    """Blocks allocated where no token scheduled this step lands: only for lookahead slots (the
    draft model writes K/V there)."""
    sched = [x for x in rec.events if isinstance(x, Scheduled) and x.request_id == e.request_id]
    req = next((r for r in rec.snapshot.requests if r.request_id == e.request_id), None)
    if not sched or req is None or not req.block_tables:
        return False
    end = sched[0].start + sched[0].num_tokens
    table = req.block_tables[e.group or 0]
    bs = rec.snapshot.block_size
    return any(b in table and table.index(b) * bs >= end for b in e.block_ids)


def _after_verify(e: Event, rec: StepRecord) -> bool:
    """Blocks cached after the same request's drafts were accepted in this step."""
    accepted = [
        i
        for i, x in enumerate(rec.events)
        if x.kind == "draft_accepted" and x.request_id == e.request_id
    ]
    return bool(accepted) and rec.events.index(e) > accepted[0]


def _dup_hash(e: Cached, rec: StepRecord) -> bool:
    """Blocks cached under a hash that another block already held (BlockHashToBlockMap keeps
    both)."""
    hmap = rec.snapshot.hash_map
    return any(
        bid in ids and ids[0] != bid
        for bid, h in zip(e.block_ids, e.block_hashes)
        for ids in (hmap.get(f"{h}@{e.group or 0}", ()),)
    )


def _dup_decode(e: Cached, rec: StepRecord) -> bool:
    return _dup_hash(e, rec) and _decode_alloc(e, rec)


def _reason(value: str) -> Callable[[Event, StepRecord], bool]:
    return lambda e, rec: getattr(e, "reason", None) == value


PREDICATES: dict[str, Callable[[Event, StepRecord], bool]] = {
    "rescue": _rescue,
    "shared": _shared,
    "evicts": _evicts,
    "to_head": _to_head,
    "to_tail": _to_tail,
    "self_hit": _self_hit,
    "chunk_with_decodes": _chunk_with_decodes,
    "reused_unhashed": _reused_unhashed,
    "still_used": _still_used,
    "decode_alloc": _decode_alloc,
    "with_drafts": _with_drafts,
    "lookahead_only": _lookahead_only,
    "after_verify": _after_verify,
    "dup_hash": _dup_hash,
    "dup_decode": _dup_decode,
    "preempted_reason": _reason("preempted"),
    "window_reason": _reason("window"),
    "after_preempt": _reason("preempted_this_step"),
    "budget_reason": _reason("token_budget"),
    "error_reason": _reason("error"),
    "load_ok": lambda e, rec: not getattr(e, "load_failed", False),
    "load_failed": lambda e, rec: bool(getattr(e, "load_failed", False)),
}


def moment_matches(m: Moment, e: Event, rec: StepRecord) -> bool:
    if e.kind != m.kind or (m.request is not None and e.request_id != m.request):
        return False
    return m.where is None or PREDICATES[m.where](e, rec)


def moment_steps(lesson: Lesson, records: Sequence[StepRecord]) -> dict[int, int]:
    """moment index -> the first step where it happens (moments that never happen are absent)."""
    found: dict[int, int] = {}
    for rec in records:
        for i, m in enumerate(lesson.moments):
            if i not in found and any(moment_matches(m, e, rec) for e in rec.events):
                found[i] = rec.step
    return found


def narration_for_step(lesson: Lesson, records: Sequence[StepRecord], step: int) -> list[Moment]:
    """The moments whose first occurrence is at ``step`` (records up to that step suffice)."""
    found = moment_steps(lesson, [r for r in records if r.step <= step])
    return [lesson.moments[i] for i, s in sorted(found.items()) if s == step]


def narration_fields(e: Event) -> dict[str, Any]:
    """The event's fields for a moment's text: ``{req}``, ``{blocks}`` and each field by name
    (``{num_tokens}``, ``{slots}``, ``{policy}``...); lists as "[1, 2]", dicts left out."""
    out = {
        k: ("[" + ", ".join(map(str, v)) + "]" if isinstance(v, list) else v)
        for k, v in e.to_dict().items()
        if not isinstance(v, dict)
    }
    out.update(req=e.request_id or "", blocks="[" + ", ".join(map(str, e.block_ids)) + "]")
    return out
