"""The event vocabulary: what kv/ and sched/ record when they make a decision.

Every decision is an Event emitted by the component that made it, through a Recorder
the engine drains once per step. Events are frozen and JSON-serialisable.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Event kinds. Each one is emitted by the component that made the decision.
ALLOCATED = "allocated"          # BlockPool.get_new_blocks handed out blocks from the queue head
EVICTED = "evicted"              # a cached block lost its hash (lazily, when popped; or evict_blocks)
CACHE_HIT = "cache_hit"          # KVCacheManager.get_computed_blocks found cached blocks
CACHE_MISS = "cache_miss"        # a lookup that found nothing (so the learner sees the question was asked)
TOUCHED = "touched"              # BlockPool.touch: ref_cnt += 1, pulled out of the free queue if it was free
CACHED = "cached"                # BlockPool.cache_full_blocks: full blocks got their hash
FREED = "freed"                  # BlockPool.free_blocks: ref_cnt -= 1; those reaching 0 queued
WINDOW_SKIPPED = "window_skipped"  # sliding-window blocks left the window, slots became the null block
SCHEDULED = "scheduled"          # a request got tokens in this step's batch
ADMITTED = "admitted"            # a waiting request became running
BLOCKED = "blocked"              # a waiting request could not be admitted (why in data)
PREEMPTED = "preempted"          # a running request lost its blocks and went back to waiting
RESUMED = "resumed"              # a preempted request was admitted again
ARRIVED = "arrived"              # a request was added to the waiting queue
FINISHED = "finished"            # a request stopped (eos / length) and freed its blocks
RESET = "reset"                  # reset_prefix_cache (succeeded or refused)
SAMPLED = "sampled"              # the model produced tokens for requests in this step

EVENT_KINDS = (
    ARRIVED, SCHEDULED, ADMITTED, RESUMED, BLOCKED, CACHE_HIT, CACHE_MISS, TOUCHED,
    ALLOCATED, EVICTED, CACHED, FREED, WINDOW_SKIPPED, PREEMPTED, FINISHED, RESET, SAMPLED,
)


@dataclass(frozen=True)
class Event:
    """One decision. ``data`` holds the reason as plain values (ints, strs, lists)."""

    kind: str
    request_id: str | None = None
    block_ids: tuple[int, ...] = ()
    group: int | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "request_id": self.request_id,
            "block_ids": list(self.block_ids),
            "group": self.group,
            "data": self.data,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Event":
        return Event(d["kind"], d.get("request_id"), tuple(d.get("block_ids", ())),
                     d.get("group"), dict(d.get("data", {})))


class Recorder:
    """Collects the events of the current step.

    ``request_id`` is the request the caller is currently working for; pool
    operations do not know it, so the manager sets it around its calls.
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.request_id: str | None = None
        self.group: int | None = None

    def emit(self, event_kind: str, block_ids=(), request_id: str | None = None,
             group: int | None = None, **data: Any) -> None:
        self.events.append(Event(
            event_kind,
            request_id if request_id is not None else self.request_id,
            tuple(block_ids),
            group if group is not None else self.group,
            data,
        ))

    def at(self, request_id: str | None, group: int | None = None) -> "Recorder":
        """Set who the next pool events are for."""
        self.request_id, self.group = request_id, group
        return self

    def drain(self) -> list[Event]:
        out, self.events = self.events, []
        return out
