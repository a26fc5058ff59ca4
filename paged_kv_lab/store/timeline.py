"""A session's cursor over a shared recorded run (runstore/store.py).

No Streamlit here. Records are frozen data and shared, so Back, the timeline and
Step over recorded steps only move the cursor; Step at the frontier asks the run
store for the next step and waits for its worker (bounded). Going to a far step,
Run to end and Run until never compute in the session: they ask the store and wait
a bounded time, showing what has been recorded by then. A changed scenario (a
setting, an added request, an upload) is a different run from the store.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.run.trace_file import Trace
from paged_kv_lab.store.recorded_run import RecordedRun, model_key
from paged_kv_lab.store.run_store import RunStore, default_store

EngineFactory = Callable[[Any], Any]  # Scenario -> Engine

# the default cap of a run's steps (PAGED_KV_LAB_MAX_RUN_STEPS sets the store's)
MAX_RUN_STEPS = 400
STEP_WAIT = 20.0  # Step at the frontier waits this long for the worker at most
GOTO_WAIT = 3.0  # a far step / Run to end / Run until wait this long, then show what is recorded


class RunStopped(RuntimeError):
    """Step at the frontier of a run that stopped early: the message is the run's reason."""


class Timeline:
    """A cursor over a RecordedRun.

    Invariants: ``first <= cursor <= len(records)``; cursor 0 shows ``initial`` (the state before
    step 1), cursor k the state after step k. ``first`` is 0, or 1 when the state before step 1 is
    unknown (a trace file without a header). The cursor holds the run, so the store keeps
    computing it while this Timeline lives; a live run is computed ahead up to its end or cap.
    """

    def __init__(
        self, run: RecordedRun, cursor: int = 0, ahead: bool = True, scenario: Any = None
    ) -> None:
        self.run = run
        # the scenario this cursor's session asked with: a run is shared by every scenario that
        # differs from it only in the names it gives the model and device (store/recorded_run.py:
        # run_key), and each session is shown its own
        self._scenario = scenario
        self.first = 0 if run.initial is not None else 1
        if self.first > len(run.records) and run.done:
            raise ValueError("a timeline without the state before step 1 needs a step record")
        run.hold(self)
        if ahead and not run.done:
            run.want(1 << 30)
        self.cursor = self.first
        if cursor > self.first:
            self.goto(cursor)

    # -- reading ---------------------------------------------------------
    @property
    def scenario(self):
        return self._scenario if self._scenario is not None else self.run.scenario

    @property
    def initial(self) -> Snapshot | None:
        return self.run.initial

    @property
    def records(self) -> list[StepRecord]:
        return self.run.records

    @property
    def trace(self) -> Trace | None:
        return self.run.trace

    @property
    def error(self) -> str | None:
        return self.run.error

    def outputs(self) -> dict | None:
        return self.run.outputs()

    @property
    def snapshot(self) -> Snapshot:
        return self.initial if self.cursor == 0 else self.records[self.cursor - 1].snapshot

    @property
    def record(self) -> StepRecord | None:
        return None if self.cursor == 0 else self.records[self.cursor - 1]

    def snapshots(self, upto: int | None = None) -> list[Snapshot]:
        """The states shown so far, oldest first (from step 0 where it is known)."""
        upto = self.cursor if upto is None else upto
        head = [self.initial] if self.initial is not None else []
        return head + [r.snapshot for r in self.records[:upto]]

    def shown_records(self) -> list[StepRecord]:
        return self.records[: self.cursor]

    @property
    def at_frontier(self) -> bool:
        return self.cursor == len(self.records)

    def can_forward(self) -> bool:
        return not self.at_frontier or not self.run.done

    @property
    def finished(self) -> bool:
        return not self.can_forward()

    # -- moving ----------------------------------------------------------
    def _ensure(self, n: int, timeout: float, urgent: bool = False) -> bool:
        """Make record ``n`` exist if the run has it, waiting for the store at most ``timeout`` s
        (``urgent``: only the next step, which the store computes before background steps)."""
        if len(self.records) >= n:
            return True
        if self.run.done:
            return False
        self.run.want(n)
        return self.run.wait(n, timeout, urgent=urgent)

    def peek_next(self) -> StepRecord | None:
        """The record Step would show next (waiting for the worker if needed); the cursor stays.
        None at the run's end or when the wait ran out; RunStopped when the run failed there."""
        if not self._ensure(self.cursor + 1, STEP_WAIT, urgent=True):
            if self.run.error and self.at_frontier:
                raise RunStopped(self.run.error)
            return None
        return self.records[self.cursor]

    def forward(self) -> StepRecord | None:
        rec = self.peek_next()
        if rec is not None:
            self.cursor += 1
        return rec

    def back(self) -> None:
        self.cursor = max(self.first, self.cursor - 1)

    def goto(self, step: int, timeout: float = GOTO_WAIT) -> None:
        """Show step ``step`` (0 = before the first), or the last recorded one if the run ends
        before it or the store has not reached it within ``timeout`` s."""
        step = max(self.first, int(step))
        self._ensure(step, timeout)
        self.cursor = max(self.first, min(step, len(self.records)))

    def run_until(
        self,
        kinds: str | tuple[str, ...],
        max_steps: int = MAX_RUN_STEPS,
        timeout: float = GOTO_WAIT,
    ) -> StepRecord | None:
        """Move to the next record holding an event of one of ``kinds`` and return it; None if the
        run ends (or ``timeout`` runs out) first, and the cursor then stands at the last step
        reached."""
        kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        start = self.cursor
        for n in range(start + 1, start + 1 + max_steps):
            if not self._ensure(n, timeout):
                self.cursor = max(self.cursor, min(len(self.records), start + max_steps))
                return None
            self.cursor = n
            rec = self.records[n - 1]
            if any(e.kind in kinds for e in rec.events):
                return rec
        return None

    def run_to_end(self, max_steps: int = MAX_RUN_STEPS, timeout: float = GOTO_WAIT) -> None:
        """Move to the run's last step (or as far as the store got within ``timeout`` s)."""
        target = self.cursor + max_steps
        self._ensure(target, timeout)
        self.cursor = max(self.cursor, min(len(self.records), target))

    def reset(self) -> None:
        self.cursor = self.first


