"""Trace files (JSONL): the CLI's output and the trace viewer's input."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict  # pydantic: typing's only from 3.12

from paged_kv_lab.recording.snapshot import WAITING_QUEUES, Snapshot, StepRecord
from paged_kv_lab.text.i18n import ProblemsError, Text

# -- trace files (JSONL) ----------------------------------------------------------------
# What ``python -m paged_kv_lab run SCENARIO --trace OUT.jsonl`` writes, one JSON object a line:
#   header   {"scenario": <scenario file>, "snapshot": <Snapshot before step 1>}
#            (first line; traces written before the header existed lack it)
#            A snapshot's "group_block_sizes" (KV cache groups of different block sizes) is written
#            only where the sizes differ; without it every group's block size is "block_size".
#            Its "waiting_queues" (beside "waiting", the vLLM 0.34 queue each waiting request is
#            in: kv_holding_waiting, waiting, async_kv_waiting) only where one is not in
#            "waiting"; without it every waiting request is in plain "waiting".
#   steps    StepRecord.to_dict() for steps 1, 2, 3... in order
# outputs  {"outputs": {request id: {"token_ids": [...], "text": str, "finish_reason": str | None,
#                                      "stop_reason": str (only when a stop string ended it)}}}
#            (last line; a file cut short lacks it), with ``"parents": {parent id: [child ids]}``
# when some request had n > 1 (its children, in index order: kvcore/engine/parallel_sampling.py)
# The three *_line functions are the only writers of the format; read_trace the only reader.


def header_line(scenario: dict[str, Any], initial: Snapshot) -> str:
    return json.dumps({"scenario": scenario, "snapshot": initial.to_dict()})


def step_line(rec: StepRecord) -> str:
    return json.dumps(rec.to_dict())


def outputs_line(
    outputs: dict[str, dict[str, Any]], parents: dict[str, list[str]] | None = None
) -> str:
    return json.dumps({"outputs": outputs, **({"parents": parents} if parents else {})})


@dataclass(frozen=True)
class Trace:
    """A trace file, read back.

    ``scenario`` (the scenario file, already validated) and ``initial`` (the state before step 1)
    come from the header: both present or both None. ``records[i].step == i + 1`` and each
    record's snapshot is of its own step. There is a header or at least one record.
    """

    scenario: dict[str, Any] | None
    initial: Snapshot | None
    records: tuple[StepRecord, ...]
    outputs: dict[str, dict[str, Any]] | None
    parents: dict[str, list[str]] | None = None  # n > 1: parent id -> child ids (index order)

    def to_jsonl(self) -> str:
        lines = [header_line(self.scenario, self.initial)] if self.initial is not None else []
        lines += [step_line(r) for r in self.records]
        if self.outputs is not None:
            lines.append(outputs_line(self.outputs, self.parents))
        return "\n".join(lines) + "\n"


class TraceError(ProblemsError):
    """A file that is not a readable trace: ``texts`` catalogue sentences naming their line
    ("line 3: not JSON: ..."), ``problems`` their English, ``lines(lang)`` in a language."""

    AROUND = Text("refusal.unreadable_trace")


def _in(where: Text, problem: Text) -> Text:
    """``where: <the problem>``: a problem at a line or a part of one."""
    return Text("problem.at", {"path": where, "problem": problem})


def _at(where: Text, key: str, **fields: Any) -> Text:
    return _in(where, Text(f"problem.record.{key}", fields))


MAX_PROBLEMS = 12
_STEP_KEYS = ("step", "scheduled", "events", "snapshot")


def read_trace(text: str | bytes) -> Trace:
    """Parse a trace file; raise TraceError listing every problem found (at most MAX_PROBLEMS).

    Blank lines are skipped. Nothing is half-read: either a complete Trace or TraceError.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError([Text("problem.record.not_utf8", {"error": str(e)})]) from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise TraceError([Text("problem.record.empty")])
    _refuse_scenario_file(text)
    problems: list[Text] = []
    scenario = initial = outputs = parents = None
    records: list[StepRecord] = []
    outputs_at = None
    for i, (n, line) in enumerate(lines):
        if len(problems) > MAX_PROBLEMS:
            break
        where = Text("problem.record.line", {"line": n})
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(_at(where, "not_json", error=e.msg, column=e.colno))
            continue
        if not isinstance(d, dict):
            problems.append(_at(where, "not_object"))
            continue
        if outputs_at is not None:
            problems.append(_at(where, "after_outputs", outputs=outputs_at))
            continue
        if "step" in d:
            missing = [k for k in _STEP_KEYS if k not in d]
            if missing:
                problems.append(_at(where, "step_missing", keys=", ".join(map(repr, missing))))
                continue
            rec = _validated(
                _step_adapter(), _upgraded_step_line(line, d), _at(where, "step"), problems
            )
            if rec is None:
                continue
            expected = records[-1].step + 1 if records else 1
            if rec.step != expected:
                if records:
                    problems.append(_at(where, "step_after", step=rec.step, last=records[-1].step))
                else:
                    problems.append(_at(where, "step_first", step=rec.step))
            elif rec.snapshot.step != rec.step:
                at = {"step": rec.step, "other": rec.snapshot.step}
                problems.append(_at(where, "snapshot_of", **at))
            else:
                problems += [_in(where, p) for p in _snapshot_problems(rec.snapshot)]
            records.append(rec)
        elif "outputs" in d and set(d) <= {"outputs", "parents"}:
            outputs_at = where
            outputs = _validated(
                _outputs_adapter(),
                json.dumps(d["outputs"]),
                _at(where, "outputs_shape"),
                problems,
            )
            if "parents" in d:
                parents = _validated(
                    _parents_adapter(),
                    json.dumps(d["parents"]),
                    _at(where, "parents_shape"),
                    problems,
                )
                unknown = sorted(
                    {c for kids in (parents or {}).values() for c in kids} - set(outputs or {})
                )
                if outputs is not None and unknown:
                    problems.append(_at(where, "orphans", ids=", ".join(unknown[:5])))
        elif "scenario" in d or "snapshot" in d:
            if i != 0:
                problems.append(_at(where, "header_not_first"))
                continue
            missing = [k for k in ("scenario", "snapshot") if k not in d]
            if missing:
                problems.append(_at(where, "header_missing", keys=", ".join(map(repr, missing))))
                continue
            scenario = _header_scenario(d["scenario"], _at(where, "header_scenario"), problems)
            initial = _validated(
                _snapshot_adapter(),
                json.dumps(d["snapshot"]),
                _at(where, "header_snapshot"),
                problems,
            )
            if initial is not None:
                if initial.step != 0:
                    problems.append(_at(where, "header_step", step=initial.step))
                problems += [_in(where, p) for p in _snapshot_problems(initial)]
        else:
            problems.append(_at(where, "not_a_line", keys=", ".join(sorted(map(str, d)))[:80]))
    if not problems and initial is None and not records:
        problems.append(Text("problem.record.nothing"))
    if problems:
        if len(problems) > MAX_PROBLEMS:
            problems = problems[:MAX_PROBLEMS] + [Text("problem.record.more")]
        raise TraceError(problems)
    return Trace(scenario, initial, tuple(records), outputs, parents)


