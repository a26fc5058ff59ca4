"""Trace files (JSONL): the CLI's output and the trace viewer's input."""
from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from kvcore.snapshot import Snapshot, StepRecord

# -- trace files (JSONL) ----------------------------------------------------------------
# What ``python -m kvcore run SCENARIO --trace OUT.jsonl`` writes, one JSON object a line:
#   header   {"scenario": <scenario file>, "snapshot": <Snapshot before step 1>}
#            (first line; traces written before the header existed lack it)
#   steps    StepRecord.to_dict() for steps 1, 2, 3... in order
#   outputs  {"outputs": {request id: {"token_ids": [...], "text": str, "finish_reason": str | None}}}
#            (last line; a file cut short lacks it)
# The three *_line functions are the only writers of the format; read_trace the only reader.

def header_line(scenario: dict[str, Any], initial: Snapshot) -> str:
    return json.dumps({"scenario": scenario, "snapshot": initial.to_dict()})


def step_line(rec: StepRecord) -> str:
    return json.dumps(rec.to_dict())


def outputs_line(outputs: dict[str, dict[str, Any]]) -> str:
    return json.dumps({"outputs": outputs})


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

    def to_jsonl(self) -> str:
        lines = [header_line(self.scenario, self.initial)] if self.initial is not None else []
        lines += [step_line(r) for r in self.records]
        if self.outputs is not None:
            lines.append(outputs_line(self.outputs))
        return "\n".join(lines) + "\n"


class TraceError(ValueError):
    """A file that is not a readable trace; ``problems`` name their line ("line 3: not JSON: ...")."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("not a readable trace:\n" + "\n".join(f"  - {p}" for p in self.problems))


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
            raise TraceError([f"not UTF-8 text: {e}"]) from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise TraceError(["empty file"])
    _refuse_scenario_file(text)
    problems: list[str] = []
    scenario = initial = outputs = None
    records: list[StepRecord] = []
    outputs_at = None
    for i, (n, line) in enumerate(lines):
        if len(problems) >= MAX_PROBLEMS:
            problems.append("… (more problems not shown)")
            break
        where = f"line {n}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not JSON: {e.msg} (column {e.colno})")
            continue
        if not isinstance(d, dict):
            problems.append(f"{where}: not a JSON object")
            continue
        if outputs_at is not None:
            problems.append(f"{where}: nothing may follow the outputs line ({outputs_at})")
            continue
        if "step" in d:
            missing = [k for k in _STEP_KEYS if k not in d]
            if missing:
                problems.append(f"{where}: step record missing {', '.join(map(repr, missing))}")
                continue
            rec = _parse(StepRecord.from_dict, d, f"{where}: step record", problems)
            if rec is None or not _typed(rec, StepRecord, f"{where}: step record", problems):
                continue
            expected = records[-1].step + 1 if records else 1
            if rec.step != expected:
                after = f"after step {records[-1].step}" if records else "first"
                problems.append(f"{where}: step {rec.step} {after}: steps must be 1, 2, 3...")
            elif rec.snapshot.step != rec.step:
                problems.append(f"{where}: step {rec.step} holds a snapshot of step {rec.snapshot.step}")
            else:
                problems += [f"{where}: {p}" for p in _snapshot_problems(rec.snapshot)]
            records.append(rec)
        elif set(d) == {"outputs"}:
            outputs_at = where
            if not _outputs_ok(d["outputs"]):
                problems.append(f"{where}: outputs must map request ids to "
                                "{\"token_ids\": [int...], \"text\": str, \"finish_reason\": str or null}")
            else:
                outputs = d["outputs"]
        elif "scenario" in d or "snapshot" in d:
            if i != 0:
                problems.append(f"{where}: a header (scenario + snapshot) must be the first line")
                continue
            missing = [k for k in ("scenario", "snapshot") if k not in d]
            if missing:
                problems.append(f"{where}: header missing {', '.join(map(repr, missing))}")
                continue
            scenario = _header_scenario(d["scenario"], f"{where}: header scenario", problems)
            initial = _parse(Snapshot.from_dict, d["snapshot"], f"{where}: header snapshot", problems)
            if initial is not None and _typed(initial, Snapshot, f"{where}: header snapshot", problems):
                if initial.step != 0:
                    problems.append(f"{where}: header snapshot is of step {initial.step}; it must be 0")
                problems += [f"{where}: {p}" for p in _snapshot_problems(initial)]
        else:
            problems.append(f"{where}: not a trace line (expected a header, a step record or the outputs; "
                            f"got keys {', '.join(sorted(map(str, d)))[:80]})")
    if not problems and initial is None and not records:
        problems.append("no header and no step records: nothing to show")
    if problems:
        raise TraceError(problems)
    return Trace(scenario, initial, tuple(records), outputs)


def _refuse_scenario_file(text: str) -> None:
    """A scenario file uploaded by mistake gets its own message, not a line-by-line complaint."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(whole, dict) and not {"step", "snapshot", "outputs"} & set(whole):
        raise TraceError(["this looks like a scenario file, not a trace: make a trace with "
                          "`python -m kvcore run SCENARIO.json --trace OUT.jsonl` (or open the scenario "
                          "in the Playground)"])