def TraceRun(trace: Trace, store: Optional[RunStore] = None) -> Timeline:
    """A cursor over a trace file's steps (nothing computed). ``scenario`` is the header's
    (None without a header; then the run starts at step 1); ``trace`` keeps the outputs line."""
    return Timeline((store or default_store()).trace_run(trace))


class LabRun(Timeline):
    """A cursor over a private run of ``scenario`` on engines from ``factory`` (tests, scripts):
    an opaque factory cannot be shared, so the run is this LabRun's own. The app shares runs
    through ``RunStore.run`` with a model key (ui/state.py)."""

    def __init__(
        self,
        scenario,
        factory: EngineFactory,
        store: Optional[RunStore] = None,
        cursor: int = 0,
        model: Any = None,
        model_key: Any = None,
    ) -> None:
        self._factory, self._store, self._model, self._model_key = (
            factory,
            store if store is not None else default_store(),
            model,
            model_key,
        )
        super().__init__(
            self._store.run(scenario, factory, model_key=model_key, model=model),
            cursor,
            scenario=scenario,
        )

    def replace_scenario(self, scenario, keep_step: bool = True) -> None:
        """Switch to the run of ``scenario``, at the current step (or at step 0)."""
        step = self.cursor if keep_step else 0
        self.run.release(self)
        LabRun.__init__(
            self, scenario, self._factory, self._store, step, self._model, self._model_key
        )

    def with_settings(self, **changes) -> Any:
        engine = dataclasses.replace(self.scenario.engine, **changes)
        return dataclasses.replace(self.scenario, engine=engine)

    def add_request(self, spec) -> None:
        """Add a request arriving at the next step: a new run, the cursor kept.

        The engine adds a request at the start of step s when arrival_step < s.
        """
        spec = dataclasses.replace(spec, arrival_step=self.cursor)
        scenario = dataclasses.replace(
            self.scenario, requests=tuple(self.scenario.requests) + (spec,)
        )
        self.replace_scenario(scenario, keep_step=True)


def check_requests(scenario, factory: EngineFactory) -> None:
    """Raise ValueError if a request can never be added (too long for the pool, bad token ids...),
    using the engine's own checks on a throwaway engine, so a run never fails half-way later."""
    engine = factory(scenario)
    for spec in scenario.requests:
        engine.add_request(dataclasses.replace(spec))


def lesson_scenario(
    lesson,
    num_layers: int | None = None,
    overrides: dict | None = None,
    model: str = "smollm2",
    device: str = "auto",
):
    """A lesson's scenario (with setting overrides) as a validated kvcore Scenario."""
    from paged_kv_lab.run.scenario import load_scenario

    d = lesson.scenario_dict(num_layers, overrides)
    d["model"], d["device"] = model, device
    return load_scenario(d)


@functools.lru_cache(maxsize=4)
def lesson_model(name: str, device: str):
    """A lesson's own model, loaded once per process and device."""
    from kvcore.model import load_model

    return load_model(name, device)


def played_model(lesson, loaded_model):
    """The model a lesson plays on: its own (``Lesson.model``, on the loaded model's device), or
    the loaded one."""
    if lesson.model is None or loaded_model.name == lesson.model:
        return loaded_model
    return lesson_model(lesson.model, str(loaded_model.device))


def lesson_run(
    lesson, loaded_model, overrides: dict | None = None, store: Optional[RunStore] = None
) -> Timeline:
    """A cursor over a lesson's shared run on an already loaded model (tests, benchmarks); a
    lesson with a model of its own (``Lesson.model``) runs on that one, loaded on the same
    device."""
    from paged_kv_lab.disagg.pd import engine_for

    loaded_model = played_model(lesson, loaded_model)

    scenario = lesson_scenario(lesson, loaded_model.num_layers, overrides, loaded_model.name)
    key = model_key(loaded_model.name, loaded_model)
    return LabRun(
        scenario,
        lambda s: engine_for(s, model=loaded_model),
        store,
        model=loaded_model,
        model_key=key,
    )
