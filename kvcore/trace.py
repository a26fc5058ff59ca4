"""What the engine did, as plain frozen data.

Everything here is JSON-serialisable (``to_dict``) and carries no reference back
into live engine objects, so a Snapshot taken at step 3 still describes step 3
after the engine has moved on. The app draws only from these records. The end of
the file writes and reads them as a trace file (JSONL), the CLI's output.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

# Event kinds. Each one is emitted by the component that made the decision.
ALLOCATED = "allocated"          # BlockPool.get_new_blocks handed out blocks from the queue head
EVICTED = "evicted"              # a cached block lost its hash (lazily, when popped; or evict_blocks)
CACHE_HIT = "cache_hit"          # KVCacheManager.get_computed_blocks found cached blocks
CACHE_MISS = "cache_miss"        # a lookup that found nothing (so the learner sees the question was asked)
TOUCHED = "touched"              # BlockPool.touch: ref_cnt += 1, pulled out of the free queue if it was free
CACHED = "cached"                # BlockPool.cache_full_blocks: full blocks got their hash
FREED = "freed"                  # BlockPool.free_blocks: ref_cnt -= 1; those reaching 0 queued
WINDOW_SKIPPED = "window_skipped"  # sliding-window blocks left the window, slots became the null block
SCHEDULED = "scheduled"          # a request got tokens in this step's batch
ADMITTED = "admitted"            # a waiting request became running
BLOCKED = "blocked"              # a waiting request could not be admitted (why in data)
PREEMPTED = "preempted"          # a running request lost its blocks and went back to waiting
RESUMED = "resumed"              # a preempted request was admitted again
ARRIVED = "arrived"              # a request was added to the waiting queue
FINISHED = "finished"            # a request stopped (eos / length) and freed its blocks
RESET = "reset"                  # reset_prefix_cache (succeeded or refused)
SAMPLED = "sampled"              # the model produced tokens for requests in this step

EVENT_KINDS = (
    ARRIVED, SCHEDULED, ADMITTED, RESUMED, BLOCKED, CACHE_HIT, CACHE_MISS, TOUCHED,
    ALLOCATED, EVICTED, CACHED, FREED, WINDOW_SKIPPED, PREEMPTED, FINISHED, RESET, SAMPLED,
)


@dataclass(frozen=True)
class Event:
    """One decision. ``data`` holds the reason as plain values (ints, strs, lists)."""

    kind: str
    request_id: str | None = None
    block_ids: tuple[int, ...] = ()
    group: int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "request_id": self.request_id,
            "block_ids": list(self.block_ids),
            "group": self.group,
            "data": self.data,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Event":
        return Event(d["kind"], d.get("request_id"), tuple(d.get("block_ids", ())),
                     d.get("group"), dict(d.get("data", {})))


class Recorder:
    """Collects the events of the current step.

    ``request_id`` is the request the caller is currently working for; pool
    operations do not know it, so the manager sets it around its calls.
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.request_id: str | None = None
        self.group: int | None = None

    def emit(self, event_kind: str, block_ids=(), request_id: str | None = None,
             group: int | None = None, **data: Any) -> None:
        self.events.append(Event(
            event_kind,
            request_id if request_id is not None else self.request_id,
            tuple(block_ids),
            group if group is not None else self.group,
            data,
        ))

    def at(self, request_id: str | None, group: int | None = None) -> "Recorder":
        """Set who the next pool events are for."""
        self.request_id, self.group = request_id, group
        return self

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out


@dataclass(frozen=True)
class BlockView:
    block_id: int
    ref_cnt: int
    is_null: bool
    block_hash: str | None          # hex of the hash (without group id); None if not cached
    parent_hash: str | None         # hex of the parent block's hash; None for a first block
    group: int | None               # KV cache group whose cache key holds the hash
    token_ids: tuple[int, ...]      # tokens whose K/V the block holds (full blocks: block_size of them)
    queue_pos: int | None           # 0 = head of the free queue; None = not in the queue
    owners: tuple[str, ...]         # request ids whose block tables hold this block


@dataclass(frozen=True)
class RequestView:
    request_id: str
    status: str                     # waiting | running | preempted | finished_stopped | finished_length ...
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int          # prefix-hit tokens at its (last) admission
    block_tables: tuple[tuple[int, ...], ...]   # per group: logical block -> physical block id
    num_preemptions: int
    priority: int
    arrival: int
    output_token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...]
    text: str                       # detokenised output so far ("" where no tokenizer)
    cache_salt: str | None = None


@dataclass(frozen=True)
class Snapshot:
    step: int
    block_size: int
    num_gpu_blocks: int
    blocks: tuple[BlockView, ...]
    free_queue: tuple[int, ...]      # head -> tail
    hash_map: dict[str, tuple[int, ...]]   # "hexhash@group" -> block ids, insertion order
    requests: tuple[RequestView, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    usage: float
    num_free_blocks: int
    prefix_cache: dict[str, float]   # queries, hits, hit_rate (tokens), since reset
    groups: tuple[dict[str, Any], ...]  # per KV cache group: {"kind": "full"|"sliding", "sliding_window": W|None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Snapshot":
        blocks = tuple(BlockView(**{**b, "token_ids": tuple(b["token_ids"]), "owners": tuple(b["owners"])})
                       for b in d["blocks"])
        reqs = tuple(RequestView(**{
            **r,
            "block_tables": tuple(tuple(t) for t in r["block_tables"]),
            "output_token_ids": tuple(r["output_token_ids"]),
            "prompt_token_ids": tuple(r["prompt_token_ids"]),
        }) for r in d["requests"])
        return Snapshot(
            step=d["step"], block_size=d["block_size"], num_gpu_blocks=d["num_gpu_blocks"],
            blocks=blocks, free_queue=tuple(d["free_queue"]),
            hash_map={k: tuple(v) for k, v in d["hash_map"].items()},
            requests=reqs, waiting=tuple(d["waiting"]), running=tuple(d["running"]),
            usage=d["usage"], num_free_blocks=d["num_free_blocks"],
            prefix_cache=dict(d["prefix_cache"]), groups=tuple(d["groups"]),
        )

    def request(self, request_id: str) -> RequestView:
        for r in self.requests:
            if r.request_id == request_id:
                return r
        raise KeyError(request_id)


@dataclass(frozen=True)
class StepRecord:
    """One engine step: what ran, what happened, and the state after it."""

    step: int
    scheduled: dict[str, int]        # request id -> tokens computed this step
    events: tuple[Event, ...]
    snapshot: Snapshot
    new_tokens: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "scheduled": dict(self.scheduled),
            "events": [e.to_dict() for e in self.events],
            "snapshot": self.snapshot.to_dict(),
            "new_tokens": {k: list(v) for k, v in self.new_tokens.items()},
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "StepRecord":
        return StepRecord(d["step"], dict(d["scheduled"]),
                          tuple(Event.from_dict(e) for e in d["events"]),
                          Snapshot.from_dict(d["snapshot"]),
                          {k: list(v) for k, v in d.get("new_tokens", {}).items()})


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
