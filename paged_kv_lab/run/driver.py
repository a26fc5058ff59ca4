"""One way to drive the engine: every source of steps implements :class:`Driver` once.

The sources:

- the model engine, ``paged_kv_lab.run.engine.Engine`` (kvcore's EngineCore on a model, or on a
  stand-in runner): request = a scenario's ``RequestSpec``, record = ``StepRecord``;
- the model-free replay of a trace, ``paged_kv_lab.workloads.replay.Replay``: request = the kvcore
  ``Request`` its ``make_request`` made of a trace request, record = ``StepInfo``;
- the prefill/decode pair, ``paged_kv_lab.disagg.pd.PDRun`` (one record a step) and ``PDEngine``
  (one tick: the records of both replicas);
- the other designs, ``paged_kv_lab.designs.sim.SGLangRun`` / ``NanoRun`` (one request at a time)
  and ``paged_kv_lab.designs.side_by_side.SideBySide`` (following a recorded kvcore run).

A caller that adds requests, steps, reads each step's record and its KV events, and at the end
the outputs, drives any of them the same way (``run_to_end``). A fleet (paged_kv_lab/fleet) puts
N drivers behind a router.

The protocol is structural (``typing.Protocol``): a class implements it by having the methods,
with no base class; ``isinstance(x, Driver)`` checks that they are there.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, TypeVar, runtime_checkable

Req = TypeVar("Req", contravariant=True)
Rec = TypeVar("Rec", covariant=True)
Out = TypeVar("Out", covariant=True)


@runtime_checkable
class Driver(Protocol[Req, Rec, Out]):
    """A source of engine steps.

    Invariants every driver keeps:

    - a request taken by ``add_request`` is scheduled from the next ``step`` on, never inside a
      step already made, and requests taken earlier come first;
    - ``step`` makes exactly one unit of progress (one engine step; where a driver's unit is
      another, its docstring says so) and returns that unit's record, numbered after the last;
    - ``has_unfinished()`` is false exactly when every request taken has finished and nothing is
      queued: then ``step`` has nothing to do;
    - ``kv_events()`` are the KV cache events the last ``step`` published (vLLM's
      ``KVEventBatch.events``, in order); a source that publishes none returns ``()``;
    - the same requests in the same order give the same records, events and outputs, every run.
    """

    def add_request(self, request: Req) -> None:
        """Take ``request``; it is scheduled from the next step on."""
        ...

    def step(self) -> Rec:
        """One step; its typed record."""
        ...

    def has_unfinished(self) -> bool:
        """Whether a request taken is not finished yet (or one is still queued)."""
        ...

    def kv_events(self) -> tuple[Any, ...]:
        """The KV cache events the last step published."""
        ...

    def outputs(self) -> dict[str, Out]:
        """Per request taken, in the order taken, what it produced so far."""
        ...


# Kinds of run a scenario can ask for beyond one engine and the P/D pair, each registered by the
# package that builds it (a fleet: paged_kv_lab/fleet/model_fleet.py), so the store builds one
# without importing the layers above it: name -> (does this scenario ask for it, its driver).
RUN_KINDS: dict[str, tuple[Callable[[Any], bool], Callable[..., Any]]] = {}


def register_run_kind(name: str, wants: Callable[[Any], bool], driver: Callable[..., Any]) -> None:
    """``driver(scenario, model=...)`` steps every scenario ``wants(scenario)`` says is its."""
    RUN_KINDS[name] = (wants, driver)


def run_kind_for(scenario: Any) -> Optional[Callable[..., Any]]:
    """The registered driver a scenario asks for (None: one engine or a P/D pair)."""
    for wants, driver in RUN_KINDS.values():
        if wants(scenario):
            return driver
    return None


def run_to_end(driver: Driver[Any, Rec, Any], max_steps: int = 100_000) -> list[Rec]:
    """Step ``driver`` until nothing is left (at most ``max_steps`` steps); the records."""
    records = []
    while driver.has_unfinished() and len(records) < max_steps:
        records.append(driver.step())
    return records


__all__ = ["RUN_KINDS", "Driver", "register_run_kind", "run_kind_for", "run_to_end"]
