"""KVCacheObserver: the one way to see inside kvcore's block manager as it decides (ours; vLLM's
precedent is ``KVCacheMetricsCollector`` in v1/core/kv_cache_metrics.py, which its BlockPool
calls at each allocation, access and eviction, beside the pool's KV event queue).

kvcore keeps vLLM's method signatures, so a pool call does not say whom it serves or why. The
observer is told instead, by the code that knows, at the moment it is known:

- ``BlockPool`` calls the block hooks from inside its own methods, after (or, where stated,
  just before) the state changed;
- the KV cache managers open a *request scope* around the pool calls they make for one request
  (``on_request_begin`` ... ``on_request_end``, properly nested), so the block hooks in between
  are for that request and KV cache group; a free's reason comes with its scope;
- the scheduler, the KV cache manager, the connector and the engine call ``on_decision`` for
  each decision about a request (admitted, preempted, cache hit, finished, ...).

Two attachment points, as vLLM's pool has its metrics collector beside its event queue:
``BlockPool.observer`` hears everything above (a recorder), and ``BlockPool.metrics_collector``
hears only the pool's own allocation, touch, eviction and reset hooks, once per pool call (a
counter: it costs the hot path nothing else, since nothing is built for it). Either may be
None: then nothing is called and nothing is computed for it.

Every hook here does nothing; an observer overrides the ones it needs. Hooks must not change
kvcore's state: the same scenario gives the same blocks with or without an observer. What the
state is between decisions (the free queue's order, block tables, a block's cache keys) is read
through ``kv_cache_inspect.py`` beside this module, which only reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, TypeVar

from kvcore.request import RequestStatus

if TYPE_CHECKING:
    from kvcore.core.kv_cache_utils import KVCacheBlock
    from kvcore.request import Request

_R = TypeVar("_R")

# Why blocks are freed inside a request scope (``on_request_begin``'s ``reason``).
FREE_FINISHED = "finished"  # the request finished (stopped, length cap)
FREE_ABORTED = "aborted"  # the request was aborted or failed from outside
FREE_PREEMPTED = "preempted"  # a running request gives its blocks back to make room
FREE_LOAD_FAILED = "load failed"  # its CPU-tier load failed and left no valid block
FREE_WINDOW = "window"  # blocks slid out of a sliding-window group's window
FREE_OFFLOAD = "offload"  # the CPU tier unpins GPU blocks it held for a copy
FREE_COPIED = "copied"  # the step's tail-block copies ran: their holds on both blocks go


def free_reason(request: "Request") -> str:
    """Why ``KVCacheManager.free(request)`` frees, read from the request's status at the call
    (vLLM frees a preempted request while it is still RUNNING and only then marks it
    PREEMPTED; a finished request is marked first; a failed CPU-tier load frees while the
    request still waits for its KV)."""
    status = request.status
    if status == RequestStatus.RUNNING:
        return FREE_PREEMPTED
    if status in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_ERROR):
        return FREE_ABORTED
    if status == RequestStatus.WAITING_FOR_REMOTE_KVS:
        return FREE_LOAD_FAILED
    return FREE_FINISHED


class KVCacheObserver:
    """No-op hooks, called where kvcore decides (see the module docstring for who calls what).

    Invariants the callers keep: scopes nest and every ``on_request_begin`` is matched by one
    ``on_request_end``, also when the call inside raises; block hooks outside any scope are
    for no request (a lone pool, ``evict_blocks``, ``reset_prefix_cache``); each hook is called
    once per pool call with the blocks that call handled, never for an empty list.
    """

    # -- whom the pool works for -------------------------------------------------------
    def on_request_begin(
        self, request_id: Optional[str], group: Optional[int], reason: Optional[str] = None
    ) -> None:
        """The pool calls until the matching ``on_request_end`` are made for ``request_id``
        (None: for no request) in KV cache group ``group`` (None: every group). ``reason``
        (a ``FREE_*`` value) is why blocks freed in the scope are freed; None: the enclosing
        scope's, when that scope is for the same request."""

    def on_request_end(self) -> None:
        """The scope opened by the last unmatched ``on_request_begin`` is over."""

    # -- the pool (BlockPool) ----------------------------------------------------------
    def on_blocks_allocated(self, blocks: Sequence["KVCacheBlock"]) -> None:
        """``get_new_blocks`` popped ``blocks`` from the free queue's head (ref_cnt now 1),
        after reporting each eviction that popping caused."""

    def on_block_evicted(self, block: "KVCacheBlock") -> None:
        """``block``'s hash leaves the prefix cache; called while the block still carries it.
        A block still in the free queue at the call (``ref_cnt == 0``, no previous free block)
        is being popped by ``get_new_blocks``; otherwise ``evict_blocks`` dropped it."""

    def on_blocks_touched(self, blocks: Sequence["KVCacheBlock"]) -> None:
        """``touch`` is about to take a reference on each of ``blocks`` (prefix-cache hits):
        called before, so a block with ``ref_cnt == 0`` still stands where it was in the free
        queue."""

    def on_blocks_freed(
        self,
        blocks: Sequence["KVCacheBlock"],
        to_head: Sequence["KVCacheBlock"],
        to_tail: Sequence["KVCacheBlock"],
    ) -> None:
        """``free_blocks`` dropped a reference on each of ``blocks`` (in the order given);
        those that reached ref_cnt 0 joined the free queue, ``to_head`` before the old head
        and ``to_tail`` after the old tail, each in that order."""

    def on_blocks_cached(
        self, request: "Request", blocks: Sequence["KVCacheBlock"], block_size: int
    ) -> None:
        """``cache_full_blocks`` gave ``blocks`` (of ``request``, in table order) their hashes
        and put them in the prefix cache; blocks already cached or left out are not listed."""

    def on_block_cached_partial(
        self,
        request: "Request",
        block: "KVCacheBlock",
        key: bytes,
        num_tokens: int,
        block_size: int,
    ) -> None:
        """``cache_partial_block`` put ``block`` (of ``block_size`` tokens) in the prefix cache
        under ``key``, ``request``'s hash at the prefix boundary ``num_tokens`` inside it with
        the group id (a partial entry; ``prefix_match_unit`` finer than the block). Not called
        when the block had that key already."""

    def on_block_rekeyed(self, block: "KVCacheBlock", keys: Sequence[bytes]) -> None:
        """``keys`` (with group ids) left the prefix cache because ``block`` is keyed anew at a
        later boundary (a partial entry it outgrew); called after they left, before the new key
        is put in."""

    def on_prefix_cache_reset(self, ok: bool, blocks_in_use: int) -> None:
        """``reset_prefix_cache`` forgot every hash (``ok``), or refused because
        ``blocks_in_use`` blocks (the null block aside) are still in use."""

    # -- decisions about a request -----------------------------------------------------
    def on_decision(self, kind: str, request_id: Optional[str], **fields: Any) -> None:
        """A decision about ``request_id``; ``kind`` names it ("admitted", "preempted",
        "cache_hit", ...) and ``fields`` are its details, by name. ``request_id`` is None for a
        decision about the waiting queue as a whole ("cache_aware_reorder": vLLM 0.34's
        cache-aware admission changed its order; the requests are in ``fields``). Only
        ``observer`` hears these, never ``metrics_collector``."""


def call_for_request(
    observer: Optional[KVCacheObserver],
    request_id: Optional[str],
    group: Optional[int],
    reason: Optional[str],
    pool_call: Callable[..., _R],
    *args: Any,
) -> _R:
    """``pool_call(*args)`` inside a request scope on ``observer`` (see ``on_request_begin``);
    with no observer, just the call. The scope is closed even if the call raises."""
    if observer is None:
        return pool_call(*args)
    observer.on_request_begin(request_id, group, reason)
    try:
        return pool_call(*args)
    finally:
        observer.on_request_end()
