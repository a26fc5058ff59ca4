"""A fleet: N replicas of the engine behind a router, replaying a trace model-free.

Each replica is a full kvcore engine (its own Scheduler, KVCacheManager and BlockPool, built as
``workload.replay`` builds one) publishing its KV events; the router decides where each trace
request goes, reading the replicas' load and a global index fed only by those events
(fleet/index.py).

Arrival rules (``workload.replay``'s, fleet-wide):

- ``sequential``: a request is routed when every replica is idle, and runs to its end before
  the next is routed. Each replica then sees exactly the sequential replay of the requests routed
  to it, in trace order (so its hits can be checked against vLLM's own Scheduler on that
  sub-trace), and every load the router reads is zero.
- ``timestamps``: one clock for the fleet, the trace's (compressed by ``speedup``), each replica
  following the step-time model on its own. Before request i is routed, every busy replica runs
  until its clock reaches the request's arrival; the router then reads the replicas as they are
  at that instant, and the index as the events published by then (less ``kv_event_lag_ms``)
  built it. A fleet of one replica gives exactly ``workload.replay``'s run.

Session key (``session`` policy): Qwen-Bailian's conversation (the first turn's ``chat_id``,
followed through ``parent_chat_id``); Mooncake's trace names no conversation, so its first trace
block's id stands in (requests that open with the same block are taken as one session).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from kvcore.distributed.kv_events import (
    KVEventBatch,
    encode_batch,
    hash_text,
    maybe_convert_block_hash,
)
from kvcore.request import Request
from paged_kv_lab.fleet.router import Decision, FleetRequest, ReplicaView, RouterError
from paged_kv_lab.fleet.routing import Routing
from paged_kv_lab.workloads.replay import SEQUENTIAL, Replay, ReplayError, ReplaySettings
from paged_kv_lab.workloads.trace_formats import Trace

MAX_REPLICAS = 64


class Replica(Replay):
    """One replica: a replay engine whose requests come from the router (its ``inbox``) instead
    of the trace, and whose pool's KV events go, encoded as on the wire, to ``publish``.

    Invariant: requests are added at the start of the replica's first step after they were
    routed, in routing order; ``_next`` is the fleet's next trace request (so a fast-forwarded
    stretch never runs past the next arrival, as in a replay)."""

    enable_kv_cache_events = True

    def __init__(
        self,
        index: int,
        trace: Trace,
        settings: ReplaySettings,
        publish: Callable[[int, int, bytes], None],
    ) -> None:
        super().__init__(trace, settings)
        self.index = index
        self.inbox: list[Request] = []
        self.routed: list[int] = []
        self._publish = publish

    @property
    def done(self) -> bool:
        return not self.inbox and not self.scheduler.has_unfinished_requests()

    @property
    def busy(self) -> bool:
        return not self.done

    def route(self, request: Request, arrival_ns: int) -> None:
        """Take a routed request; an idle replica's clock jumps to its arrival."""
        if self.done and self._clock_ns < arrival_ns:
            self._clock_ns = arrival_ns
        self.inbox.append(request)
        self.routed.append(int(request.request_id))

    def _add_arrivals(self) -> int:
        added = len(self.inbox)
        for req in self.inbox:
            self.scheduler.add_request(req)
        self.inbox = []
        return added

    def _step(self, want_info: bool = False):
        info = super()._step(want_info)
        events = self.kv_cache_manager.take_events()
        if events:
            batch = KVEventBatch(ts=self._clock_ns / 1e9, events=events, data_parallel_rank=None)
            self._publish(self.index, self._clock_ns, encode_batch(batch))
        return info

    def _fast_forward_steps(self, limit: int) -> int:
        # A request routed here waits in the inbox for the next step: no stretch skips it.
        return 0 if self.inbox else super()._fast_forward_steps(limit)

    def run_until(self, clock_ns: Optional[int] = None) -> None:
        """Step (fast-forwarding where exact) while busy and, if given, before ``clock_ns``."""
        t0 = time.perf_counter()
        try:
            while self.busy and (clock_ns is None or self._clock_ns < clock_ns):
                k = self._fast_forward_steps(1 << 62)
                if k > 0:
                    self._apply_fast_forward(k)
                else:
                    self._step()
        finally:
            self._wall += time.perf_counter() - t0

    def peak_used_blocks(self) -> int:
        used = self._series[4]
        return max(used) if len(used) else 0


@dataclass(frozen=True)
class ReplicaResult:
    """One replica's figures: the requests routed to it and what its own pool did."""

    replica: int
    requests: int
    prompt_tokens: int
    queries: int
    hit_tokens: int
    evictions: int
    preemptions: int
    peak_used_blocks: int
    usable_blocks: int
    steps: int
    simulated_s: float

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queries if self.queries else 0.0

    @property
    def peak_usage(self) -> float:
        return self.peak_used_blocks / self.usable_blocks if self.usable_blocks else 0.0

    def to_dict(self) -> dict:
        return {
            "replica": self.replica,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "queries": self.queries,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "evictions": self.evictions,
            "preemptions": self.preemptions,
            "peak_used_blocks": self.peak_used_blocks,
            "peak_usage": self.peak_usage,
            "steps": self.steps,
            "simulated_s": self.simulated_s,
        }


