"""KVCacheManager: the scheduler's single door to the paged cache (vLLM:
v1/core/kv_cache_manager.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from kvcore.core.block_pool import FREE_ORDER_V033
from kvcore.core.kv_cache_coordinator import get_kv_cache_coordinator
from kvcore.core.kv_cache_observer import call_for_request, free_reason
from kvcore.core.kv_cache_utils import KVCacheBlock
from kvcore.distributed.kv_events import BlockStored
from kvcore.kv_cache_interface import (
    KVCacheConfig,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcore.metrics.stats import CachingMetrics, PrefixCacheStats
from kvcore.request import (
    KV_CACHE_REPORT_FULL,
    KV_CACHE_REPORT_INCREMENTAL,
    RequestStatus,
)


@dataclass
class KVCacheBlocks:
    """Blocks per KV cache group: ``blocks[g][i]`` is group g's i-th block."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)


class KVCacheManager:
    """Prefix-cache lookups, slot allocation and freeing for every group of one pool.

    ``prefix_cache_stats`` counts the admissions since the last ``make_prefix_cache_stats``
    (one engine step); ``prefix_cache_totals`` and ``caching_metrics`` (the hit rate of
    the last ``max_recent_requests`` requests) are fed from it.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int = 1 << 30,
        enable_caching: bool = True,
        max_num_batched_tokens: Optional[int] = None,
        watermark: float = 0.0,
        free_order: str = FREE_ORDER_V033,
        enable_kv_cache_events: bool = False,
        max_recent_requests: int = 1000,
        hash_block_size: Optional[int] = None,
        use_eagle: bool = False,
    ) -> None:
        if not 0.0 <= watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1); got {watermark!r}")
        self.kv_cache_config = kv_cache_config
        # The scheduler's block size: the least common multiple of the groups' block sizes
        # (each group's own is in coordinator.group_block_sizes).
        self.block_size = self.scheduler_block_size = kv_cache_config.scheduler_block_size
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        self.max_model_len = max_model_len
        # vLLM's use_eagle: what the scheduler passes for an EAGLE/MTP drafter whose block hashes
        # do not look ahead (kvcore.core.sched.scheduler.use_eagle_block_drop); every hit then
        # gives up its last matched block (the coordinator's drop_eagle_group_ids).
        self.use_eagle = use_eagle
        # One step holds at most max_num_batched_tokens new tokens per request.
        max_in_flight_tokens = (
            max_num_batched_tokens if max_num_batched_tokens is not None else max_model_len
        )
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config,
            max_model_len,
            max_in_flight_tokens,
            enable_caching,
            free_order,
            enable_kv_cache_events,
            hash_block_size,
            use_eagle=use_eagle,
        )
        self.hash_block_size = self.coordinator.hash_block_size
        self.block_pool = self.coordinator.block_pool
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        # Blocks kept free when admitting a waiting request, so running ones can grow.
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.prefix_cache_stats = PrefixCacheStats()
        self.prefix_cache_totals = PrefixCacheStats()
        self.caching_metrics = CachingMetrics(max_recent_requests)
        self.empty_kv_cache_blocks = KVCacheBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups))
        )

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    # -- statistics -------------------------------------------------------------------
    def prefix_cache_lookup_enabled(self, request) -> bool:
        """Whether the prefix cache may be read for ``request``: caching is on and the request
        does not skip reading it (``skip_reading_prefix_cache``: prompt_logprobs)."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request, num_hits: int) -> None:
        """Count one admission's lookup (the scheduler calls this once the request is admitted);
        a request that skipped the lookup is not counted."""
        if not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """This interval's stats, handed out and started afresh (once per step)."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        if stats.reset:
            self.prefix_cache_totals = PrefixCacheStats()
        self.prefix_cache_totals.add(stats)
        self.caching_metrics.observe(stats)
        return stats

    # -- lookup and allocation ----------------------------------------------------------
    def get_num_cached_tokens(self, request) -> int:
        """How many of ``request``'s tokens the prefix cache holds now (vLLM 0.34's probe for
        cache-aware admission): the hit ``get_computed_blocks`` would find with its default
        bound (the last token is always computed), but nothing is touched, allocated,
        counted or told to the observer, so it may be asked about a request that is not
        admitted. 0 when the request may not read the cache."""
        if not self.prefix_cache_lookup_enabled(request):
            return 0
        _, num_tokens, _ = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        return num_tokens

    def get_computed_blocks(
        self, request, max_cache_hit_length: Optional[int] = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """Longest cached prefix of the request, in full blocks: (blocks, tokens, boundary).

        The hit stops at ``max_cache_hit_length`` (default num_tokens - 1: the last token
        is always computed, because its logits are needed to sample the next one).
        ``shared_prefix_boundary`` is the longest single group's hit when it reaches past
        the hit all groups agree on (hybrid models), else 0: the sliding-window group then
        keeps the blocks ending there, so the next request sharing the prefix hits it all.
        A request with ``skip_reading_prefix_cache`` looks nothing up and hits nothing (its
        blocks are still cached once computed: ``allocate_slots`` caches them).
        """
        if not self.prefix_cache_lookup_enabled(request):
            observer = self.block_pool.observer
            if self.enable_caching and observer is not None:
                observer.on_decision(
                    "cache_miss",
                    request.request_id,
                    num_tokens=request.num_tokens,
                    skip_reading_prefix_cache=True,
                )
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        blocks, num_tokens, num_uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length
        )
        if (
            num_tokens
            and self.enable_kv_cache_events
            and getattr(request, "kv_cache_report_mode", KV_CACHE_REPORT_INCREMENTAL)
            == KV_CACHE_REPORT_FULL
        ):
            self.coordinator.emit_cached_block_events(request, blocks)
        shared_prefix_boundary = num_tokens + num_uncached if num_uncached else 0
        observer = self.block_pool.observer
        if observer is not None:
            if num_tokens:
                observer.on_decision(
                    "cache_hit",
                    request.request_id,
                    block_ids=tuple(b.block_id for g in blocks for b in g if not b.is_null),
                    num_tokens=num_tokens,
                    num_blocks=num_tokens // self.block_size,
                    block_ids_per_group=tuple(tuple(b.block_id for b in g) for g in blocks),
                    preempted_before=request.num_preemptions > 0,
                )
            else:
                observer.on_decision(
                    "cache_miss",
                    request.request_id,
                    num_tokens=request.num_tokens,
                    num_full_blocks=len(request.block_hashes),
                )
        if not any(blocks):
            return self.empty_kv_cache_blocks, num_tokens, shared_prefix_boundary
        return KVCacheBlocks(blocks), num_tokens, shared_prefix_boundary

    def allocate_slots(
        self,
        request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Optional[KVCacheBlocks] = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> Optional[KVCacheBlocks]:
        """Give the request slots for ``num_new_tokens`` more tokens; None if they do not fit.

        Order, as in vLLM: (1) with ``full_sequence_must_fit`` refuse unless the whole
        request fits (a sliding-window group counting at most the blocks it can hold at
        once); (2) free blocks that left the sliding window — even if the call then
        fails; (3) capacity check, counting hit blocks that touching will pull out of the
        free queue; (4) touch the hits; (5) allocate; (6) cache the full blocks for
        min(computed + new, num_tokens) tokens — before the forward pass fills them.
        A waiting request must also leave ``watermark_blocks`` free when another request
        is running; the capacity check (3) also leaves ``reserved_blocks`` free (the
        scheduler's gate on an asynchronous load: the blocks in-flight prefills still
        need; the full-sequence check (1) does not count them). A None return leaves tables
        and ref counts as they were (apart from 2).

        ``num_external_computed_tokens`` follow the local hit and come from a KV connector (the
        CPU tier): they get blocks here like new tokens and count as computed; with
        ``delay_cache_blocks`` (an asynchronous load) nothing is cached until the load is done.
        Only with external tokens may ``num_new_tokens`` be 0.
        """
        if num_new_tokens <= 0 and not num_external_computed_tokens:
            raise ValueError("num_new_tokens must be greater than 0")
        hits = (new_computed_blocks or self.empty_kv_cache_blocks).blocks
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed + num_external_computed_tokens, self.max_model_len)
        watermark_blocks = 0
        if has_scheduled_reqs and request.status in (
            RequestStatus.WAITING,
            RequestStatus.PREEMPTED,
        ):
            watermark_blocks = self.watermark_blocks

        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            need = self.coordinator.get_num_blocks_to_allocate(
                request.request_id,
                full,
                hits,
                total_computed,
                apply_admission_cap=True,
                num_local_computed_tokens=num_local_computed,
            )
            if need + watermark_blocks > self.block_pool.get_num_free_blocks():
                return None

        num_tokens_main_model = total_computed + num_new_tokens
        num_tokens_need_slot = min(num_tokens_main_model + num_lookahead_tokens, self.max_model_len)
        self.coordinator.remove_skipped_blocks(request.request_id, total_computed)
        need = self.coordinator.get_num_blocks_to_allocate(
            request.request_id,
            num_tokens_need_slot,
            hits,
            num_local_computed + num_external_computed_tokens,
            num_tokens_main_model=num_tokens_main_model,
            num_local_computed_tokens=num_local_computed,
        )
        if need + watermark_blocks > self.block_pool.get_num_free_blocks() - reserved_blocks:
            return None

        if hits is not self.empty_kv_cache_blocks.blocks or num_external_computed_tokens > 0:
            # as vLLM 0.34: a connector's tokens alone (no local hit) also start the table, so
            # a sliding window's blocks below its window are nulls, not allocated
            self.coordinator.allocate_new_computed_blocks(
                request.request_id, hits, num_local_computed, num_external_computed_tokens
            )
        new_blocks = self.coordinator.allocate_new_blocks(
            request.request_id, num_tokens_need_slot, num_tokens_main_model
        )
        if self.enable_caching and not delay_cache_blocks:
            self.coordinator.cache_blocks(
                request, min(total_computed + num_new_tokens, request.num_tokens)
            )
        return KVCacheBlocks(new_blocks)

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks up to ``num_computed_tokens``, never past its real
        tokens: a draft's slot may be overwritten, so it must not enter the prefix cache."""
        if self.enable_caching:
            self.coordinator.cache_blocks(request, min(num_computed_tokens, request.num_tokens))

    def take_kv_cache_block_copies(self) -> tuple[list[tuple[int, int]], list[KVCacheBlock]]:
        """The block copies queued since the last call, as (source id, destination id) for
        the worker, and the blocks they hold: the scheduler frees those once the copies ran."""
        pairs = self.coordinator.take_pending_cow_copies()
        return [(src.block_id, dst.block_id) for src, dst in pairs], [b for p in pairs for b in p]

    def new_step_starts(self) -> None:
        """The scheduler starts a step: a Mamba state cached last step may now be a hit."""
        self.coordinator.new_step_starts()

    def free(self, request) -> None:
        """Free every group's table in reverse order (group 0 first). The pool's observer
        hears it in a scope for the request, with the reason its status gives (free_reason)."""
        observer = self.block_pool.observer
        reason = free_reason(request) if observer is not None else None
        call_for_request(
            observer, request.request_id, None, reason, self.coordinator.free, request.request_id
        )

    def evict_blocks(self, block_ids) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        ok = self.block_pool.reset_prefix_cache()
        if ok:
            self.prefix_cache_stats.reset = True
        return ok

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """Each attention group's blocks that hold the first ``num_computed_tokens`` tokens
        (slots allocated ahead of them left out); other groups' tables whole."""
        clipped = []
        for group, ids in zip(self.coordinator.groups, self.get_block_ids(request_id)):
            if group.kind in ("full", "sliding"):
                ids = ids[: -(-num_computed_tokens // group.kv_cache_spec.block_size)]
            clipped.append(ids)
        return tuple(clipped)

    def take_events(self) -> list:
        """The pool's KV events, BlockStored stamped with its group's spec kind and window."""
        taken = self.block_pool.take_events()
        if not taken:  # most steps publish nothing: no group metadata to look up
            return taken
        meta = [
            (
                get_kv_cache_spec_kind(g.kv_cache_spec),
                get_kv_cache_spec_sliding_window(g.kv_cache_spec),
            )
            for g in self.coordinator.groups
        ]
        for ev in taken:
            if (
                isinstance(ev, BlockStored)
                and ev.group_idx is not None
                and 0 <= ev.group_idx < len(meta)
            ):
                ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window = meta[ev.group_idx]
        return taken