def _refuse_scenario_file(text: str) -> None:
    """A scenario file uploaded by mistake gets its own message, not a line-by-line complaint."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(whole, dict) and not {"step", "snapshot", "outputs"} & set(whole):
        raise TraceError([Text("problem.record.scenario_file")])


def _header_scenario(d: Any, what: Text, problems: list[Text]) -> dict[str, Any] | None:
    from paged_kv_lab.run.scenario import ScenarioError, load_scenario, scenario_to_dict

    if not isinstance(d, dict):
        problems.append(_at(what, "not_object"))
        return None
    try:
        return scenario_to_dict(load_scenario(d))
    except ScenarioError as e:
        problems.extend(_in(what, p) for p in e.texts)
        return None


# -- the schema: pydantic over the records' own frozen dataclasses ----------------------------
class _Output(TypedDict):
    token_ids: list[int]
    text: str
    finish_reason: Optional[str]
    stop_reason: NotRequired[str]  # the stop string that ended it (requests[].stop)


@functools.cache
def _step_adapter() -> TypeAdapter:
    return TypeAdapter(StepRecord)


@functools.cache
def _snapshot_adapter() -> TypeAdapter:
    return TypeAdapter(Snapshot)


@functools.cache
def _outputs_adapter() -> TypeAdapter:
    return TypeAdapter(dict[str, _Output])


@functools.cache
def _parents_adapter() -> TypeAdapter:
    return TypeAdapter(dict[str, list[str]])


MAX_PROBLEMS_PER_PART = 4


def _validated(adapter: TypeAdapter, text: str, what: Text, problems: list[Text]):
    """The value ``text`` (JSON) holds, checked strictly against the adapter's type (no
    coercion: "3" is not an int); or None, with each problem and its path added to ``problems``."""
    from paged_kv_lab.run.scenario import pydantic_said

    try:
        return adapter.validate_json(text, strict=True)
    except ValidationError as err:
        data = json.loads(text)
        by_place: dict[tuple, list[Text]] = {}  # a union's members fail at the same place: one line
        for e in err.errors(include_url=False):
            where, got = _describe(e, data)
            if e["type"] == "missing":
                by_place[(where, got, "missing")] = []
            else:
                at = {"said": pydantic_said(e), "got": got}
                by_place.setdefault((where, got), []).append(Text("problem.record.said_got", at))
        said = []
        for (where, got, *missing), saids in by_place.items():
            if missing:
                said.append(Text("problem.record.missing", {"path": where, "key": got}))
                continue
            one = saids[0]
            for other in list(dict.fromkeys(saids))[1:]:
                one = Text("pydantic.either", {"a": one, "b": other})
            said.append(Text("problem.at", {"path": where, "problem": one}))
        problems.extend(_in(what, p) for p in said[:MAX_PROBLEMS_PER_PART])
        if len(said) > MAX_PROBLEMS_PER_PART:
            problems.append(_at(what, "and_more", n=len(said) - MAX_PROBLEMS_PER_PART))
        return None


def _describe(e: dict, data: Any) -> tuple[str, str]:
    """("snapshot.blocks[2].ref_cnt", '"x"') from one pydantic error: the place and the value
    found there (for a missing key, the place holding it and the key's name)."""
    parts: list[str] = []
    cur = data
    for part in e["loc"]:
        if isinstance(cur, dict) and part not in cur and cur.get("kind") == part:
            continue  # the tag pydantic adds for a tagged union member
        if isinstance(part, str) and not isinstance(cur, dict):
            continue  # a member of a plain union ("int", "float"): same place
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            cur = None
    if e["type"] == "missing" and parts:
        return "".join(parts[:-1]).lstrip(".") or "value", repr(parts[-1].lstrip("."))
    return "".join(parts).lstrip(".") or "value", _short(e["input"])


def _upgraded_step_line(line: str, d: dict[str, Any]) -> str:
    """The step line, its events rewritten in today's shape if it was written before events
    were typed ({"kind", "request_id", "block_ids", "group", "data": {...}})."""
    evs = d.get("events")
    if not isinstance(evs, list) or not any(isinstance(e, dict) and "data" in e for e in evs):
        return line
    return json.dumps({**d, "events": [_upgrade_event(e) for e in evs]})


# Fields renamed when events became typed: kind -> {old data key: new field}.
_RENAMED = {
    "scheduled": {"kind": "phase"},
    "evicted": {"hash": "block_hash"},
    "cached": {"hashes": "block_hashes"},
}


def _upgrade_event(e: Any) -> Any:
    if not isinstance(e, dict) or not isinstance(e.get("data"), dict):
        return e
    data = dict(e["data"])
    kind = e.get("kind")
    for old, new in _RENAMED.get(kind, {}).items():
        if old in data:
            data[new] = data.pop(old)
    if kind == "preempted" and isinstance(data.get("reason"), str):
        data["needed_by"] = data.pop("reason").removesuffix(" needed blocks")
    base = {k: v for k, v in e.items() if k != "data"}
    return {**data, **base}


def _short(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (dict, list, str, int, float, bool, type(None))) else repr(v)
    return s if len(s) <= 40 else s[:39] + "…"


def _snapshot_problems(s: Snapshot) -> list[Text]:
    """What the pictures rely on beyond types: block ids 0..n-1 and every id referring to one."""
    n = s.num_gpu_blocks
    out = []
    if s.block_size < 1 or n < 1:
        out.append(Text("problem.record.snapshot_sizes", {"block_size": s.block_size, "n": n}))
    sizes = s.group_block_sizes  # empty: every group's is block_size
    if sizes and (len(sizes) != len(s.groups) or any(b < 1 or s.block_size % b for b in sizes)):
        at = {"sizes": list(sizes), "groups": len(s.groups), "block_size": s.block_size}
        out.append(Text("problem.record.snapshot_group_sizes", at))
    wq = s.waiting_queues  # empty: every waiting request is in plain "waiting"
    if wq and (len(wq) != len(s.waiting) or not set(wq) <= set(WAITING_QUEUES)):
        at = {"n": len(s.waiting), "queues": _short(list(wq))}
        out.append(Text("problem.record.snapshot_waiting_queues", at))
    if [b.block_id for b in s.blocks] != list(range(n)):
        out.append(Text("problem.record.snapshot_order", {"last": n - 1}))
    refs = (
        list(s.free_queue)
        + [b for ids in s.hash_map.values() for b in ids]
        + [b for r in s.requests for t in r.block_tables for b in t]
    )
    bad = sorted({b for b in refs if not 0 <= b < n})
    if bad:
        out.append(Text("problem.record.snapshot_outside", {"ids": str(bad[:5]), "n": n}))
    return out