def _parse(fn, d: Any, what: str, problems: list[str]):
    """``fn(d)``, or None with a problem: from_dict raises KeyError/TypeError/... on bad shapes."""
    if not isinstance(d, dict):
        problems.append(f"{what}: not a JSON object")
        return None
    try:
        return fn(d)
    except KeyError as e:
        problems.append(f"{what}: missing key {e.args[0]!r}")
    except (TypeError, ValueError, AttributeError) as e:
        problems.append(f"{what}: {type(e).__name__}: {e}")
    return None


def _header_scenario(d: Any, what: str, problems: list[str]) -> dict[str, Any] | None:
    from kvcore.scenario import ScenarioError, load_scenario, scenario_to_dict
    if not isinstance(d, dict):
        problems.append(f"{what}: not a JSON object")
        return None
    try:
        return scenario_to_dict(load_scenario(d))
    except ScenarioError as e:
        problems.extend(f"{what}: {p}" for p in e.problems)
        return None


def _outputs_ok(o: Any) -> bool:
    return isinstance(o, dict) and all(
        isinstance(v, dict) and isinstance(v.get("token_ids"), list) and _all_int(v["token_ids"])
        and isinstance(v.get("text"), str) and isinstance(v.get("finish_reason"), (str, type(None)))
        for v in o.values())


def _all_int(xs) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) for x in xs)


def _typed(value: Any, hint: Any, path: str, problems: list[str]) -> bool:
    """Check ``value`` against its declared type, recursively (this module's dataclasses, tuples,
    lists, dicts, X | None, int / float / str / bool); False with one problem on the first mismatch."""
    bad = _checker(hint)(value)
    if bad:
        where, msg = bad
        problems.append(f"{path}: {where.lstrip('.') or 'value'}: {msg}")
    return not bad


Mismatch = tuple[str, str] | None    # (where, what) of the first mismatch: (".blocks[2].ref_cnt", "expected int, ...")


@functools.cache
def _checker(hint: Any) -> Callable[[Any], Mismatch]:
    """A function checking values against ``hint``, built once per type (traces hold many ints)."""
    if hint is Any:
        return lambda v: None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = _checker(next(a for a in args if a is not type(None)))
        return (lambda v: None if v is None else inner(v)) if type(None) in args else inner
    if dataclasses.is_dataclass(hint):
        fields_ = [(name, _checker(h)) for name, h in typing.get_type_hints(hint).items()]

        def check_object(v):
            if not isinstance(v, hint):
                return "", "expected an object"
            for name, check in fields_:
                bad = check(getattr(v, name))
                if bad:
                    return f".{name}{bad[0]}", bad[1]
            return None
        return check_object
    if origin in (tuple, list):
        item = _checker(args[0])
        fast = (lambda v: all(type(x) is int for x in v)) if args[0] is int else (lambda v: False)

        def check_list(v):
            if not isinstance(v, origin):
                return "", f"expected a list, got {_short(v)}"
            if fast(v):
                return None
            for k, x in enumerate(v):
                bad = item(x)
                if bad:
                    return f"[{k}]{bad[0]}", bad[1]
            return None
        return check_list
    if origin is dict:
        key, val = _checker(args[0]), _checker(args[1])

        def check_dict(v):
            if not isinstance(v, dict):
                return "", f"expected an object, got {_short(v)}"
            for k, x in v.items():
                bad = key(k) or val(x)
                if bad:
                    return f"[{k!r}]{bad[0]}", bad[1]
            return None
        return check_dict
    ok = {int: lambda v: type(v) is int, float: lambda v: type(v) in (int, float),
          str: lambda v: isinstance(v, str), bool: lambda v: isinstance(v, bool)}[hint]
    return lambda v: None if ok(v) else ("", f"expected {hint.__name__}, got {_short(v)}")


def _short(v: Any) -> str:
    s = json.dumps(v) if isinstance(v, (dict, list, str, int, float, bool, type(None))) else repr(v)
    return s if len(s) <= 40 else s[:39] + "…"


def _snapshot_problems(s: Snapshot) -> list[str]:
    """What the pictures rely on beyond types: block ids 0..n-1 and every id referring to one."""
    n = s.num_gpu_blocks
    out = []
    if s.block_size < 1 or n < 1:
        out.append(f"snapshot: block_size and num_gpu_blocks must be >= 1 (got {s.block_size}, {n})")
    if [b.block_id for b in s.blocks] != list(range(n)):
        out.append(f"snapshot: blocks must be blocks 0..{n - 1} in order")
    refs = list(s.free_queue) + [b for ids in s.hash_map.values() for b in ids] + [
        b for r in s.requests for t in r.block_tables for b in t]
    bad = sorted({b for b in refs if not 0 <= b < n})
    if bad:
        out.append(f"snapshot: block ids {bad[:5]} outside the pool of {n} blocks")
    return out
