"""What the engine did, as plain frozen data.

Everything here is JSON-serialisable (``to_dict``) and carries no reference back
into live engine objects, so a Snapshot taken at step 3 still describes step 3
after the engine has moved on. The app draws only from these records.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
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


@dataclass(frozen=True)
class BlockView:
    block_id: int
    ref_cnt: int
    is_null: bool
    block_hash: str | None          # hex of the hash (without group id); None if not cached
    parent_hash: str | None         # hex of the parent block's hash; None for a first block
    group: int | None               # KV cache group whose cache key holds the hash
    token_ids: tuple[int, ...]      # tokens whose K/V the block holds (full blocks: block_size of them)
    queue_pos: int | None           # 0 = head of the free queue; None = not in the queue
    owners: tuple[str, ...]         # request ids whose block tables hold this block


@dataclass(frozen=True)
class RequestView:
    request_id: str
    status: str                     # waiting | running | preempted | finished_stopped | finished_length ...
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int          # prefix-hit tokens at its (last) admission
    block_tables: tuple[tuple[int, ...], ...]   # per group: logical block -> physical block id
    num_preemptions: int
    priority: int
    arrival: int
    output_token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...]
    text: str                       # detokenised output so far ("" where no tokenizer)
    cache_salt: str | None = None


@dataclass(frozen=True)
class Snapshot:
    step: int
    block_size: int
    num_gpu_blocks: int
    blocks: tuple[BlockView, ...]
    free_queue: tuple[int, ...]      # head -> tail
    hash_map: dict[str, tuple[int, ...]]   # "hexhash@group" -> block ids, insertion order
    requests: tuple[RequestView, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    usage: float
    num_free_blocks: int
    prefix_cache: dict[str, float]   # queries, hits, hit_rate (tokens), since reset
    groups: tuple[dict[str, Any], ...]  # per KV cache group: {"kind": "full"|"sliding", "sliding_window": W|None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Snapshot":
        blocks = tuple(BlockView(**{**b, "token_ids": tuple(b["token_ids"]), "owners": tuple(b["owners"])})
                       for b in d["blocks"])
        reqs = tuple(RequestView(**{
            **r,
            "block_tables": tuple(tuple(t) for t in r["block_tables"]),
            "output_token_ids": tuple(r["output_token_ids"]),
            "prompt_token_ids": tuple(r["prompt_token_ids"]),
        }) for r in d["requests"])
        return Snapshot(
            step=d["step"], block_size=d["block_size"], num_gpu_blocks=d["num_gpu_blocks"],
            blocks=blocks, free_queue=tuple(d["free_queue"]),
            hash_map={k: tuple(v) for k, v in d["hash_map"].items()},
            requests=reqs, waiting=tuple(d["waiting"]), running=tuple(d["running"]),
            usage=d["usage"], num_free_blocks=d["num_free_blocks"],
            prefix_cache=dict(d["prefix_cache"]), groups=tuple(d["groups"]),
        )

    def request(self, request_id: str) -> RequestView:
        for r in self.requests:
            if r.request_id == request_id:
                return r
        raise KeyError(request_id)


@dataclass(frozen=True)
class StepRecord:
    """One engine step: what ran, what happened, and the state after it."""

    step: int
    scheduled: dict[str, int]        # request id -> tokens computed this step
    events: tuple[Event, ...]
    snapshot: Snapshot
    new_tokens: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "scheduled": dict(self.scheduled),
            "events": [e.to_dict() for e in self.events],
            "snapshot": self.snapshot.to_dict(),
            "new_tokens": {k: list(v) for k, v in self.new_tokens.items()},
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "StepRecord":
        return StepRecord(d["step"], dict(d["scheduled"]),
                          tuple(Event.from_dict(e) for e in d["events"]),
                          Snapshot.from_dict(d["snapshot"]),
                          {k: list(v) for k, v in d.get("new_tokens", {}).items()})
