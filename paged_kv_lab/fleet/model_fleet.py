"""A fleet on a real model: N engines (``run.engine.Engine``) sharing one copy of the weights,
behind a router that reads only their KV events: the one fleet (fleet/fleet.py) with engines as
its drivers, stepped as one run (``FleetRun``) so the step player plays it as any lesson.

A scenario asks for it with ``engine.fleet`` (run/scenario.py: ``FleetConfig``): how many
replicas, which router from the registry (fleet/router.py) and its settings, and each request's
conversation. The fleet keeps one clock, one tick a step of every busy replica. A request's
``arrival_step`` is on that clock: once every replica made that many steps, the router reads the
replicas as they are (their queues, the index built from the KV events published so far) and
sends the request to one of them, which takes it from its next step on. So requests that arrive
while others run find the replicas busy, and a router with a load term can trade a replica's
cached blocks against its queue.

The run's records are the replicas' steps, numbered 1, 2, 3... in the order the fleet made them
(replica 0's step of a tick first); each names its replica (``StepRecord.replica``), and the
requests routed to it just before, with the router's decision (``StepRecord.routed``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from kvcore.distributed.kv_events import external_hash_text
from kvcore.request import Request
from paged_kv_lab.fleet.fleet import Fleet, check_router
from paged_kv_lab.fleet.router import (
    Decision,
    FleetRequest,
    RouterError,
    policies,
    router_hasher,
    router_settings,
)
from paged_kv_lab.recording.snapshot import StepRecord
from paged_kv_lab.run.driver import register_run_kind

NS = 1_000_000_000  # one tick of the fleet's clock: a replica's step counts as one second


@dataclass(frozen=True)
class Routed:
    """One routing decision as the run records it: the request, its conversation, its prompt
    length, the router's block size and the blocks of its prompt the router hashed, and the
    decision (fleet/router.py: ``Decision``, the numbers it compared)."""

    request_id: str
    session: str
    num_prompt_tokens: int
    block_size: int
    num_blocks: int
    decision: Decision

    @property
    def replica(self) -> int:
        return self.decision.replica

    @property
    def predicted_tokens(self) -> int:
        """The prompt tokens the router's index said the chosen replica holds (its overlap
        there, in the router's blocks): the router's hit for this request."""
        return self.decision.overlap_blocks[self.replica] * self.block_size

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "session": self.session,
            "num_prompt_tokens": self.num_prompt_tokens,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "decision": self.decision.to_dict(),
        }


class FleetReplica:
    """One engine as a replica of the fleet (fleet/fleet.py's ``Replica``), on the fleet's clock:
    ``clock_ns`` counts the fleet's ticks it has lived through, busy or idle, so an idle replica
    is never behind the others when a request reaches it."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.ticks = 0

    @property
    def scheduler(self):
        return self.engine.scheduler

    @property
    def block_pool(self):
        return self.engine.block_pool

    @property
    def clock_ns(self) -> int:
        return self.ticks * NS

    def queued(self):
        return self.engine.queued()

    def add_request(self, spec) -> None:
        self.engine.add_request(spec)

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step_until(self, until_ns: Optional[int]) -> None:
        self.step()

    def step(self) -> StepRecord:
        self.ticks += 1
        return self.engine.step()

    def idle_until(self, tick: int) -> None:
        """An idle replica's clock moves with the fleet's."""
        if not self.has_unfinished():
            self.ticks = max(self.ticks, tick)

    def kv_events(self) -> tuple:
        return self.engine.kv_events()

    def outputs(self) -> dict:
        return self.engine.outputs()


def router_view_of(engine, settings: dict):
    """``prepare(spec)``: a request as the router reads it (its prompt hashed with the router's
    own hasher, fleet/router.py: ``router_hasher``, each hash as its KV event carries it)."""
    hasher = router_hasher(engine.hasher, settings)

    def prepare(spec, session: str) -> FleetRequest:
        ids = engine.encode(spec)
        probe = Request(spec.id, ids, 1, block_hasher=hasher)
        hashes = tuple(external_hash_text(h) for h in probe.block_hashes)
        return FleetRequest(spec.id, len(ids), session, hashes, hasher.block_size)

    return prepare


def model_fleet(
    scenario,
    num_replicas: int,
    policy: str,
    model,
    sessions: Optional[dict[str, str]] = None,
    router_overrides: Optional[dict] = None,
) -> Fleet:
    """``num_replicas`` engines of ``scenario``'s settings on one ``model``, behind ``policy``,
    routing the scenario's requests in its order one at a time, each run to its end before the
    next (the fleet's sequential arrival: ``serve-events --replicas``); ``sessions``: each
    request's conversation (by default its own id)."""
    from paged_kv_lab.run.engine import Engine

    check_router(num_replicas, policy, router_overrides, sequential=True)
    specs = list(scenario.requests)
    sessions = sessions or {}
    bare = replace(scenario, engine=replace(scenario.engine, fleet=None), requests=())
    engines = [Engine(bare, model=model) for _ in range(num_replicas)]
    view = router_view_of(engines[0], router_settings(router_overrides))

    def prepare(i: int):
        spec = specs[i]
        return view(spec, sessions.get(spec.id, spec.id)), spec

    return Fleet(engines, specs, prepare, policy, router_overrides)


class FleetRun:
    """``scenario.engine.fleet.replicas`` engines of the scenario's settings on one ``model``,
    behind its router, stepped as one run: a driver (run/driver.py) whose ``step()`` returns the
    next replica step's record.

    Invariants: the records come out numbered 1, 2, 3... each naming its replica; a request is
    routed exactly once, at the first tick at or after its ``arrival_step``, and runs on that
    replica only; the router sees each engine's KV events, encoded and decoded as on the wire,
    and nothing else of its pool; same scenario, same records."""

    def __init__(self, scenario, model=None, runner_factory=None, debug: bool = False) -> None:
        from paged_kv_lab.run.engine import Engine

        conf = scenario.engine.fleet
        self.scenario = scenario
        bare = replace(scenario, engine=replace(scenario.engine, fleet=None), requests=())
        engines = [
            Engine(
                bare,
                model=model,
                runner=runner_factory() if runner_factory is not None else None,
                debug=debug,
            )
            for _ in range(conf.replicas)
        ]
        self.model = engines[0].model
        self.engines = engines
        self.replicas = [FleetReplica(e) for e in engines]
        self.specs = sorted(scenario.requests, key=lambda r: r.arrival_step)
        for spec in self.specs:
            engines[0]._checked_prompt(spec)
        self.sessions = {r.id: conf.sessions.get(r.id, r.id) for r in self.specs}
        if conf.router not in policies():  # named by its path in the scenario
            raise RouterError(
                f"engine.fleet.router: one of {', '.join(policies())}; got {conf.router!r}"
            )
        try:
            self.fleet = Fleet(
                self.replicas,
                self.specs,
                self._prepare,
                conf.router,
                dict(conf.router_settings),
                arrival_ns=[r.arrival_step * NS for r in self.specs],
            )
        except RouterError as e:  # a setting of the router's, named by its path in the scenario
            raise RouterError(f"engine.fleet.router_settings: {e}") from e
        self._router_view = router_view_of(engines[0], self.fleet.router.settings)
        self.routed: list[Routed] = []
        self._tick_routed: dict[int, list[Routed]] = {}
        self.fleet.add_route_listener(self._heard)
        self.tick = 0
        self.step_count = 0
        self._queue: list[StepRecord] = []
        self._last: Optional[StepRecord] = None

    # -- routing ----------------------------------------------------------------------------
    def _prepare(self, i: int):
        spec = self.specs[i]
        fr = self._router_view(spec, self.sessions[spec.id])
        return fr, replace(spec, arrival_step=0)

    def _heard(self, i: int, fr: FleetRequest, decision: Decision) -> None:
        r = Routed(
            fr.request_id,
            fr.session,
            fr.num_prompt_tokens,
            fr.block_size,
            len(fr.block_hashes),
            decision,
        )
        self.routed.append(r)
        self._tick_routed.setdefault(decision.replica, []).append(r)

    def _route_arrived(self) -> None:
        while not self.fleet.routed_all and self.specs[self.fleet.next].arrival_step <= self.tick:
            self.fleet.step()

    def _tick(self) -> None:
        """Route what has arrived, then one step of every busy replica (none busy: the clock
        jumps to the next arrival)."""
        self._route_arrived()
        if not any(r.has_unfinished() for r in self.replicas) and not self.fleet.routed_all:
            self.tick = self.specs[self.fleet.next].arrival_step
            for r in self.replicas:
                r.idle_until(self.tick)
            self._route_arrived()
        lengths = [len(e.history) for e in self.engines]
        self.tick += 1
        self.fleet.advance(self.tick * NS)
        for j, (e, n) in enumerate(zip(self.engines, lengths)):
            for rec in e.history[n:]:
                self.step_count += 1
                n_ = self.step_count
                self._queue.append(
                    replace(
                        rec,
                        step=n_,
                        snapshot=replace(rec.snapshot, step=n_),
                        replica=j,
                        routed=tuple(self._tick_routed.pop(j, ())),
                    )
                )
        for r in self.replicas:
            r.idle_until(self.tick)

    # -- the driver -------------------------------------------------------------------------
    def add_request(self, spec) -> None:
        raise ValueError("a fleet's requests are its scenario's: the router sends each one")

    def has_unfinished(self) -> bool:
        return bool(self._queue) or not self.fleet.done

    def step(self) -> StepRecord:
        guard = 0
        while not self._queue:
            if self.fleet.done:
                raise RuntimeError("the fleet has no step left to make")
            self._tick()
            guard += 1
            if guard > 100_000:
                raise RuntimeError("the fleet made no step")
        self._last = self._queue.pop(0)
        return self._last

    def kv_events(self) -> tuple:
        return self._last.kv_events if self._last is not None else ()

    def run(self, max_steps: int = 100_000) -> list[StepRecord]:
        from paged_kv_lab.run.driver import run_to_end

        return run_to_end(self, max_steps)

    # -- reading ----------------------------------------------------------------------------
    def snapshot(self):
        """The state before step 1: every replica's pool is as replica 0's, empty."""
        return self.engines[0].snapshot()

    def decode(self, token_ids) -> str:
        return self.engines[0].decode(token_ids)

    def encode(self, spec) -> list[int]:
        return self.engines[0].encode(spec)

    def outputs(self) -> dict[str, dict]:
        """Each request's output from the replica that served it, in the scenario's order."""
        got: dict[str, dict] = {}
        for e in self.engines:
            got.update(e.outputs())
        empty = {"token_ids": [], "text": "", "finish_reason": None}
        return {r.id: got.get(r.id, empty) for r in self.scenario.requests}

    def parents(self) -> dict[str, list[str]]:
        return {}

    def bytes_per_block(self) -> int:
        """Every replica's bytes per block id (each holds one block of each id)."""
        return sum(e.bytes_per_block() for e in self.engines)

    def close(self) -> None:
        for e in self.engines:
            e.close()


register_run_kind("fleet", lambda scenario: scenario.engine.fleet is not None, FleetRun)


# -- what a fleet's run shows, from its records ------------------------------------------------
@dataclass(frozen=True)
class ReplicaFigures:
    """One replica at a step of a fleet's run: the requests routed to it so far, those running
    and waiting, its pool's use, and its prefix cache's counters as vLLM keeps them
    (``PrefixCacheStats``: hits and queries in tokens)."""

    replica: int
    routed: int
    running: int
    waiting: int
    usage: float
    hits: int
    queries: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass(frozen=True)
class FleetFigures:
    """A fleet's run up to a step: per replica (``replicas``), the decisions so far
    (``routed``), the router's hit (the tokens its index promised on the replicas it chose) and
    the engines' (vLLM's counters, summed over replicas), over the prompts routed."""

    replicas: tuple[ReplicaFigures, ...]
    routed: tuple[Routed, ...]
    prompt_tokens: int
    router_hit_tokens: int
    engine_hits: int
    engine_queries: int

    @property
    def router_hit_rate(self) -> float:
        return self.router_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def engine_hit_rate(self) -> float:
        return self.engine_hits / self.engine_queries if self.engine_queries else 0.0


def fleet_figures(records, num_replicas: int, initial=None) -> FleetFigures:
    """The figures of a fleet's run after ``records`` (its steps 1..k)."""
    latest: dict[int, Any] = {j: initial for j in range(num_replicas)}
    routed: list[Routed] = []
    for rec in records:
        if isinstance(rec.replica, int):
            latest[rec.replica] = rec.snapshot
        routed += rec.routed
    reps = []
    for j in range(num_replicas):
        snap = latest[j]
        pc = snap.prefix_cache if snap is not None else {}
        reps.append(
            ReplicaFigures(
                j,
                sum(1 for r in routed if r.replica == j),
                len(snap.running) if snap is not None else 0,
                len(snap.waiting) if snap is not None else 0,
                snap.usage if snap is not None else 0.0,
                int(pc.get("hits", 0)),
                int(pc.get("queries", 0)),
            )
        )
    return FleetFigures(
        tuple(reps),
        tuple(routed),
        sum(r.num_prompt_tokens for r in routed),
        sum(r.predicted_tokens for r in routed),
        sum(r.hits for r in reps),
        sum(r.queries for r in reps),
    )


def one_pass_bound(scenario, model=None):
    """The hit rate no router can beat on this scenario's requests: the lab's one-pass bound
    (workloads/bound.py) on one engine of its settings with a pool that never evicts, the
    requests in arrival order, one at a time. Each prompt goes in as a trace whose block ids
    are its full blocks' hashes as the engines compute them (equal exactly where two prompts
    share a prefix), its partial last block an id of its own. An ``UnboundedAnswer``."""
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.workloads.bound import unbounded_answer
    from paged_kv_lab.workloads.replay import replay_settings
    from paged_kv_lab.workloads.trace_formats import Trace, TraceRequest

    bare = replace(scenario, engine=replace(scenario.engine, fleet=None), requests=())
    engine = Engine(bare, model=model)
    bs = engine.hasher.block_size
    ids: dict[bytes, int] = {}
    requests = []
    for i, spec in enumerate(sorted(scenario.requests, key=lambda r: r.arrival_step)):
        tokens = engine.encode(spec)
        hashes = Request(spec.id, tokens, 1, block_hasher=engine.hasher).block_hashes
        chain = [ids.setdefault(h, len(ids)) for h in hashes]
        if len(tokens) % bs:
            chain.append(-1 - i)  # the partial last block: no other prompt's
        requests.append(
            TraceRequest(i, float(spec.arrival_step), len(tokens), spec.max_tokens, tuple(chain))
        )
    engine.close()
    trace = Trace(scenario.name, "scenario", bs, tuple(requests))
    return unbounded_answer(trace, replay_settings(trace, {"block_size": bs}))
