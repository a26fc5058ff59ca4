"""A recorded run: one scenario's steps, shared by every session that plays it, and what names
it (``run_key``; its size is ``estimate_nbytes``'s, runs/server_cache.py). The store that makes
runs and computes their steps is store/run_store.py; it changes a run only through the methods of
"the store's side" below. No Streamlit here.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.run.scenario import Scenario, scenario_to_dict
from paged_kv_lab.store.server_cache import estimate_nbytes

if TYPE_CHECKING:
    from paged_kv_lab.store.run_store import RunStore

__all__ = ["RecordedRun", "estimate_nbytes", "model_key", "run_key"]


# -- names -----------------------------------------------------------------------------------
def model_key(name: str, model: Any, device: Any = None) -> tuple[str, str, str]:
    """What names a loaded model in a run's key: its name, the device it is on and its dtype
    ("cpu", "float32"), the same in the app and in scripts and tests, so their runs are shared."""
    dtype = str(getattr(model, "dtype", "float32")).replace("torch.", "")
    return (name, str(getattr(model, "device", device)), dtype)


def run_key(model_key: Any, scenario: Scenario) -> str:
    """A stable key: the same model, device, dtype and scenario give the same key in any process.
    The scenario's own ``model`` and ``device`` are left out: the loaded model ``model_key`` names
    is what runs (a scenario asking for "auto" and one asking for "cpu" run alike on it)."""
    d = scenario_to_dict(scenario)
    d.pop("model", None)
    d.pop("device", None)
    doc = {
        "model": list(model_key) if isinstance(model_key, tuple) else model_key,
        "scenario": d,
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
            self._store.want(self, n)

    def wait(self, n: int, timeout: float, urgent: bool = True) -> bool:
        """Block until ``n`` records exist or the run is done (at most ``timeout`` s); True if they
        exist. Waiting for the very next step (Step at the frontier) is urgent: the store computes
        it before steps computed ahead. A longer wait (Run to end, a far step) is not, so it cannot
        crowd out other sessions; ``urgent=False`` makes any wait a background one."""
        if self._store is None:
            return len(self.records) >= n
        cond = self._store.cond
        with cond:
            # only the very next step is urgent
            urgent = bool(urgent) and n <= len(self.records) + 1
            self._waiters += urgent
            cond.notify_all()  # wake a pausing worker: someone waits now
            try:
                # a page waiting for steps does not hold back the steps computed ahead
                with self._store.visitors.blocked():
                    cond.wait_for(lambda: len(self.records) >= n or self.done, timeout)
            finally:
                self._waiters -= urgent
        return len(self.records) >= n

    def hold(self, owner: Any) -> None:
        """``owner`` (a session's cursor) plays this run: while some owner lives, its steps are
        computed."""
        if self._store is None:
            return
        with self._store.cond:
            self._holders.add(owner)
            self._held_once = True
            self._store.touch(self)

    def release(self, owner: Any) -> None:
        if self._store is not None:
            with self._store.cond:
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

    # -- the store's side (store/run_store.py, under its condition) --------------------------------
    @property
    def engine(self) -> Any:
        """The live engine the store steps (None once the run is done)."""
        return self._engine

    @property
    def waited_for(self) -> bool:
        """Some session is blocked on this run's next step (its steps go first)."""
        return self._waiters > 0

    @property
    def abandoned(self) -> bool:
        """Every session that held this run is gone."""
        return self._held_once and not self.held

    def ask(self, n: int) -> bool:
        """Want at least ``n`` records; True if that is more than was wanted."""
        if n <= self._wanted:
            return False
        self._wanted = n
        return True

    def stop_computing(self) -> None:
        """Want no more records than there are (every session left)."""
        self._wanted = len(self.records)

    def add_record(self, record: StepRecord, nbytes: int) -> None:
        """The worker computed the next step; ``nbytes`` is its estimated size."""
        self.records.append(record)
        self.nbytes += nbytes

    def finish(self, error: Optional[str], outputs: Optional[dict] = None) -> None:
        """The run ended (``error`` says why early, or is None): its engine and the engine's
        bytes go."""
        self.done, self.error = True, error
        if outputs is not None:
            self._outputs = outputs
        self._engine = None
        self.nbytes -= self._engine_bytes
        self._engine_bytes = 0

    def drop(self, error: str, error_key: tuple[str, dict]) -> None:
        """The store gave the run up before its end: no more steps come, and ``error`` /
        ``error_key`` say why. A run already done keeps what it has."""
        if self.done:
            return
        self.done, self.error, self.error_key = True, error, error_key
        self._engine = None
