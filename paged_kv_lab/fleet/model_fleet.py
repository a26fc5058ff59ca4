"""A fleet on a real model: N engines (``record.engine.Engine``) sharing one copy of the weights,
behind a router that reads only their KV events (fleet/routing.py).

Requests are routed one at a time, each run to its end before the next is routed (the fleet's
sequential arrival), so every decision can be shown with the pools as they were when it was made.
Each engine records its steps as any lesson's engine does; after each request the fleet keeps a
:class:`FleetMoment`: the decision, every replica's snapshot, the router's index.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from kvcore.distributed.kv_events import (
    KVEventBatch,
    encode_batch,
    external_hash_text,
)
from kvcore.request import Request
from paged_kv_lab.fleet.router import Decision, FleetRequest
from paged_kv_lab.fleet.routing import Routing


class EngineReplica:
    """An engine as the router sees a replica (its scheduler, its pool, nothing waiting
    outside it)."""

    def __init__(self, index: int, engine) -> None:
        self.index = index
        self.engine = engine
        self.inbox: list = []

    @property
    def scheduler(self):
        return self.engine.scheduler

    @property
    def block_pool(self):
        return self.engine.kv_cache_manager.block_pool

    def used_blocks(self) -> int:
        pool = self.block_pool
        return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()


@dataclass(frozen=True)
class FleetMoment:
    """After request ``request_id`` ran to its end on ``decision.replica``: the decision, its hit
    there, each replica's snapshot, and the router's index (hash text -> replicas holding it)."""

    request_id: str
    session: str
    decision: Decision
    hit_tokens: int
    prompt_tokens: int
    snapshots: tuple
    holders: dict


class ModelFleet:
    """``num_replicas`` engines of ``scenario``'s settings on one ``model``, behind ``policy``.

    Invariants: the engines share the model object (one copy of the weights); requests are routed
    in the scenario's order; the router sees each engine's KV events, encoded and decoded as on
    the wire, and nothing else of its pool."""

    def __init__(
        self,
        scenario,
        num_replicas: int,
        policy: str,
        model,
        sessions: Optional[dict[str, str]] = None,
        router_overrides: Optional[dict] = None,
    ) -> None:
        from paged_kv_lab.run.engine import Engine

        self.scenario = scenario
        self.specs = list(scenario.requests)
        self.sessions = sessions or {}
        empty = replace(scenario, requests=())
        self.replicas = [EngineReplica(i, Engine(empty, model=model)) for i in range(num_replicas)]
        self.routing = Routing(num_replicas, policy, router_overrides)
        self.moments: list[FleetMoment] = []
        self.next = 0
        self._listeners: list = []

    @property
    def done(self) -> bool:
        return self.next >= len(self.specs)

    # as a demo source reads a fleet (fleet/demo_publisher.py): every batch, routing done, nothing
    # left
    def add_listener(self, fn) -> None:
        """``fn(replica, step, payload)`` for every KV event batch a replica publishes."""
        self._listeners.append(fn)

    @property
    def routed_all(self) -> bool:
        return self.done

    def finish(self) -> None:
        """Each request ran to its end when it was routed: nothing is left to run."""

    def _fleet_request(self, spec) -> FleetRequest:
        e = self.replicas[0].engine
        ids = e.encode(spec)
        probe = Request(spec.id, ids, 1, block_hasher=e.hasher)
        return FleetRequest(
            spec.id,
            len(ids),
            self.sessions.get(spec.id, spec.id),
            tuple(external_hash_text(h) for h in probe.block_hashes),
            e.settings.block_size,
        )

    def step(self) -> FleetMoment:
        """Route the next request, run it to its end there, publish the events; the moment."""
        spec = self.specs[self.next]
        fr = self._fleet_request(spec)
        self.routing.index.deliver(None)
        decision = self.routing.decide(self.replicas, fr)
        rep = self.replicas[decision.replica]
        engine = rep.engine
        engine.add_request(spec)
        while engine.scheduler.has_requests():
            rec = engine.step()
            if rec.kv_events:
                batch = KVEventBatch(ts=float(rec.step), events=list(rec.kv_events))
                payload = encode_batch(batch)
                self.routing.index.publish(rep.index, rec.step, payload)
                for fn in self._listeners:
                    fn(rep.index, rec.step, payload)
        self.routing.index.deliver(None)
        req = engine.requests[spec.id]
        moment = FleetMoment(
            spec.id,
            fr.session,
            decision,
            req.num_cached_tokens,
            fr.num_prompt_tokens,
            tuple(r.engine.snapshot() for r in self.replicas),
            self.routing.index.holders(),
        )
        self.moments.append(moment)
        self.next += 1
        return moment

    def run(self) -> list[FleetMoment]:
        while not self.done:
            self.step()
        return self.moments

    def hit_rate(self) -> float:
        """Prompt tokens hit over prompt tokens, over the requests routed so far."""
        total = sum(m.prompt_tokens for m in self.moments)
        return sum(m.hit_tokens for m in self.moments) / total if total else 0.0
