"""KV cache coordinator: one single-type manager per KV cache group, one shared BlockPool
(vLLM: v1/core/kv_cache_coordinator.py).

A uniform model has one group; a model mixing full attention with sliding-window
or linear-attention (Mamba) layers has one group per kind. Every request has one
block table per group, all drawn from the same free queue. Groups may have different block
sizes (``group_block_sizes``); hits and cacheable prefixes then align to
``scheduler_block_size``, their least common multiple, unless hits may end inside blocks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional, Sequence

from kvcore.core.block_pool import FREE_ORDER_V033, BlockPool
from kvcore.core.kv_cache_utils import (
    KVCacheBlock,
    eagle_proof_margin,
    partial_hash_hits_enabled,
    resolve_kv_cache_block_sizes,
)
from kvcore.core.single_type_kv_cache_manager import (
    SingleTypeKVCacheManager,
    get_manager_for_kv_cache_spec,
)
from kvcore.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from kvcore.utils.math_utils import cdiv

__all__ = [
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "UnitaryKVCacheCoordinator",
    "HybridKVCacheCoordinator",
    "get_kv_cache_coordinator",
    "replay_boundaries",
    "KVCacheGroupSpec",
]


def replay_boundaries(
    num_prompt_tokens: int, scheduler_block_size: int = 1, use_eagle: bool = False
) -> tuple[int, ...]:
    """Where a later request replaying this prompt can stop its hit: a resend of the
    same prompt is capped at ``num_prompt_tokens - 1`` (its last token is recomputed).

    With the EAGLE drop a hit ends one block below what matched: a resend stops one block
    under its last block boundary at or below ``num_prompt_tokens - 1``, a longer request
    sharing the whole prompt one block under the prompt's last block boundary (the two differ
    only when the prompt fills its last block exactly)."""
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    block = scheduler_block_size
    resend = (num_prompt_tokens - 1) // block * block
    extension = num_prompt_tokens // block * block
    return tuple(sorted({max(resend - block, 0), max(extension - block, 0)}))


class KVCacheCoordinator(ABC):
    """Fans each call out to the groups in group order and sums what they need."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_in_flight_tokens: int,
        enable_caching: bool,
        free_order: str = FREE_ORDER_V033,
        enable_kv_cache_events: bool = False,
        hash_block_size: Optional[int] = None,
        use_eagle: bool = False,
    ) -> None:
        self.kv_cache_config = kv_cache_config
        # The scheduling grain: a multiple of every group's block size and of hash_block_size.
        # Request.block_hashes are made every hash_block_size tokens (prefix_match_unit, or
        # the groups' greatest common divisor).
        self.scheduler_block_size, self.hash_block_size = resolve_kv_cache_block_sizes(
            kv_cache_config.kv_cache_groups, hash_block_size, enable_caching
        )
        self.enable_caching = enable_caching
        self.groups = tuple(kv_cache_config.kv_cache_groups)
        self.retention_interval = kv_cache_config.prefix_cache_retention_interval
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks,
            enable_caching,
            self.hash_block_size,
            enable_kv_cache_events,
            free_order=free_order,
        )
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec,
                self.block_pool,
                enable_caching,
                gid,
                max_in_flight_tokens,
                max_model_len,
            )
            for gid, g in enumerate(self.groups)
        )
        self.group_block_sizes = tuple(m.block_size for m in self.single_type_managers)
        # The groups whose hits drop their last block for an EAGLE/MTP drafter: those flagged
        # as holding its layers, or every group when none is flagged (vLLM's fallback).
        self.eagle_group_ids: set[int] = {
            i for i, g in enumerate(self.groups) if getattr(g, "is_eagle_group", False)
        }
        if use_eagle and not self.eagle_group_ids:
            self.eagle_group_ids = set(range(len(self.groups)))
        self.drop_eagle_group_ids: set[int] = self.eagle_group_ids if use_eagle else set()
        if (
            enable_caching
            and self.drop_eagle_group_ids
            and any(m.kind == "mamba" for m in self.single_type_managers)
        ):
            # vLLM moves a Mamba group's prefill checkpoints for EAGLE
            # (MambaManager.drop_eagle_checkpoint_block); kvcore's MambaManager has no
            # prefill checkpoints, so it cannot follow.
            raise ValueError("the EAGLE block drop with a Mamba KV cache group is not modelled")

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_tokens_main_model: Optional[int] = None,
        num_local_computed_tokens: Optional[int] = None,
    ) -> int:
        return sum(
            m.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks[i],
                total_computed_tokens,
                apply_admission_cap,
                num_tokens_main_model,
                num_local_computed_tokens=num_local_computed_tokens,
            )
            for i, m in enumerate(self.single_type_managers)
        )

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int = 0,
    ) -> None:
        """Each group's hits into its table, after the nulls for what its window skips of all
        computed tokens (local and the connector's). vLLM 0.34 then allocates the connector's
        blocks in a second pass over the groups (``allocate_external_computed_blocks``), after
        every group has touched its hits; kvcore allocates them with the step's new blocks
        (``allocate_new_blocks``), the same blocks in the same order from the free queue's head,
        since nothing is allocated between the two."""
        for i, m in enumerate(self.single_type_managers):
            m.allocate_new_computed_blocks(
                request_id,
                new_computed_blocks[i],
                num_local_computed_tokens,
                num_external_computed_tokens,
            )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: Optional[int] = None
    ) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            m.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
            for m in self.single_type_managers
        )

    def new_step_starts(self) -> None:
        for m in self.single_type_managers:
            m.new_step_starts()

    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int:
        return num_computed_tokens

    def cache_blocks(self, request, num_computed_tokens: int) -> None:
        boundaries = replay_boundaries(
            request.num_prompt_tokens,
            self.scheduler_block_size,
            bool(self.drop_eagle_group_ids),
        )
        for gid, m in enumerate(self.single_type_managers):
            if m.enable_caching:
                num_tokens = self.get_num_cacheable_tokens(num_computed_tokens, gid)
                m.cache_blocks(request, num_tokens, self.retention_interval, boundaries)

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        return [pair for m in self.single_type_managers for pair in m.take_pending_cow_copies()]

    def emit_cached_block_events(
        self, request, computed_blocks: Sequence[Sequence[KVCacheBlock]]
    ) -> None:
        """A BlockStored per group for the request's prefix-cache hit (null blocks included
        in the count, as the hit's block table has them)."""
        for gid, blocks in enumerate(computed_blocks):
            if blocks:
                self.single_type_managers[gid].block_pool.emit_cached_block_events(
                    request, len(blocks), self.groups[gid].kv_cache_spec.block_size, gid
                )

    def free(self, request_id: str) -> None:
        for m in self.single_type_managers:
            m.free(request_id)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        for m in self.single_type_managers:
            m.remove_skipped_blocks(request_id, total_computed_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(list(m.req_to_blocks.get(request_id, ())) for m in self.single_type_managers)

    @abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        """(hit blocks per group, hit length in tokens, uncached shared-prefix tokens):
        the last is how far one group's own hit reaches past the hit all groups
        agree on (0 unless hybrid)."""


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Prefix caching off: nothing is ever a hit."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_in_flight_tokens: int,
        free_order: str = FREE_ORDER_V033,
        enable_kv_cache_events: bool = False,
        hash_block_size: Optional[int] = None,
        use_eagle: bool = False,
    ) -> None:
        super().__init__(
            kv_cache_config,
            max_model_len,
            max_in_flight_tokens,
            False,
            free_order,
            enable_kv_cache_events,
            hash_block_size,
            use_eagle,
        )

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        return tuple([] for _ in self.single_type_managers), 0, 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """One KV cache group (all layers full attention, or all sliding window)."""

    def __init__(self, kv_cache_config: KVCacheConfig, *args, **kwargs) -> None:
        super().__init__(kv_cache_config, *args, **kwargs)
        self.single_type_managers[0].use_eagle = 0 in self.drop_eagle_group_ids

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        hits, hit_length = self.single_type_managers[0].find_longest_cache_hit(
            block_hashes,
            max_cache_hit_length,
            [0],
            drop_eagle_block=0 in self.drop_eagle_group_ids,
        )
        return (hits[0],), hit_length, 0


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Several KV cache groups of different attention types sharing one pool.

    ``enable_partial_hash_hits``: hits may end at any hash boundary inside a block (a Mamba
    group in align mode, a ``prefix_match_unit`` finer than the block, no group that can only
    look up whole blocks); else they end on block boundaries.
    """

    def __init__(self, kv_cache_config: KVCacheConfig, *args, **kwargs) -> None:
        super().__init__(kv_cache_config, *args, **kwargs)
        self.enable_partial_hash_hits = partial_hash_hits_enabled(
            kv_cache_config.kv_cache_groups, self.hash_block_size
        )
        align = self.hash_block_size if self.enable_partial_hash_hits else self.scheduler_block_size
        for gid, m in enumerate(self.single_type_managers):
            m.cache_hit_alignment_tokens = align
            m.use_eagle = gid in self.drop_eagle_group_ids

    def _align_cacheable(self, num_tokens: int) -> int:
        # Without hits inside a block no later request can use a sub-block boundary.
        if self.enable_partial_hash_hits:
            return num_tokens
        return num_tokens // self.scheduler_block_size * self.scheduler_block_size

    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int:
        cacheable = self._align_cacheable(num_computed_tokens)
        manager = self.single_type_managers[kv_cache_group_id]
        if manager.use_eagle and cacheable > 0:
            # an EAGLE hit matches one of the group's blocks past the aligned boundary, then
            # drops it: that block must be cached too
            return min(num_computed_tokens, cacheable + manager.block_size)
        return cacheable

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        """Fixed point over the groups: each one accepts the candidate length or shortens it.

        Full attention scans first (its hit is downward closed, so later rounds just
        trim it); the sliding-window search is capped at the current length. A hit
        that holds in one group only is therefore no hit — but its length is kept:
        past the agreed hit lies a shared prefix the other group has not cached yet.

        An EAGLE group looks one margin (``eagle_proof_margin``) past the candidate and drops
        its last matched block, so it lands back on the candidate when the block past it is
        cached. It drops at most once per candidate length: once another group shortens the
        candidate, every EAGLE group is asked again.
        """
        managers = self.single_type_managers
        order = sorted(range(len(managers)), key=lambda g: managers[g].kind != "full")
        hits: list[Optional[list[KVCacheBlock]]] = [None] * len(order)
        lengths = [0] * len(order)
        hit_length = max_cache_hit_length
        longest_hit_length = 0
        simple = len(order) == 2 and managers[order[0]].kind == "full"
        eagle_verified: set[int] = set()
        while True:
            curr = hit_length
            for g in order:
                m = managers[g]
                if m.kind == "full" and hits[g] is not None:
                    curr = min(curr, lengths[g])
                    continue
                drop_eagle_block = g in self.drop_eagle_group_ids and g not in eagle_verified
                max_length = curr
                if drop_eagle_block and m.kind != "mamba":
                    margin = eagle_proof_margin(
                        m.block_size,
                        self.hash_block_size,
                        self.enable_partial_hash_hits and m.supports_fine_grained_hash_lookup,
                    )
                    max_length = min(curr + margin, len(block_hashes) * self.hash_block_size)
                found, new_length = m.find_longest_cache_hit(
                    block_hashes, max_length, [g], drop_eagle_block=drop_eagle_block
                )
                if drop_eagle_block:
                    eagle_verified.add(g)
                elif new_length < curr:
                    eagle_verified.clear()
                curr = new_length
                hits[g], lengths[g] = found[0], curr
                longest_hit_length = max(longest_hit_length, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break  # one full + one other group: the first round is already final
        for g in order:
            if managers[g].kind == "full" and hits[g] is not None:
                del hits[g][cdiv(hit_length, managers[g].block_size) :]
        return (
            tuple(h if h is not None else [] for h in hits),
            hit_length,
            longest_hit_length - hit_length,
        )


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    max_in_flight_tokens: int,
    enable_caching: bool,
    free_order: str = FREE_ORDER_V033,
    enable_kv_cache_events: bool = False,
    hash_block_size: Optional[int] = None,
    use_eagle: bool = False,
) -> KVCacheCoordinator:
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config,
            max_model_len,
            max_in_flight_tokens,
            free_order,
            enable_kv_cache_events,
            hash_block_size,
            use_eagle,
        )
    cls = (
        UnitaryKVCacheCoordinator
        if len(kv_cache_config.kv_cache_groups) == 1
        else HybridKVCacheCoordinator
    )
    return cls(
        kv_cache_config,
        max_model_len,
        max_in_flight_tokens,
        True,
        free_order,
        enable_kv_cache_events,
        hash_block_size,
        use_eagle,
    )
