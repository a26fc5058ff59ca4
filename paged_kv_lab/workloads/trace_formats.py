"""Production request traces: Mooncake's and Qwen-Bailian's JSONL formats, read and checked.

Neither format carries text or tokens. Each line says when a request arrived, how long its prompt
and its answer were, and which prompt blocks it shared with other requests (``hash_ids``: one id
per trace block, the last block partial when the prompt is not a multiple of the block):

- **Mooncake** (FAST'25 release): ``timestamp`` in milliseconds, ``input_length``,
  ``output_length``, ``hash_ids``; 512-token trace blocks.
- **Qwen-Bailian**: ``chat_id``, ``parent_chat_id`` (-1 on a conversation's first turn),
  ``timestamp`` in **seconds**, ``input_length``, ``output_length``, ``type``, ``turn``,
  ``hash_ids``; 16-token trace blocks.

A trace is a tuple of :class:`TraceRequest` in file order ("trace order"); request ``i`` is the
file's ``i``-th request line (0-based), and the replay names it ``str(i)``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Union

from paged_kv_lab.text.i18n import Text, tr

MOONCAKE = "mooncake"
QWEN_BAILIAN = "qwen-bailian"
FORMATS = (MOONCAKE, QWEN_BAILIAN)
# Tokens per trace block (one hash id each), by format.
TRACE_BLOCK_SIZE = {MOONCAKE: 512, QWEN_BAILIAN: 16}


class TraceError(ValueError):
    """A trace that cannot be read: ``text``, a catalogue sentence naming the line and the field
    (the line, the field and the offending value are its data); ``str(e)`` its English."""

    def __init__(self, message: Text) -> None:
        self.text = message
        super().__init__(tr(message, "en"))


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. ``arrival_ms`` is milliseconds from the trace's start (both
    formats); ``hash_ids[j]`` names trace block ``j`` of the prompt, and
    ``len(hash_ids) == ceil(input_length / trace_block_size)``."""

    index: int
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    chat_id: Optional[int] = None
    parent_chat_id: Optional[int] = None
    turn: Optional[int] = None
    type: Optional[str] = None

    @property
    def request_id(self) -> str:
        return str(self.index)


@dataclass(frozen=True)
class Trace:
    """A whole trace, in file order. Invariant: every request's ``hash_ids`` cover exactly its
    ``input_length`` at ``block_size`` tokens per id; ``index`` runs 0, 1, 2, ..."""

    name: str
    format: str
    block_size: int
    requests: tuple[TraceRequest, ...]

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_length for r in self.requests)

    @property
    def max_model_len(self) -> int:
        """The longest request (prompt + answer): a replay's ``max_model_len`` follows it."""
        return max((r.input_length + r.output_length for r in self.requests), default=1)

    @property
    def max_input_length(self) -> int:
        return max((r.input_length for r in self.requests), default=0)

    @property
    def duration_ms(self) -> float:
        if not self.requests:
            return 0.0
        return max(r.arrival_ms for r in self.requests) - min(r.arrival_ms for r in self.requests)

    def slice(self, start: int = 0, stop: Optional[int] = None) -> "Trace":
        """Requests ``start:stop`` as a trace of their own (re-indexed from 0)."""
        reqs = self.requests[start:stop]
        return Trace(
            f"{self.name}[{start}:{'' if stop is None else stop}]",
            self.format,
            self.block_size,
            tuple(_reindexed(r, i) for i, r in enumerate(reqs)),
        )

    def subset(self, indices, name: str) -> "Trace":
        """The requests ``indices`` (kept in trace order) as a trace of their own, re-indexed
        from 0 (a fleet replica's requests, paged_kv_lab/fleet)."""
        reqs = [self.requests[i] for i in sorted(indices)]
        return Trace(
            name, self.format, self.block_size, tuple(_reindexed(r, i) for i, r in enumerate(reqs))
        )


def _reindexed(r: TraceRequest, i: int) -> TraceRequest:
    return TraceRequest(
        i,
        r.arrival_ms,
        r.input_length,
        r.output_length,
        r.hash_ids,
        r.chat_id,
        r.parent_chat_id,
        r.turn,
        r.type,
    )


def detect_format(record: dict) -> str:
    """Qwen-Bailian lines name their conversation (``chat_id``); Mooncake's do not."""
    return QWEN_BAILIAN if "chat_id" in record or "parent_chat_id" in record else MOONCAKE


