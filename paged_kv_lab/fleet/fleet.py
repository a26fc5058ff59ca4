"""A fleet: N drivers of the engine behind a router.

A replica is any driver (paged_kv_lab/run/driver.py) that also lets the router read its load
and keeps a clock (:class:`Replica`). Two kinds are built:

- the model-free replay of a trace, one per replica, fed by the router
  (``workloads.replay.Replay`` with ``own_arrivals=False``; fleet/trace_fleet.py);
- the model engine, one per replica, all on one copy of the weights (``run.engine.Engine``;
  fleet/model_fleet.py).

The router (fleet/router.py, a policy from its registry) decides where each request goes,
reading the replicas' load and a global index fed only by the KV events they publish
(fleet/index.py): after every step of a replica the fleet takes the step's events
(``kv_events()``) as one ``KVEventBatch`` and publishes it to the index, and its msgpack
encoding, as on the wire, to any listener (fleet/demo_publisher.py puts them on ZeroMQ).

Arrival rules:

- sequential (``arrival_ns`` None): a request is routed when every replica is idle, and runs to
  its end before the next is routed. Each replica then sees exactly the sequential run of the
  requests routed to it, and every load the router reads is zero;
- timestamps (``arrival_ns`` given, on the replicas' clock): before request i is routed, every
  busy replica runs until its clock reaches the request's arrival; the router then reads the
  replicas as they are at that instant, and the index as the events published by then (less
  ``kv_event_lag_ms``) built it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Protocol, Sequence

from kvcore.distributed.kv_events import KVEventBatch, encode_batch
from paged_kv_lab.fleet.router import Decision, FleetRequest, ReplicaView, RouterError
from paged_kv_lab.fleet.routing import Routing
from paged_kv_lab.run.driver import Driver

MAX_REPLICAS = 64


class Replica(Driver[Any, Any, Any], Protocol):
    """A driver as a replica of a fleet: what the router may read of it, and its clock.

    Invariants: ``queued()`` are the requests taken and not yet in ``scheduler``; ``clock_ns``
    never goes back; ``step_until(t)`` makes one step, or one stretch of steps in which nothing
    but decoding happens and none starts at or after ``t``, and ``kv_events()`` then holds what
    it published."""

    @property
    def scheduler(self) -> Any:
        """Its scheduler (vLLM's): running and waiting requests, requests by id."""
        ...

    @property
    def block_pool(self) -> Any:
        """Its pool: how many blocks it has and how many are free."""
        ...

    @property
    def clock_ns(self) -> int: ...

    def queued(self) -> Sequence[str]: ...

    def step_until(self, until_ns: Optional[int]) -> None: ...


def check_router(
    num_replicas: int, policy: str, router_overrides: Optional[dict], sequential: bool
) -> Routing:
    """The router's state for a fleet of ``num_replicas`` (RouterError for a policy, a setting,
    or a lag under sequential arrival, that cannot be used)."""
    routing = Routing(num_replicas, policy, router_overrides)
    if routing.router.settings["kv_event_lag_ms"] and sequential:
        raise RouterError(
            "kv_event_lag_ms: a lag needs --arrival timestamps (sequential arrival routes "
            "only when every replica is idle, when the index is always current)"
        )
    return routing


class Fleet:
    """``replicas`` behind ``policy``'s router, routing ``requests`` in order.

    ``prepare(i)``: request i as (what the router may read of it, what its replica takes);
    ``arrival_ns``: each request's arrival on the replicas' clock (None: sequential arrival);
    ``speedup``: how much faster than the requests' own clock the replicas' clock runs (a lag
    in ms is on the requests' clock).

    Invariants: requests are routed in order, each exactly once; the router reads a replica's
    cache only through the KV events it published; ``step`` routes one request (after running
    the replicas up to its arrival) so a caller can stop between any two decisions."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        requests: Sequence[Any],
        prepare: Callable[[int], tuple[FleetRequest, Any]],
        policy: str,
        router_overrides: Optional[dict] = None,
        arrival_ns: Optional[Sequence[int]] = None,
        speedup: float = 1.0,
    ) -> None:
        self.sequential = arrival_ns is None
        self.routing = check_router(len(replicas), policy, router_overrides, self.sequential)
        self.router = self.routing.router
        self.policy = policy
        self.index = self.routing.index
        self.index.lag_ns = round(self.router.settings["kv_event_lag_ms"] * 1e6 / speedup)
        self.replicas = list(replicas)
        self.requests = requests
        self._prepare = prepare
        self._arrival_ns = arrival_ns
        self.routed: list[list[int]] = [[] for _ in self.replicas]  # request indices, per replica
        self.decisions: list[Decision] = []
        self.next = 0
        self._listeners: list[Callable[[int, int, bytes], None]] = []
        self._route_listeners: list[Callable[[int, FleetRequest, Decision], None]] = []
        self._wall = 0.0

    # -- listening ----------------------------------------------------------------------
    def add_listener(self, fn: Callable[[int, int, bytes], None]) -> None:
        """``fn(replica, clock_ns, payload)`` for every KV event batch a replica publishes (the
        demo source puts them on ZeroMQ)."""
        self._listeners.append(fn)

    def add_route_listener(self, fn: Callable[[int, FleetRequest, Decision], None]) -> None:
        """``fn(i, request, decision)`` once request i is routed (under sequential arrival:
        once it ran to its end)."""
        self._route_listeners.append(fn)

    def _publish(self, replica: int, clock_ns: int, events) -> None:
        batch = KVEventBatch(ts=clock_ns / 1e9, events=list(events), data_parallel_rank=None)
        # The index takes the batch as published; decoding its msgpack encoding gives back an
        # equal batch (tests/lab/test_fleet.py checks every batch of a whole trace), so it is
        # encoded only for a listener that wants the bytes on the wire.
        self.index.publish(replica, clock_ns, batch)
        if self._listeners:
            payload = encode_batch(batch)
            for fn in self._listeners:
                fn(replica, clock_ns, payload)

    # -- reading ------------------------------------------------------------------------
    @property
    def routed_all(self) -> bool:
        return self.next >= len(self.requests)

    @property
    def done(self) -> bool:
        return self.routed_all and not any(r.has_unfinished() for r in self.replicas)

    @property
    def wall_s(self) -> float:
        return self._wall

    def view(self) -> list[ReplicaView]:
        """The replicas as the router would see them now, for the next request (none left: an
        empty prompt)."""
        if self.routed_all:
            empty = FleetRequest("", 0, "", (), 1)
            return self.routing.views(self.replicas, empty)
        return self.routing.views(self.replicas, self._prepare(self.next)[0])

    # -- routing ------------------------------------------------------------------------
    def _run(self, j: int, until_ns: Optional[int]) -> None:
        """Step replica j while it is busy and, if given, its clock is before ``until_ns``."""
        r = self.replicas[j]
        while r.has_unfinished() and (until_ns is None or r.clock_ns < until_ns):
            r.step_until(until_ns)
            events = r.kv_events()
            if events:
                self._publish(j, r.clock_ns, events)

    def step(self) -> Decision:
        """Route the next request (running the replicas up to its arrival first); returns the
        decision. Under sequential arrival the request then runs to its end."""
        if self.routed_all:
            raise RouterError("every request is routed")
        t0 = time.perf_counter()
        try:
            i = self.next
            arrival = None if self._arrival_ns is None else self._arrival_ns[i]
            for j in range(len(self.replicas)):
                self._run(j, arrival)
            self.index.deliver(arrival)
            fr, request = self._prepare(i)
            decision = self.routing.decide(self.replicas, fr)
            j = decision.replica
            self.replicas[j].add_request(request)
            self.routed[j].append(i)
            self.decisions.append(decision)
            self.next = i + 1
            if self.sequential:
                self._run(j, None)
                self.index.deliver(None)
        finally:
            self._wall += time.perf_counter() - t0
        for fn in self._route_listeners:
            fn(i, fr, decision)
        return decision

    def advance(self, until_ns: int) -> None:
        """Run every busy replica until its clock reaches ``until_ns`` and deliver what was
        published by then, routing nothing (a caller that steps the fleet between arrivals:
        fleet/model_fleet.py)."""
        t0 = time.perf_counter()
        for j in range(len(self.replicas)):
            self._run(j, until_ns)
        self.index.deliver(until_ns)
        self._wall += time.perf_counter() - t0

    def finish(self) -> None:
        """Route what is left and run every replica to its end."""
        while not self.routed_all:
            self.step()
        t0 = time.perf_counter()
        for j in range(len(self.replicas)):
            self._run(j, None)
        self.index.deliver(None)
        self._wall += time.perf_counter() - t0

    def run(self, progress: Optional[Callable[[int, int], None]] = None) -> list[Decision]:
        """Every request routed and run to its end; the decisions. ``progress(routed, total)``
        every 16 requests and at the end."""
        n = len(self.requests)
        while not self.routed_all:
            self.step()
            if progress is not None and (self.next % 16 == 0 or self.next == n):
                progress(self.next, n)
        self.finish()
        return self.decisions


__all__ = ["MAX_REPLICAS", "Fleet", "Replica", "check_router"]
