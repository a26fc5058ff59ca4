"""Recorded steps and a cursor: a learner's live run (LabRun) or a trace file (TraceRun).

No Streamlit here. Records are frozen data, so Back and the timeline only move
the cursor. In a LabRun, Step past the last record asks the engine for a new one;
anything that changes the scenario (a setting, an added request, an upload) builds
a new engine and replays to the same step, which gives the same records because
the engine is deterministic. A TraceRun's records are fixed: Step stops at the last.
The panels draw any Timeline.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from kvcore.snapshot import Snapshot, StepRecord
from kvcore.trace import Trace

EngineFactory = Callable[[Any], Any]   # Scenario -> Engine

MAX_RUN_STEPS = 400  # a bound for "run until" / "run to end" so a run can never hang the page


class Timeline:
    """Steps 1..n and a cursor over them.

    Invariants: ``records[i].step == i + 1``; ``first <= cursor <= len(records)``. Cursor 0 shows
    ``initial`` (the state before step 1), cursor k the state after step k. ``first`` is 0, or 1
    when the state before step 1 is unknown (``initial`` is None; then there is a record).
    ``scenario`` is the kvcore Scenario that was run, or None when unknown.
    """

    scenario: Any = None

    def __init__(self, initial: Snapshot | None, records=()) -> None:
        self.initial = initial
        self.records: list[StepRecord] = list(records)
        self.first = 0 if initial is not None else 1
        if self.first > len(self.records):
            raise ValueError("a timeline without the state before step 1 needs a step record")
        self.cursor = self.first

    # -- reading ---------------------------------------------------------
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
        return not self.at_frontier

    @property
    def finished(self) -> bool:
        return not self.can_forward()

    # -- moving ----------------------------------------------------------
    def _compute_next(self) -> bool:
        """Append the record after the last one if it can be computed; a fixed timeline cannot."""
        return False

    def peek_next(self) -> StepRecord | None:
        """The record Step would show next, computing it if needed; the cursor stays."""
        if self.at_frontier and not self._compute_next():
            return None
        return self.records[self.cursor]

    def forward(self) -> StepRecord | None:
        rec = self.peek_next()
        if rec is not None:
            self.cursor += 1
        return rec

    def back(self) -> None:
        self.cursor = max(self.first, self.cursor - 1)

    def goto(self, step: int) -> None:
        """Show step ``step`` (0 = before the first step), computing up to it if needed."""
        step = max(self.first, int(step))
        while self.cursor < step and self.forward() is not None:
            pass
        self.cursor = min(step, len(self.records))

    def run_until(self, kinds: str | tuple[str, ...], max_steps: int = MAX_RUN_STEPS) -> StepRecord | None:
        """Step until a record holds an event of one of ``kinds``; returns it, or None at the end."""
        kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
        for _ in range(max_steps):
            rec = self.forward()
            if rec is None:
                return None
            if any(e.kind in kinds for e in rec.events):
                return rec
        return None

    def run_to_end(self, max_steps: int = MAX_RUN_STEPS) -> None:
        for _ in range(max_steps):
            if self.forward() is None:
                return

    def reset(self) -> None:
        self.cursor = self.first


class TraceRun(Timeline):
    """A trace file's steps. ``scenario`` is the header's (None without a header, and then the
    run starts at step 1); ``trace`` keeps the file's outputs line."""

    def __init__(self, trace: Trace) -> None:
        from kvcore.scenario import load_scenario
        super().__init__(trace.initial, trace.records)
        self.trace = trace
        self.scenario = load_scenario(trace.scenario) if trace.scenario is not None else None


class LabRun(Timeline):
    """A scenario run live on an engine: Step at the last record computes the next one."""

    def __init__(self, scenario, factory: EngineFactory):
        self.scenario = scenario
        self._factory = factory
        self.engine = factory(scenario)
        super().__init__(self.engine.snapshot())

    def can_forward(self) -> bool:
        return not self.at_frontier or bool(self.engine.has_unfinished())

    def _compute_next(self) -> bool:
        if not self.engine.has_unfinished():
            return False
        try:
            rec = self.engine.step()
        except Exception:
            self._recover()
            raise
        self.records.append(rec)
        return True

    def _recover(self) -> None:
        """After a failed step the engine may be half-way through it: rebuild it at the last record."""
        self.engine = self._factory(self.scenario)
        for _ in range(len(self.records)):
            self.engine.step()

    # -- changing the scenario ---------------------------------------------
    def reset(self) -> None:
        self.__init__(self.scenario, self._factory)

    def replace_scenario(self, scenario, keep_step: bool = True) -> None:
        """Rebuild on ``scenario`` and replay to the current step (or to step 0)."""
        step = self.cursor if keep_step else 0
        self.__init__(scenario, self._factory)
        self.goto(step)

    def with_settings(self, **changes) -> Any:
        engine = dataclasses.replace(self.scenario.engine, **changes)
        return dataclasses.replace(self.scenario, engine=engine)

    def add_request(self, spec) -> None:
        """Add a request arriving at the next step; records after the cursor are dropped.

        The engine adds a request at the start of step s when arrival_step < s.
        """
        spec = dataclasses.replace(spec, arrival_step=self.cursor)
        scenario = dataclasses.replace(self.scenario, requests=tuple(self.scenario.requests) + (spec,))
        self.replace_scenario(scenario, keep_step=True)


def check_requests(scenario, factory: EngineFactory) -> None:
    """Raise ValueError if a request can never be added (too long for the pool, bad token ids...),
    using the engine's own checks on a throwaway engine, so a run never fails half-way later."""
    import dataclasses as dc
    engine = factory(scenario)
    for spec in scenario.requests:
        engine.add_request(dc.replace(spec))


def lesson_scenario(lesson, num_layers: int | None = None, overrides: dict | None = None,
                    model: str = "smollm2", device: str = "auto"):
    """A lesson's scenario (with setting overrides) as a validated kvcore Scenario."""
    from kvcore.scenario import load_scenario
    d = lesson.scenario_dict(num_layers, overrides)
    d["model"], d["device"] = model, device
    return load_scenario(d)


def lesson_run(lesson, loaded_model, overrides: dict | None = None) -> LabRun:
    """A LabRun of a lesson on an already loaded model (tests, benchmarks)."""
    from kvcore.engine import Engine
    scenario = lesson_scenario(lesson, loaded_model.num_layers, overrides, loaded_model.name)
    return LabRun(scenario, lambda s: Engine(s, model=loaded_model))