def _int(record: dict, key: str, where: Text, minimum: int = 0) -> int:
    if key not in record:
        raise TraceError(Text("problem.trace.missing", {"where": where, "key": repr(key)}))
    v = record[key]
    if isinstance(v, bool) or not isinstance(v, int):
        at = {"where": where, "key": key, "got": repr(v)}
        raise TraceError(Text("problem.trace.not_integer", at))
    if v < minimum:
        at = {"where": where, "key": key, "min": minimum, "got": v}
        raise TraceError(Text("problem.trace.below", at))
    return v


def _number(record: dict, key: str, where: Text) -> float:
    if key not in record:
        raise TraceError(Text("problem.trace.missing", {"where": where, "key": repr(key)}))
    v = record[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        at = {"where": where, "key": key, "got": repr(v)}
        raise TraceError(Text("problem.trace.not_number", at))
    return float(v)


def parse_record(record: object, index: int, fmt: str, where: Text) -> TraceRequest:
    """One line's object as a TraceRequest; TraceError names ``where`` and the field."""
    if not isinstance(record, dict):
        raise TraceError(Text("problem.trace.not_object", {"where": where}))
    block = TRACE_BLOCK_SIZE[fmt]
    input_length = _int(record, "input_length", where, 1)
    output_length = _int(record, "output_length", where, 1)
    raw_ids = record.get("hash_ids")
    if not isinstance(raw_ids, list) or not raw_ids:
        raise TraceError(Text("problem.trace.hash_ids", {"where": where}))
    for h in raw_ids:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise TraceError(Text("problem.trace.hash_id", {"where": where, "got": repr(h)}))
    need = -(-input_length // block)
    if len(raw_ids) != need:
        at = {"where": where, "length": input_length, "need": need, "block": block}
        raise TraceError(Text("problem.trace.hash_count", {**at, "fmt": fmt, "has": len(raw_ids)}))
    ts = _number(record, "timestamp", where)
    if fmt == MOONCAKE:
        return TraceRequest(index, ts, input_length, output_length, tuple(raw_ids))
    chat_id = _int(record, "chat_id", where)
    parent = _int(record, "parent_chat_id", where, -1)
    turn = _int(record, "turn", where, 0) if "turn" in record else None
    kind = record.get("type")
    if kind is not None and not isinstance(kind, str):
        raise TraceError(Text("problem.trace.type", {"where": where, "got": repr(kind)}))
    return TraceRequest(
        index, ts * 1000.0, input_length, output_length, tuple(raw_ids), chat_id, parent, turn, kind
    )


def parse_trace(
    lines: Iterable[Union[str, bytes]],
    name: str = "trace",
    fmt: str = "auto",
    max_requests: Optional[int] = None,
) -> Trace:
    """Read JSONL lines (blank lines skipped). ``fmt`` "auto" reads the first line's fields.
    Refuses, naming the line, anything malformed; ``max_requests`` stops a huge file early."""
    if fmt not in ("auto",) + FORMATS:
        at = {"formats": ", ".join(("auto",) + FORMATS), "got": repr(fmt)}
        raise TraceError(Text("problem.trace.format", at))
    out: list[TraceRequest] = []
    for lineno, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError:
                at = {"name": name, "line": lineno}
                raise TraceError(Text("refusal.trace.not_utf8", at)) from None
        if not line.strip():
            continue
        where = Text("problem.trace.where", {"name": name, "line": lineno})
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            at = {"name": name, "line": lineno, "column": e.colno, "error": e.msg}
            raise TraceError(Text("refusal.trace.not_json", at)) from None
        if fmt == "auto":
            if not isinstance(record, dict):
                raise TraceError(Text("problem.trace.not_object", {"where": where}))
            fmt = detect_format(record)
        if max_requests is not None and len(out) >= max_requests:
            at = {"name": name, "max": f"{max_requests:,}"}
            raise TraceError(Text("refusal.trace.too_many_requests", at))
        out.append(parse_record(record, len(out), fmt, where))
    if not out:
        raise TraceError(Text("refusal.trace.no_requests", {"name": name}))
    if fmt == "auto":
        fmt = MOONCAKE
    return Trace(name, fmt, TRACE_BLOCK_SIZE[fmt], tuple(out))


def load_trace(
    source: Union[str, Path], fmt: str = "auto", max_requests: Optional[int] = None
) -> Trace:
    """A trace file (JSONL). TraceError if it cannot be read or a line is malformed."""
    path = Path(source)
    try:
        with path.open("rb") as fh:
            return parse_trace(fh, path.name, fmt, max_requests)
    except OSError as e:
        error = {"source": str(source), "error": e.strerror or str(e)}
        raise TraceError(Text("refusal.trace.cannot_read", error)) from None
