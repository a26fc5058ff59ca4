"""A fleet replaying a trace model-free: N replays of the engine behind a router.

Each replica is a full kvcore engine (its own Scheduler, KVCacheManager and BlockPool):
``workloads.replay.Replay`` given its requests by the router (``own_arrivals=False``) and
publishing its KV events (``kv_events=True``), a driver (paged_kv_lab/run/driver.py) in the one
fleet (fleet/fleet.py). The router decides where each trace request goes, reading the
replicas'
load and a global index fed only by those events (fleet/index.py).

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

from dataclasses import dataclass
from typing import Callable, Optional

from kvcore.core.kv_cache_utils import maybe_convert_block_hash
from kvcore.distributed.kv_events import hash_text
from paged_kv_lab.fleet.fleet import MAX_REPLICAS, Fleet, check_router
from paged_kv_lab.fleet.router import Decision, FleetRequest
from paged_kv_lab.workloads.replay import SEQUENTIAL, Replay, ReplayError, ReplaySettings
from paged_kv_lab.workloads.trace_formats import Trace


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


def trace_fleet(
    trace: Trace,
    settings: ReplaySettings,
    num_replicas: int,
    policy: str,
    router_overrides: Optional[dict] = None,
) -> Fleet:
    """``num_replicas`` replays of the settings' engine behind ``policy``'s router, to route
    ``trace``'s requests in trace order (the fleet's ``requests``)."""
    if not isinstance(num_replicas, int) or not 1 <= num_replicas <= MAX_REPLICAS:
        raise ReplayError(
            f"replicas: a whole number from 1 to {MAX_REPLICAS}; got {num_replicas!r}"
        )
    sequential = settings.arrival == SEQUENTIAL
    routing = check_router(num_replicas, policy, router_overrides, sequential)  # before any replica
    if routing.router.settings["kv_cache_block_size"] or routing.router.settings["none_hash_seed"]:
        raise ReplayError(
            "kv_cache_block_size, none_hash_seed: a trace fleet's router reads the replicas' own "
            "hashes (a scenario's engine.fleet can give its router others)"
        )
    replicas = [
        Replay(trace, settings, own_arrivals=False, kv_events=True) for _ in range(num_replicas)
    ]
    first = replicas[0]
    sessions = session_keys(trace)
    block_size = settings.engine.block_size

    def prepare(i: int):
        req = first.make_request(trace.requests[i])
        hashes = tuple(hash_text(maybe_convert_block_hash(h)) for h in req.block_hashes)
        fr = FleetRequest(req.request_id, req.num_prompt_tokens, sessions[i], hashes, block_size)
        return fr, req

    return Fleet(
        replicas,
        trace.requests,
        prepare,
        policy,
        router_overrides,
        arrival_ns=None if sequential else first.arrival_times_ns(),
        speedup=settings.speedup,
    )


def sub_trace(fleet: Fleet, replica: int) -> Trace:
    """The requests routed to ``replica`` as a trace of their own. Its run is exactly the replay
    of that sub-trace, under either arrival rule (arrivals keep their spacing; a replica idle
    until its first request starts there): the large-pool player can step into any replica."""
    trace = fleet.replicas[replica].trace
    return trace.subset(fleet.routed[replica], f"{trace.name} #{replica}")


def fleet_result(fleet: Fleet) -> FleetResult:
    """The figures of a fleet of replays (so far; complete once it ``finish``-ed)."""
    replicas: list[Replay] = fleet.replicas
    trace = replicas[0].trace
    reps = []
    for j, r in enumerate(replicas):
        totals = r.kv_cache_manager.prefix_cache_totals
        reps.append(
            ReplicaResult(
                j,
                len(fleet.routed[j]),
                sum(trace.requests[i].input_length for i in fleet.routed[j]),
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
    for i, d in enumerate(fleet.decisions):
        r = replicas[d.replica]
        tr = trace.requests[i]
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
    return FleetResult(
        trace=trace.name,
        format=trace.format,
        settings=replicas[0].settings.to_dict(),
        num_replicas=len(replicas),
        router=fleet.policy,
        router_settings=dict(fleet.router.settings),
        requests=len(fleet.decisions),
        prompt_tokens=sum(p.prompt_tokens for p in per),
        queries=sum(x.queries for x in reps),
        hit_tokens=sum(x.hit_tokens for x in reps),
        evictions=sum(x.evictions for x in reps),
        preemptions=sum(x.preemptions for x in reps),
        index_batches=fleet.index.batches,
        index_events=fleet.index.events,
        wall_s=fleet.wall_s,
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
    fleet = trace_fleet(trace, settings, num_replicas, policy, router_overrides)
    fleet.run(progress)
    return fleet_result(fleet)
