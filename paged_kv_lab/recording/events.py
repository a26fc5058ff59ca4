"""The event vocabulary: every decision kv/ and sched/ can make, one frozen class per kind.

Read this file to see what the engine can decide. kvcore tells its observer each decision
as it makes it (the docstring names the vLLM function that makes it there);
``paged_kv_lab.recording.recorder.Recorder`` turns those calls into these events and the engine
drains
them once per step. Every event has
``kind``, ``request_id`` (None where no request is involved), ``block_ids`` (maybe
empty) and ``group`` (the KV cache group, None where it does not apply); the other
fields say why. Events are frozen and round-trip through JSON with ``to_dict`` /
``Event.from_dict``, the kind being the tag.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, ClassVar, Union

from pydantic import Discriminator, Tag, TypeAdapter


class EventKind(str, Enum):
    """The kinds, as written in step records and trace files."""

    ARRIVED = "arrived"
    SCHEDULED = "scheduled"
    ADMITTED = "admitted"
    RESUMED = "resumed"
    BLOCKED = "blocked"
    CACHE_HIT = "cache_hit"
    CACHE_MISS = "cache_miss"
    TOUCHED = "touched"
    ALLOCATED = "allocated"
    EVICTED = "evicted"
    CACHED = "cached"
    FREED = "freed"
    WINDOW_SKIPPED = "window_skipped"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    RESET = "reset"
    SAMPLED = "sampled"
    DRAFT_PROPOSED = "draft_proposed"
    DRAFT_ACCEPTED = "draft_accepted"
    DRAFT_REJECTED = "draft_rejected"
    CPU_HIT = "cpu_hit"
    CPU_LOAD = "cpu_load"
    CPU_LOADED = "cpu_loaded"
    CPU_STORED = "cpu_stored"
    CPU_EVICTED = "cpu_evicted"
    KV_LOAD_FAILED = "kv_load_failed"
    CACHED_PARTIAL = "cached_partial"
    COPIED = "copied"
    CACHE_AWARE_REORDER = "cache_aware_reorder"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# Short names, so `e.kind == events.EVICTED` reads like the sentence it is.
(
    ARRIVED,
    SCHEDULED,
    ADMITTED,
    RESUMED,
    BLOCKED,
    CACHE_HIT,
    CACHE_MISS,
    TOUCHED,
    ALLOCATED,
    EVICTED,
    CACHED,
    FREED,
    WINDOW_SKIPPED,
    PREEMPTED,
    FINISHED,
    RESET,
    SAMPLED,
    DRAFT_PROPOSED,
    DRAFT_ACCEPTED,
    DRAFT_REJECTED,
    CPU_HIT,
    CPU_LOAD,
    CPU_LOADED,
    CPU_STORED,
    CPU_EVICTED,
    KV_LOAD_FAILED,
    CACHED_PARTIAL,
    COPIED,
    CACHE_AWARE_REORDER,
) = tuple(EventKind)
EVENT_KINDS: tuple[EventKind, ...] = tuple(EventKind)

IntTuple = tuple[int, ...]
# a field's metadata key: such a field, added after files were recorded, is written only when it
# differs from its default, so those files stay byte-identical
WRITTEN_WHEN_SET = "written_when_set"


@dataclass(frozen=True, kw_only=True)
class Event:
    """One decision, as it was made. Subclasses add the fields that say why."""

    kind: ClassVar[EventKind]
    request_id: str | None = None
    block_ids: IntTuple = ()
    group: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: {"kind": ..., every field by name}; tuples become lists, dict keys text."""
        out: dict[str, Any] = {"kind": self.kind.value}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.metadata.get(WRITTEN_WHEN_SET) and v == f.default:
                continue  # a field added later: files recorded before it stay byte-identical
            out[f.name] = _plain(v)
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Event":
        """The event ``to_dict`` wrote (the subclass named by ``kind``); ValueError on anything
        else."""
        return _any_event_adapter().validate_python(d)


