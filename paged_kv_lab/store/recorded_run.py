"""A recorded run: one scenario's steps, shared by every session that plays it, and what names
and sizes it (``run_key``, ``estimate_nbytes``). The store that makes runs and computes their
steps is runstore/store.py. No Streamlit here.
"""

from __future__ import annotations

import hashlib
import json
import sys
import weakref
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.run.scenario import Scenario, scenario_to_dict

if TYPE_CHECKING:
    from paged_kv_lab.store.run_store import RunStore


# -- sizes and decoding -----------------------------------------------------------------------
def estimate_nbytes(obj: Any, _seen: Optional[set] = None) -> int:
    """Bytes held by a tree of records (dataclasses, tuples, lists, dicts, strings), each object
    counted once. Small ints and interned strings are counted too: an overestimate is safe."""
    seen = set() if _seen is None else _seen
    stack, total = [obj], 0
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, (str, bytes, int, float, bool)) or o is None:
            continue
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif is_dataclass(o):
            stack.extend(getattr(o, f.name) for f in fields(o))
            if hasattr(o, "__dict__"):
                # the instance's attribute dict is not in getsizeof(o)
                total += sys.getsizeof(vars(o))
        elif hasattr(o, "__dict__"):
            stack.append(vars(o))
    return total


def run_key(model_key: Any, scenario: Scenario) -> str:
    """A stable key: the same model, device, dtype and scenario give the same key in any process."""
    doc = {
        "model": list(model_key) if isinstance(model_key, tuple) else model_key,
        "scenario": scenario_to_dict(scenario),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[
        :32
    ]


# -- a recorded run --------------------------------------------------------------------------
class RecordedRun:
    """One scenario's steps, shared by every session that plays it.

    Invariants: ``records[i].step == i + 1``; records are only appended, only by the store's
    worker, under the store's condition; once ``done`` no record is added (``error`` then says
    why the run stopped before its end, or is None). ``initial`` is the state before step 1
    (None for a trace file without a header). ``nbytes`` estimates the records' and the live
    engine's memory.
    """

    def __init__(
        self,
        key: str,
        scenario: Optional[Scenario],
        initial: Optional[Snapshot],
        store: Optional["RunStore"] = None,
        engine: Any = None,
        records=(),
        decode: Optional[Callable] = None,
        done: bool = False,
        error: Optional[str] = None,
        outputs: Optional[dict] = None,
        engine_bytes: int = 0,
        trace: Any = None,
    ) -> None:
        self.key = key
        self.scenario = scenario
        self.initial = initial
        self.records: list[StepRecord] = list(records)
        self.decode = decode
        self.done = done
        self.error = error
        # why the store gave the run up ("store_full" with its figures, or "dropped"), for pages
        # to say in their own language
        self.error_key: Optional[tuple[str, dict]] = None
        # the step cap (PAGED_KV_LAB_MAX_RUN_STEPS) it stopped at with requests unfinished
        self.capped_at: Optional[int] = None
        self.trace = trace
        self._store = store
        self._engine = engine
        self._engine_bytes = engine_bytes if engine is not None else 0
        self._outputs = outputs
        self._wanted = len(self.records)
        self._holders: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._held_once = False
        self._waiters = 0  # sessions blocked in wait(): their steps go first
        self.nbytes = estimate_nbytes((initial, self.records)) + self._engine_bytes

    def __repr__(self) -> str:
        return (
            f"RecordedRun({self.key[:8]}, {len(self.records)} "
            f"steps, done={self.done}, error={self.error!r})"
        )

    def recorded(self) -> int:
        return len(self.records)

    def outputs(self) -> Optional[dict]:
        """Each request's output (token_ids, text, finish_reason) once the run is done, else
        None."""
        return self._outputs

    # -- asking for steps -------------------------------------------------------------------
    def want(self, n: int) -> None:
        """Ask for at least ``n`` records (capped at the run's step limit); returns at once."""
        if self._store is not None:
            self._store._want(self, n)

    def wait(self, n: int, timeout: float, urgent: bool = True) -> bool:
        """Block until ``n`` records exist or the run is done (at most ``timeout`` s); True if they
        exist. Waiting for the very next step (Step at the frontier) is urgent: the store computes
        it before steps computed ahead. A longer wait (Run to end, a far step) is not, so it cannot
        crowd out other sessions; ``urgent=False`` makes any wait a background one."""
        if self._store is None:
            return len(self.records) >= n
        with self._store._cond:
            # only the very next step is urgent
            urgent = bool(urgent) and n <= len(self.records) + 1
            self._waiters += urgent
            self._store._cond.notify_all()  # wake a pausing worker: someone waits now
            try:
                self._store._cond.wait_for(lambda: len(self.records) >= n or self.done, timeout)
            finally:
                self._waiters -= urgent
        return len(self.records) >= n

    def hold(self, owner: Any) -> None:
        """``owner`` (a session's cursor) plays this run: while some owner lives, its steps are
        computed."""
        if self._store is None:
            return
        with self._store._cond:
            self._holders.add(owner)
            self._held_once = True
            if self._store._runs.get(self.key) is self:
                self._store._runs.move_to_end(self.key)

    def release(self, owner: Any) -> None:
        if self._store is not None:
            with self._store._cond:
                self._holders.discard(owner)

    @property
    def held(self) -> bool:
        return len(self._holders) > 0

    @property
    def computing(self) -> bool:
        return (
            not self.done
            and self._wanted > len(self.records)
            and (self.held or not self._held_once)
        )