@dataclass(frozen=True)
class FleetRequestResult:
    """One trace request: where it went, its hit there (vLLM's ``num_cached_tokens`` at first
    admission; -1: never admitted) and the router's numbers for it."""

    request_id: str
    replica: int
    prompt_tokens: int
    hit_tokens: int
    num_preemptions: int
    decision: Decision

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id,
            "replica": self.replica,
            "prompt_tokens": self.prompt_tokens,
            "hit_tokens": self.hit_tokens,
            "num_preemptions": self.num_preemptions,
            "router": self.decision.to_dict(),
        }


@dataclass(frozen=True)
class FleetResult:
    """A fleet replay's figures: totals over the fleet (hit counts mean vLLM's PrefixCacheStats,
    summed over replicas), per replica, and per request in trace order."""

    trace: str
    format: str
    settings: dict
    num_replicas: int
    router: str
    router_settings: dict
    requests: int
    prompt_tokens: int
    queries: int
    hit_tokens: int
    evictions: int
    preemptions: int
    index_batches: int
    index_events: int
    wall_s: float
    replicas: tuple[ReplicaResult, ...]
    per_request: tuple[FleetRequestResult, ...]

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queries if self.queries else 0.0

    def to_dict(self) -> dict:
        """The CLI's ``--json``."""
        return {
            "trace": self.trace,
            "format": self.format,
            "settings": self.settings,
            "num_replicas": self.num_replicas,
            "router": self.router,
            "router_settings": self.router_settings,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "queries": self.queries,
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "evictions": self.evictions,
            "preemptions": self.preemptions,
            "kv_events": {"batches": self.index_batches, "events": self.index_events},
            "wall_s": self.wall_s,
            "replicas": [r.to_dict() for r in self.replicas],
            "per_request": [r.to_dict() for r in self.per_request],
        }


def session_keys(trace: Trace) -> list[str]:
    """Per request, its session (see the module's docstring)."""
    root: dict[int, int] = {}
    out = []
    for r in trace.requests:
        if r.chat_id is not None:
            parent = r.parent_chat_id if r.parent_chat_id is not None else -1
            top = root.get(parent, parent) if parent >= 0 else r.chat_id
            root[r.chat_id] = top
            out.append(f"chat-{top}")
        else:
            out.append(f"block-{r.hash_ids[0]}")
    return out