def _plain(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v


# -- the scheduler (sched/scheduler.py) --------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Arrived(Event):
    """A request joined the waiting queue (vLLM: ``Scheduler.add_request``)."""

    kind = EventKind.ARRIVED
    request_id: str = dataclasses.field()  # required: always about one request
    num_prompt_tokens: int
    priority: int = 0


@dataclass(frozen=True, kw_only=True)
class Scheduled(Event):
    """A request got ``num_tokens`` tokens in this step's batch, from position ``start``
    (vLLM: ``Scheduler.schedule``, ``num_scheduled_tokens``). ``phase`` says what they are:
    "prefill" (the rest of the prompt at once), "chunk" (part of it: chunked prefill),
    "decode" (the next token) or "recompute" (a preempted request starting over).
    ``num_placeholder_tokens`` of them are no tokens: the rows vLLM pads a one-token admission
    with, to the 1 + num_spec_tokens of a speculative decode (placeholder drafts, -1)."""

    kind = EventKind.SCHEDULED
    request_id: str = dataclasses.field()
    num_tokens: int
    phase: str
    start: int = 0
    num_placeholder_tokens: int = dataclasses.field(default=0, metadata={WRITTEN_WHEN_SET: True})


@dataclass(frozen=True, kw_only=True)
class Admitted(Event):
    """A waiting request became running; ``num_cached_tokens`` of it came from the prefix
    cache (vLLM: ``Scheduler.schedule``, the waiting loop)."""

    kind = EventKind.ADMITTED
    request_id: str = dataclasses.field()
    num_cached_tokens: int
    num_preemptions: int = 0


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    """A preempted request was admitted again; ``num_cached_tokens`` of its own tokens were
    still cached and are not recomputed (vLLM: ``Scheduler.schedule``, the waiting loop)."""

    kind = EventKind.RESUMED
    request_id: str = dataclasses.field()
    num_cached_tokens: int
    num_preemptions: int = 0


@dataclass(frozen=True, kw_only=True)
class Blocked(Event):
    """The head of the waiting queue was not admitted this step (vLLM: ``Scheduler.schedule``
    breaking out of the waiting loop). ``reason`` is one of: "max_num_seqs" (that many
    already run), "token_budget" (this step's budget is spent), "no_free_blocks"
    (``allocate_slots`` refused), "reserved_blocks" (an asynchronous load refused: the
    ``num_reserved_blocks`` that in-flight prefills still need stay free, vLLM's
    ``_inflight_prefill_reserved_blocks``), "preempted_this_step" (no admissions in a step that
    preempted), "never_fits" (the engine aborts a prompt an empty pool cannot hold),
    "never_fits_padded" (the engine aborts a request whose tokens fit but whose padded
    1 + num_spec_tokens rows an empty pool cannot hold), "never_fits_padded_budget" (the same
    for padded rows over ``max_num_batched_tokens``, ``token_budget`` here),
    "max_loras" (``max_loras`` adapters run already and this request needs another: vLLM skips
    it and looks at the next waiting request), "spec_decode_padding" (its one token would be
    padded to 1 + num_spec_tokens rows and ``token_budget`` is less: vLLM waits rather than
    schedule it unpadded).
    The other fields are the numbers behind the reason that applies."""

    kind = EventKind.BLOCKED
    request_id: str = dataclasses.field()
    reason: str
    max_num_seqs: int | None = None
    token_budget: int | None = None
    num_free_blocks: int | None = None
    num_tokens: int | None = None
    usable_blocks: int | None = None
    num_reserved_blocks: int | None = dataclasses.field(
        default=None, metadata={WRITTEN_WHEN_SET: True}
    )


@dataclass(frozen=True, kw_only=True)
class Preempted(Event):
    """A running request lost all its blocks and went back to the front of the waiting queue,
    to be recomputed, because ``needed_by`` could not get blocks (vLLM:
    ``Scheduler._preempt_request``). The victim follows ``policy``: "fcfs" takes the last
    running request, "priority" the largest (priority, arrival)."""

    kind = EventKind.PREEMPTED
    request_id: str = dataclasses.field()
    policy: str
    needed_by: str
    victim_priority: int = 0
    num_computed_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class CacheAwareReorder(Event):
    """vLLM 0.34's cache-aware admission changed the waiting queue's order before admitting
    (vLLM: ``Scheduler._reorder_waiting_by_cached_prefix``): among the first ``window`` waiting
    requests, those with a longer cached prefix went ahead, arrival order breaking ties.
    Recorded only when the order changed. ``order_before`` and ``order_after`` are the window's
    requests, front first; ``moved_ahead`` maps each request that moved ahead to those it
    passed; ``num_cached_tokens`` is each probed request's cached prefix
    (``KVCacheManager.get_num_cached_tokens``; blocked or partly computed requests are not
    probed and keep their place); ``usage`` was at least ``threshold``. About the queue, not
    one request: ``request_id`` is None."""

    kind = EventKind.CACHE_AWARE_REORDER
    order_before: tuple[str, ...]
    order_after: tuple[str, ...]
    moved_ahead: dict[str, tuple[str, ...]]
    num_cached_tokens: dict[str, int]
    window: int
    threshold: float
    usage: float


@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    """A request stopped and frees its blocks (vLLM: ``Scheduler.update_from_output`` for
    "length" / "eos" / "stop", ``finish_requests`` for "aborted" and for "error": its KV
    failed to load under ``kv_load_failure_policy`` "fail")."""

    kind = EventKind.FINISHED
    request_id: str = dataclasses.field()
    reason: str
    num_output_tokens: int | None = None


# -- the KV cache manager (kv/kv_cache_manager.py, kv/single_type_kv_cache_manager.py) ----
@dataclass(frozen=True, kw_only=True)
class CacheHit(Event):
    """The longest cached prefix of a request: ``num_blocks`` full blocks, ``num_tokens``
    tokens (vLLM: ``KVCacheManager.get_computed_blocks``). ``block_ids_per_group`` holds
    each group's hit blocks (0 = the null block, outside a sliding window);
    ``preempted_before`` is True when the request finds its own blocks again."""

    kind = EventKind.CACHE_HIT
    request_id: str = dataclasses.field()
    num_tokens: int
    num_blocks: int
    block_ids_per_group: tuple[IntTuple, ...] = ()
    preempted_before: bool = False


@dataclass(frozen=True, kw_only=True)
class CacheMiss(Event):
    """A prefix-cache lookup found nothing: its ``num_full_blocks`` block hashes were asked
    for and no hit came back (a full-attention group stops at its first missing block, a
    sliding-window group searches from the right) (vLLM: ``KVCacheManager.get_computed_blocks``).
    With ``skip_reading_prefix_cache`` (a request asking for prompt_logprobs) nothing was asked
    for (``prefix_cache_lookup_enabled`` is false) and ``num_full_blocks`` is 0."""

    kind = EventKind.CACHE_MISS
    request_id: str = dataclasses.field()
    num_tokens: int
    num_full_blocks: int = 0
    skip_reading_prefix_cache: bool = dataclasses.field(
        default=False, metadata={WRITTEN_WHEN_SET: True}
    )


@dataclass(frozen=True, kw_only=True)
class WindowSkipped(Event):
    """Blocks ``block_ids`` left the sliding window: table ``slots`` now point at the null
    block and the blocks are freed (vLLM: ``SingleTypeKVCacheManager.remove_skipped_blocks``)."""

    kind = EventKind.WINDOW_SKIPPED
    request_id: str = dataclasses.field()
    slots: IntTuple
    num_computed_tokens: int


# -- the block pool (kv/block_pool.py) ------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Allocated(Event):
    """``block_ids`` were popped from the head of the free queue for a request (vLLM:
    ``BlockPool.get_new_blocks``). ``evicted_hashes`` maps each popped block that still
    carried a hash to that hash: reusing the block evicted it."""

    kind = EventKind.ALLOCATED
    queue_positions: IntTuple = ()
    evicted_hashes: dict[int, str] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Evicted(Event):
    """Block ``block_ids[0]`` lost ``block_hash``: that prefix can no longer be hit (vLLM:
    ``BlockPool._maybe_evict_cached_block``). ``reason`` is "reused from queue head"
    (``get_new_blocks`` popped it) or "evict_blocks" (asked for by id)."""

    kind = EventKind.EVICTED
    block_hash: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Touched(Event):
    """``block_ids`` got one more user (ref_cnt + 1) because a request hit them (vLLM:
    ``BlockPool.touch``). ``from_queue`` were free (ref_cnt 0) and left the free queue from
    ``queue_positions`` (0 = head): a hit rescued them before eviction."""

    kind = EventKind.TOUCHED
    from_queue: IntTuple = ()
    queue_positions: IntTuple = ()


@dataclass(frozen=True, kw_only=True)
class Cached(Event):
    """Full blocks ``block_ids`` got their ``block_hashes`` and entered the prefix cache
    (vLLM: ``BlockPool.cache_full_blocks``)."""

    kind = EventKind.CACHED
    block_hashes: tuple[str, ...]
    num_tokens: int


@dataclass(frozen=True, kw_only=True)
class CachedPartial(Event):
    """Block ``block_ids[0]``, not full, entered the prefix cache under the request's hash at
    the prefix boundary ``num_tokens`` inside it, ``block_hash`` (a partial entry: the prompt's
    last ``prefix_match_unit`` boundary, where a resent prompt's hit would stop) (vLLM:
    ``BlockPool.cache_partial_block``, from ``_cache_partial_tail_block``). A later request can
    then hit up to ``num_tokens`` and get a private copy of the block (``Copied``)."""

    kind = EventKind.CACHED_PARTIAL
    block_hash: str
    num_tokens: int


@dataclass(frozen=True, kw_only=True)
class Copied(Event):
    """Block ``block_ids[0]`` is filled with a copy of block ``source_block_id`` (its K/V or its
    state) by the worker before this step's forward: copy-on-write of a block a hit ends inside
    (vLLM: ``KVCacheManager.take_kv_cache_block_copies``,
    ``SchedulerOutput.kv_cache_block_copies``).
    ``reason``: "partial_hit" (the request's hit ends inside a cached block that it will write
    into, so its table holds the copy) or "keep_cached" (the request keeps writing its own block,
    whose state was cached inside it: the cache entries ``block_hashes`` move to the copy)."""

    kind = EventKind.COPIED
    request_id: str = dataclasses.field()
    source_block_id: int
    reason: str
    block_hashes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Freed(Event):
    """``block_ids`` lost a user (ref_cnt − 1), in this order (vLLM: ``BlockPool.free_blocks``;
    a request frees its table in reverse). Those reaching 0 joined the free queue: without a
    hash at the head (reused first), with one at the tail; ``still_used`` kept other users.
    ``reason``: "finished", "preempted", "aborted", "window" or "load failed" (a failed load
    left none of its blocks valid)."""

    kind = EventKind.FREED
    to_head: IntTuple = ()
    to_tail: IntTuple = ()
    still_used: IntTuple = ()
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class PrefixCacheReset(Event):
    """Every hash dropped (``ok``), or refused while ``blocks_in_use`` blocks are held
    (vLLM: ``BlockPool.reset_prefix_cache``)."""

    kind = EventKind.RESET
    ok: bool
    blocks_in_use: int | None = None


# -- the engine (engine.py) -----------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Sampled(Event):
    """The model produced one token for each request in ``tokens`` (request id -> token id);
    requests in the middle of their prompt get none (vLLM: the model runner's sampler). With
    speculative decoding it is the last token a request gained; the accepted drafts before it
    are in ``DraftAccepted``."""

    kind = EventKind.SAMPLED
    tokens: dict[str, int]


# -- speculative decoding (spec_decode.py; sched/scheduler.py) -------------------------------
@dataclass(frozen=True, kw_only=True)
class DraftProposed(Event):
    """Drafts for the request's next step, after its own ``num_tokens`` tokens; the next step
    schedules them after its last token (kept by ``Scheduler.update_draft_token_ids``). With
    ``num_lookahead_tokens`` 0 the n-gram proposer drafted them: what followed the last earlier
    occurrence of its latest tokens, padded with its last token to ``num_speculative_tokens``
    (or to ``max_model_len``), all of them padding when nothing matched (vLLM 0.34.0:
    ``NgramGPUSpeculator.propose``);
    with k > 0 a draft model proposed them, writing their K/V into the lookahead slots the
    scheduler reserved (vLLM: ``StandaloneARSpeculator.propose``), or,
    with ``uses_target_hidden_states``, an EAGLE/MTP head from the target's hidden states (vLLM:
    ``EagleSpeculator.propose``)."""

    kind = EventKind.DRAFT_PROPOSED
    request_id: str = dataclasses.field()
    draft_token_ids: IntTuple
    num_tokens: int
    num_lookahead_tokens: int = 0
    uses_target_hidden_states: bool = dataclasses.field(
        default=False, metadata={WRITTEN_WHEN_SET: True}
    )


@dataclass(frozen=True, kw_only=True)
class DraftAccepted(Event):
    """The target model agreed with the first drafts: ``accepted_token_ids`` join the request's
    tokens, followed by ``next_token_id``, the model's own token after them (vLLM: the greedy
    path of ``RejectionSampler``)."""

    kind = EventKind.DRAFT_ACCEPTED
    request_id: str = dataclasses.field()
    accepted_token_ids: IntTuple
    num_draft_tokens: int
    next_token_id: int


@dataclass(frozen=True, kw_only=True)
class DraftRejected(Event):
    """The target model chose ``target_token_id`` where the drafts said ``rejected_token_ids[0]``:
    those drafts are dropped, and ``num_computed_tokens`` moves back over them, so their slots
    will be overwritten (vLLM: ``Scheduler.update_from_output``, ``num_computed_tokens -=
    num_rejected``). ``positions`` are where their K/V was written; those slots are reused.
    Placeholder drafts (-1, a padded admission's) were never proposed and are always rejected."""

    kind = EventKind.DRAFT_REJECTED
    request_id: str = dataclasses.field()
    rejected_token_ids: IntTuple
    target_token_id: int
    num_computed_tokens: int
    positions: IntTuple = ()


# -- the CPU tier (simple_kv_offload/manager.py; sched/scheduler.py) -------------------------
@dataclass(frozen=True, kw_only=True)
class CpuHit(Event):
    """Past its GPU hit of ``num_local_tokens`` tokens, the request's next ``num_tokens`` tokens
    were found in the CPU pool, in CPU blocks ``block_ids``, which are pinned until GPU blocks are
    allocated for them (vLLM: ``SimpleCPUOffloadScheduler.get_num_new_matched_tokens``)."""

    kind = EventKind.CPU_HIT
    request_id: str = dataclasses.field()
    num_tokens: int
    num_local_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class CpuLoad(Event):
    """GPU blocks ``block_ids``, just allocated for the request, are filled from CPU blocks
    ``cpu_block_ids`` (same order) during this step; the request waits for them
    (``WAITING_FOR_REMOTE_KVS``) and runs in a later step (vLLM:
    ``SimpleCPUOffloadScheduler.update_state_after_alloc``)."""

    kind = EventKind.CPU_LOAD
    request_id: str = dataclasses.field()
    cpu_block_ids: IntTuple
    num_tokens: int


@dataclass(frozen=True, kw_only=True)
class CpuLoaded(Event):
    """The load finished: the loaded GPU blocks get their hashes in the GPU prefix cache and the
    request goes back to the waiting queue with ``num_computed_tokens`` computed; ``block_ids``
    is its block table (vLLM: ``Scheduler._update_waiting_for_remote_kv``). ``load_failed``:
    some blocks did not load; only the valid prefix before them is cached (none: the blocks went
    back) and the request computes the rest."""

    kind = EventKind.CPU_LOADED
    request_id: str = dataclasses.field()
    num_computed_tokens: int
    load_failed: bool = False


@dataclass(frozen=True, kw_only=True)
class CpuStored(Event):
    """GPU blocks ``block_ids`` were copied to CPU blocks ``cpu_block_ids`` (same order), which
    now carry ``block_hashes`` and join the CPU free queue's tail, cached. ``mode``: "eager"
    (blocks computed by ``req_ids``) or "lazy" (blocks near the GPU free queue's head) (vLLM:
    ``SimpleCPUOffloadScheduler._process_store_completion``)."""

    kind = EventKind.CPU_STORED
    cpu_block_ids: IntTuple
    block_hashes: tuple[str, ...]
    mode: str
    req_ids: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CpuEvicted(Event):
    """CPU block ``block_ids[0]`` was taken from the CPU free queue's head for a new copy and lost
    ``block_hash``: the CPU tier no longer holds that prefix (vLLM:
    ``BlockPool._maybe_evict_cached_block`` on the CPU pool). The GPU pool is not touched: a GPU
    block may still cache the same hash (``lesson.catalog.gpu_copies``)."""

    kind = EventKind.CPU_EVICTED
    block_hash: str


@dataclass(frozen=True, kw_only=True)
class KVLoadFailed(Event):
    """The KV connector reported that blocks ``block_ids`` of this request did not load
    (``KVConnectorOutput.invalid_block_ids``): the request is cut back to
    ``num_computed_tokens``, the start of its first failed block, losing ``num_lost_tokens``.
    ``asynchronous``: it was still waiting for the load (its blocks never entered the prefix
    cache); otherwise it loaded while running and, under ``policy`` "fail", those blocks and the
    rest of its table lose their hashes (``evict_blocks``). Under "recompute" it computes the lost
    tokens again; under "fail" it ends with an error (vLLM:
    ``Scheduler._update_requests_with_invalid_blocks``)."""

    kind = EventKind.KV_LOAD_FAILED
    request_id: str = dataclasses.field()
    num_computed_tokens: int
    num_lost_tokens: int
    asynchronous: bool
    policy: str


EVENT_TYPES: dict[EventKind, type[Event]] = {
    cls.kind: cls
    for cls in (
        Arrived,
        Scheduled,
        Admitted,
        Resumed,
        Blocked,
        CacheHit,
        CacheMiss,
        Touched,
        Allocated,
        Evicted,
        Cached,
        Freed,
        WindowSkipped,
        Preempted,
        Finished,
        PrefixCacheReset,
        Sampled,
        DraftProposed,
        DraftAccepted,
        DraftRejected,
        CpuHit,
        CpuLoad,
        CpuLoaded,
        CpuStored,
        CpuEvicted,
        KVLoadFailed,
        CachedPartial,
        Copied,
        CacheAwareReorder,
    )
}


# the events that change a block's ref_cnt, hash or place in the free queue
BLOCK_KINDS = frozenset(
    {ALLOCATED, TOUCHED, FREED, CACHED, EVICTED, WINDOW_SKIPPED, CACHED_PARTIAL, COPIED}
)


def changed_block_ids(evs) -> set[int]:
    """The blocks whose state the events changed (a copy's source too: its extra reference, and
    the cache entries it may hand over)."""
    out = {b for e in evs if e.kind in BLOCK_KINDS for b in e.block_ids}
    out.update(e.source_block_id for e in evs if e.kind == COPIED)
    return out


def _kind_tag(v: Any) -> str | None:
    kind = v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)
    return kind.value if isinstance(kind, EventKind) else kind


# Any event, told apart by its kind: a tagged union, the schema step records and trace files use.
AnyEvent = Annotated[
    Union[tuple(Annotated[cls, Tag(kind.value)] for kind, cls in EVENT_TYPES.items())],
    Discriminator(_kind_tag),
]


@functools.cache
def _any_event_adapter() -> TypeAdapter:
    return TypeAdapter(AnyEvent)
