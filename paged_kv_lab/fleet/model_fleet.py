"""A fleet on a real model: N engines (``run.engine.Engine``) sharing one copy of the weights,
behind a router that reads only their KV events: the one fleet (fleet/trace_fleet.py) with engines
as
its drivers.

Requests are routed one at a time, each run to its end before the next is routed (the fleet's
sequential arrival), so every decision can be shown with the pools as they were when it was made.
Each engine records its steps as any lesson's engine does; :class:`FleetMoments` keeps, after each
request, a :class:`FleetMoment`: the decision, every replica's snapshot, the router's index.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from kvcore.distributed.kv_events import external_hash_text
from kvcore.request import Request
from paged_kv_lab.fleet.fleet import Fleet, check_router
from paged_kv_lab.fleet.router import Decision, FleetRequest


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


def model_fleet(
    scenario,
    num_replicas: int,
    policy: str,
    model,
    sessions: Optional[dict[str, str]] = None,
    router_overrides: Optional[dict] = None,
) -> Fleet:
    """``num_replicas`` engines of ``scenario``'s settings on one ``model``, behind ``policy``,
    to route the scenario's requests in its order (the fleet's ``requests``); ``sessions``: each
    request's conversation (the session router's key; by default its own id).

    Invariants: the engines share the model object (one copy of the weights); the router sees
    each engine's KV events, encoded and decoded as on the wire, and nothing else of its pool."""
    from paged_kv_lab.run.engine import Engine

    check_router(num_replicas, policy, router_overrides, sequential=True)
    specs = list(scenario.requests)
    sessions = sessions or {}
    empty = replace(scenario, requests=())
    engines = [Engine(empty, model=model) for _ in range(num_replicas)]
    first = engines[0]

    def prepare(i: int):
        spec = specs[i]
        ids = first.encode(spec)
        probe = Request(spec.id, ids, 1, block_hasher=first.hasher)
        fr = FleetRequest(
            spec.id,
            len(ids),
            sessions.get(spec.id, spec.id),
            tuple(external_hash_text(h) for h in probe.block_hashes),
            first.settings.block_size,
        )
        return fr, spec

    return Fleet(engines, specs, prepare, policy, router_overrides)


class FleetMoments:
    """The moments of a model fleet, one after each request it routed (and ran to its end).

    Invariant: ``moments[k]`` shows the pools and the index as they were right after the k-th
    request finished, before the next was routed."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.moments: list[FleetMoment] = []
        fleet.add_route_listener(self._see)

    def _see(self, i: int, fr: FleetRequest, decision: Decision) -> None:
        engines = self.fleet.replicas
        req = engines[decision.replica].requests[fr.request_id]
        self.moments.append(
            FleetMoment(
                fr.request_id,
                fr.session,
                decision,
                req.num_cached_tokens,
                fr.num_prompt_tokens,
                tuple(e.snapshot() for e in engines),
                self.fleet.index.holders(),
            )
        )

    def hit_rate(self) -> float:
        """Prompt tokens hit over prompt tokens, over the requests routed so far."""
        total = sum(m.prompt_tokens for m in self.moments)
        return sum(m.hit_tokens for m in self.moments) / total if total else 0.0


def run_model_fleet(
    scenario,
    num_replicas: int,
    policy: str,
    model,
    sessions: Optional[dict[str, str]] = None,
    router_overrides: Optional[dict] = None,
) -> FleetMoments:
    """Every request of ``scenario`` through ``model_fleet``; its moments."""
    fleet = model_fleet(scenario, num_replicas, policy, model, sessions, router_overrides)
    moments = FleetMoments(fleet)
    fleet.run()
    return moments