class Fleet:
    """``num_replicas`` replicas of the settings' engine behind ``policy``'s router.

    Invariants: requests are routed in trace order, each exactly once; the router reads the
    index only through published payloads; ``step`` routes one request (after running the
    replicas up to its arrival) so a caller can stop between any two decisions."""

    def __init__(
        self,
        trace: Trace,
        settings: ReplaySettings,
        num_replicas: int,
        policy: str,
        router_overrides: Optional[dict] = None,
    ) -> None:
        if not isinstance(num_replicas, int) or not 1 <= num_replicas <= MAX_REPLICAS:
            raise ReplayError(
                f"replicas: a whole number from 1 to {MAX_REPLICAS}; got {num_replicas!r}"
            )
        self.trace = trace
        self.settings = settings
        self.policy = policy
        self.routing = Routing(num_replicas, policy, router_overrides)
        self.router = self.routing.router
        lag = self.router.settings["kv_event_lag_ms"]
        if lag and settings.arrival == SEQUENTIAL:
            raise RouterError(
                "kv_event_lag_ms: a lag needs --arrival timestamps (sequential arrival routes "
                "only when every replica is idle, when the index is always current)"
            )
        self.index = self.routing.index
        self.index.lag_ns = round(lag * 1e6 / settings.speedup)
        self._listeners: list[Callable[[int, int, bytes], None]] = []
        self.replicas = [Replica(i, trace, settings, self._publish) for i in range(num_replicas)]
        first = self.replicas[0]
        self._arrival_ns = list(first._arrival_ns)
        self._sessions = session_keys(trace)
        self.decisions: list[Decision] = []
        self.next = 0
        self._wall = 0.0

    def _publish(self, replica: int, clock_ns: int, payload: bytes) -> None:
        self.index.publish(replica, clock_ns, payload)
        for fn in self._listeners:
            fn(replica, clock_ns, payload)

    def add_listener(self, fn: Callable[[int, int, bytes], None]) -> None:
        """``fn(replica, clock_ns, payload)`` for every KV event batch a replica publishes (the
        demo source puts them on ZeroMQ)."""
        self._listeners.append(fn)

    @property
    def routed_all(self) -> bool:
        return self.next >= len(self.trace)

    @property
    def done(self) -> bool:
        return self.routed_all and all(r.done for r in self.replicas)

    def _fleet_request(self, req: Request) -> FleetRequest:
        return FleetRequest(
            req.request_id,
            req.num_prompt_tokens,
            self._sessions[int(req.request_id)],
            tuple(hash_text(maybe_convert_block_hash(h)) for h in req.block_hashes),
            self.settings.engine.block_size,
        )

    def sub_trace(self, replica: int) -> Trace:
        """The requests routed to ``replica`` as a trace of their own. Its run is exactly the
        replay of that sub-trace, under either arrival rule (arrivals keep their spacing; a
        replica idle until its first request starts there): the large-pool player can step
        into any replica."""
        return self.trace.subset(self.replicas[replica].routed, f"{self.trace.name} #{replica}")

    def view(self) -> list[ReplicaView]:
        """The replicas as a router would see them now, for the next request (none left: an
        empty prompt)."""
        if self.routed_all:
            empty = FleetRequest("", 0, "", (), self.settings.engine.block_size)
            return self.routing.views(self.replicas, empty)
        req = self.replicas[0]._make_request(self.trace.requests[self.next])
        return self.routing.views(self.replicas, self._fleet_request(req))

    def step(self) -> Decision:
        """Route the next request (running the replicas up to its arrival first); returns the
        decision. Under sequential arrival the request then runs to its end."""
        if self.routed_all:
            raise ReplayError("every request is routed")
        t0 = time.perf_counter()
        try:
            i = self.next
            sequential = self.settings.arrival == SEQUENTIAL
            arrival = self._arrival_ns[i]
            for r in self.replicas:
                r._next = i
                r.run_until(None if sequential else arrival)
            self.index.deliver(None if sequential else arrival)
            req = self.replicas[0]._make_request(self.trace.requests[i])
            fr = self._fleet_request(req)
            decision = self.routing.decide(self.replicas, fr)
            j = decision.replica
            self.replicas[j].route(req, arrival)
            self.decisions.append(decision)
            self.next = i + 1
            if sequential:
                self.replicas[j].run_until(None)
            return decision
        finally:
            self._wall += time.perf_counter() - t0

    def finish(self) -> None:
        """Route what is left and run every replica to its end."""
        while not self.routed_all:
            self.step()
        t0 = time.perf_counter()
        for r in self.replicas:
            r._next = len(self.trace)
            r.run_until(None)
        self.index.deliver(None)
        self._wall += time.perf_counter() - t0

    def run(self, progress: Optional[Callable[[int, int], None]] = None) -> "FleetResult":
        n = len(self.trace)
        while not self.routed_all:
            self.step()
            if progress is not None and (self.next % 16 == 0 or self.next == n):
                progress(self.next, n)
        self.finish()
        return self.result()

    def result(self) -> FleetResult:
        reps = []
        for r in self.replicas:
            totals = r.kv_cache_manager.prefix_cache_totals
            reps.append(
                ReplicaResult(
                    r.index,
                    len(r.routed),
                    sum(self.trace.requests[i].input_length for i in r.routed),
                    totals.queries,
                    totals.hits,
                    r.evictions,
                    r.preemptions,
                    r.peak_used_blocks(),
                    r.block_pool.num_gpu_blocks - 1,
                    r.step_count,
                    r.clock_ms / 1e3,
                )
            )
        per = []
        for i, d in enumerate(self.decisions):
            r = self.replicas[d.replica]
            tr = self.trace.requests[i]
            per.append(
                FleetRequestResult(
                    tr.request_id,
                    d.replica,
                    tr.input_length,
                    r.hit_tokens[i],
                    r.num_preemptions[i],
                    d,
                )
            )
        s = self.settings.to_dict()
        return FleetResult(
            trace=self.trace.name,
            format=self.trace.format,
            settings=s,
            num_replicas=len(self.replicas),
            router=self.policy,
            router_settings=dict(self.router.settings),
            requests=len(self.decisions),
            prompt_tokens=sum(p.prompt_tokens for p in per),
            queries=sum(x.queries for x in reps),
            hit_tokens=sum(x.hit_tokens for x in reps),
            evictions=sum(x.evictions for x in reps),
            preemptions=sum(x.preemptions for x in reps),
            index_batches=self.index.batches,
            index_events=self.index.events,
            wall_s=self._wall,
            replicas=tuple(reps),
            per_request=tuple(per),
        )


def fleet_replay(
    trace: Trace,
    settings: ReplaySettings,
    num_replicas: int,
    policy: str,
    router_overrides: Optional[dict] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> FleetResult:
    """The whole trace through a fleet; its figures."""
    return Fleet(trace, settings, num_replicas, policy, router_overrides).run(progress)
