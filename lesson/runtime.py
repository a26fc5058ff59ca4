"""One learner's run of a scenario: the engine, the recorded steps and a cursor.

No Streamlit here. Records are frozen data, so Back and the timeline only move
the cursor; Step past the last record asks the engine for a new one. Anything
that changes the scenario (a setting, an added request, an upload) builds a new
engine and replays to the same step, which gives the same records because the
engine is deterministic.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from kvcore.trace import Snapshot, StepRecord

EngineFactory = Callable[[Any], Any]   # Scenario -> Engine

MAX_RUN_STEPS = 400  # a bound for "run until" / "run to end" so a run can never hang the page


class LabRun:
    def __init__(self, scenario, factory: EngineFactory):
        self.scenario = scenario
        self._factory = factory
        self.engine = factory(scenario)
        self.initial: Snapshot = self.engine.snapshot()
        self.records: list[StepRecord] = []
        self.cursor = 0

    # -- reading ---------------------------------------------------------
    @property
    def snapshot(self) -> Snapshot:
        return self.initial if self.cursor == 0 else self.records[self.cursor - 1].snapshot

    @property
    def record(self) -> StepRecord | None:
        return None if self.cursor == 0 else self.records[self.cursor - 1]

    def snapshots(self, upto: int | None = None) -> list[Snapshot]:
        upto = self.cursor if upto is None else upto
        return [self.initial] + [r.snapshot for r in self.records[:upto]]

    def shown_records(self) -> list[StepRecord]:
        return self.records[: self.cursor]

    @property
    def at_frontier(self) -> bool:
        return self.cursor == len(self.records)

    def can_forward(self) -> bool:
        return not self.at_frontier or bool(self.engine.has_unfinished())

    @property
    def finished(self) -> bool:
        return not self.can_forward()

    # -- moving ----------------------------------------------------------
    def peek_next(self) -> StepRecord | None:
        """The record Step would show next, computing it if needed; the cursor stays."""
        if self.at_frontier:
            if not self.engine.has_unfinished():
                return None
            try:
                rec = self.engine.step()
            except Exception:
                self._recover()
                raise
            self.records.append(rec)
        return self.records[self.cursor]

    def _recover(self) -> None:
        """After a failed step the engine may be half-way through it: rebuild it at the last record."""
        self.engine = self._factory(self.scenario)
        for _ in range(len(self.records)):
            self.engine.step()

    def forward(self) -> StepRecord | None:
        rec = self.peek_next()
        if rec is not None:
            self.cursor += 1
        return rec

    def back(self) -> None:
        self.cursor = max(0, self.cursor - 1)

    def goto(self, step: int) -> None:
        """Show step ``step`` (0 = before the first step), computing up to it if needed."""
        step = max(0, int(step))
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
