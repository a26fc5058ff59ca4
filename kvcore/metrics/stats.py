"""Prefix-cache statistics as vLLM counts and logs them (vLLM v1: metrics/stats).

Counted in tokens at admission: a request that looked up the cache but was not
admitted that step is not counted; a resumed (preempted) request is counted apart,
so recomputation after preemption does not flatter the hit rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

# The stages of a request's asynchronous KV load (vLLM 0.34's KV_FETCH_STAGES): waiting for the
# load to start, loading, loaded and waiting for a running slot. The scheduler counts requests
# by stage (Scheduler._kv_fetch_counts) for --max-num-inflight-kv-loads.
KV_FETCH_WAITING_TO_START = "waiting_to_start"
KV_FETCH_IN_PROGRESS = "in_progress"
KV_FETCH_COMPLETED_WAITING = "completed_waiting"
KV_FETCH_STAGES = (KV_FETCH_WAITING_TO_START, KV_FETCH_IN_PROGRESS, KV_FETCH_COMPLETED_WAITING)


@dataclass
class PrefixCacheStats:
    """Lookups of one interval. ``reset`` marks a reset_prefix_cache before them."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
            return
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits

    def add(self, other: "PrefixCacheStats") -> None:
        for name in (
            "requests",
            "queries",
            "hits",
            "preempted_requests",
            "preempted_queries",
            "preempted_hits",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["reset"]
        d["hit_rate"] = self.hit_rate
        return d


class CachingMetrics:
    """Hit rate over the most recent ``max_recent_requests`` requests, as vLLM's logger
    prints it. Invariant: the aggregates are the sums over ``query_queue``, and the
    oldest entries are dropped while more than the limit remain (the newest is kept)."""

    def __init__(self, max_recent_requests: int = 1000) -> None:
        self.max_recent_requests = max_recent_requests
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue: deque[tuple[int, int, int]] = deque()

    def observe(self, stats: PrefixCacheStats) -> None:
        if stats.reset:
            self.reset()
        if stats.requests == 0:
            return  # an empty interval would push useful entries out of the window
        self.query_queue.append((stats.requests, stats.queries, stats.hits))
        self.aggregated_requests += stats.requests
        self.aggregated_query_total += stats.queries
        self.aggregated_query_hit += stats.hits
        while len(self.query_queue) > 1 and self.aggregated_requests > self.max_recent_requests:
            r, q, h = self.query_queue.popleft()
            self.aggregated_requests -= r
            self.aggregated_query_total -= q
            self.aggregated_query_hit -= h

    def reset(self) -> None:
        self.aggregated_requests = self.aggregated_query_total = self.aggregated_query_hit = 0
        self.query_queue.clear()

    @property
    def empty(self) -> bool:
        return self.aggregated_requests == 0

    @property
    def hit_rate(self) -> float:
        return (
            self.aggregated_query_hit / self.aggregated_query_total
            if self.aggregated_query_total
            else 0.0
        )
