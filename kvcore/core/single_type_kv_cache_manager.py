"""Per-attention-type block bookkeeping (vLLM: v1/core/single_type_kv_cache_manager.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from typing import ClassVar, Optional, Sequence

from kvcore.core.block_pool import BlockPool
from kvcore.core.kv_cache_observer import FREE_WINDOW, call_for_request
from kvcore.core.kv_cache_utils import (
    BlockHashListWithBlockSize,
    KVCacheBlock,
    resolve_block_hashes,
)
from kvcore.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcore.utils.math_utils import cdiv

# Why a block is copied (the observer's "copied" decision): a request's hit ends inside a
# cached block it will write into, so its table gets a private copy; or a running request's
# state was just cached inside the block it keeps writing, so the cache entry moves to a copy.
COPY_PARTIAL_HIT = "partial_hit"
COPY_KEEP_CACHED = "keep_cached"


class SingleTypeKVCacheManager(ABC):
    supports_fine_grained_hash_lookup: ClassVar[bool] = False

    """Block tables of one KV cache group.

    Invariant: ``req_to_blocks[r][i]`` is the physical block holding logical
    block i of request r (the null block where the tokens were skipped), and
    ``num_cached_block[r]`` counts the leading blocks already offered to the
    prefix cache. Only running requests appear here.

    Every pool call made for a request (touching its hits, allocating, freeing) sits in a
    request scope on the pool's observer (``KVCacheObserver.on_request_begin``), naming the
    request and this group; blocks sliding out of a window are freed with reason "window".
    """

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        max_admission_blocks_per_request: Optional[int] = None,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        # Set for specs that give blocks back while a request runs (sliding window):
        # the full-sequence admission check counts at most this many blocks.
        self.max_admission_blocks_per_request = max_admission_blocks_per_request
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}
        self._null_block = block_pool.null_block
        # Where hits may end: the block size; with several groups the coordinator sets the
        # scheduler's block size (a multiple of every group's), or the hash block size when it
        # enables hits inside a block (prefix_match_unit finer than the block).
        self.cache_hit_alignment_tokens = self.block_size
        # Whether this group's hits drop their last block for an EAGLE/MTP drafter (set by the
        # coordinator); it also moves which blocks sparse retention keeps.
        self.use_eagle = False
        # A partial hit's tail block, shared with the cache, is written by this request from
        # inside: it gets a private copy (copy-on-write) at its next allocation.
        self._partial_hit_reqs: dict[str, tuple[int, KVCacheBlock]] = {}
        self._pending_cow_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []

    @property
    def kind(self) -> str:
        return self.kv_cache_spec.kind

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
        num_tokens_main_model: Optional[int] = None,
        num_local_computed_tokens: Optional[int] = None,
    ) -> int:
        """Blocks this call would take from the free queue, hits sitting in the queue included.
        ``num_tokens_main_model`` is ``num_tokens`` less the lookahead (draft) slots; only a
        Mamba group in align mode reads it. ``total_computed_tokens`` counts a connector's
        tokens too, ``num_local_computed_tokens`` (default: the same) only the prefix cache's:
        a hit ending inside a block needs a copy only if the local hit ends there."""
        if num_local_computed_tokens is None:
            num_local_computed_tokens = total_computed_tokens
        num_required = cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self.max_admission_blocks_per_request is not None:
            num_required = min(num_required, self.max_admission_blocks_per_request)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            assert not new_computed_blocks
            return max(num_required - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local = len(new_computed_blocks) + num_req_blocks
        num_new = max(num_required - max(num_skipped_blocks, num_local), 0)
        skip_hits = max(0, num_skipped_blocks - num_req_blocks)
        evictable = sum(
            1 for b in new_computed_blocks[skip_hits:] if b.ref_cnt == 0 and not b.is_null
        )
        if self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens):
            num_new += 1  # the tail block's private copy
        return num_new + evictable

    def _has_partial_local_hit(
        self, new_computed_blocks: Sequence[KVCacheBlock], num_local_computed_tokens: int
    ) -> bool:
        """The hit ends inside one of this group's blocks (its tail needs copy-on-write)."""
        return bool(new_computed_blocks) and num_local_computed_tokens % self.block_size != 0

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int = 0,
    ) -> None:
        """Take the prefix-cache hits into the table (touching them); the blocks skipped below
        the window of all computed tokens, the connector's included, become null (vLLM 0.34:
        ``add_local_computed_blocks``)."""
        if request_id in self.num_cached_block:
            assert not new_computed_blocks
            return
        req_blocks = self.req_to_blocks[request_id]
        assert not req_blocks
        num_skipped_blocks = (
            self.get_num_skipped_tokens(num_local_computed_tokens + num_external_computed_tokens)
            // self.block_size
        )
        hits = list(new_computed_blocks[num_skipped_blocks:])
        if self.enable_caching and hits:
            pool = self.block_pool
            call_for_request(
                pool.observer, request_id, self.kv_cache_group_id, None, pool.touch, hits
            )
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(hits)
        self.num_cached_block[request_id] = len(req_blocks)
        if self._has_partial_local_hit(hits, num_local_computed_tokens):
            # Cached blocks count only the full ones, so the private copy is cached once full.
            block_idx = num_local_computed_tokens // self.block_size
            self._partial_hit_reqs[request_id] = (block_idx, hits[-1])
            self.num_cached_block[request_id] = block_idx

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: Optional[int] = None
    ) -> list[KVCacheBlock]:
        cow_blocks = []
        if request_id in self._partial_hit_reqs:
            # The shared tail is replaced in place by a private copy; its extra block was
            # counted by get_num_blocks_to_allocate.
            block_idx, source = self._partial_hit_reqs.pop(request_id)
            cow_blocks = self._get_new_blocks(request_id, 1)
            self._apply_cow(request_id, block_idx, source, cow_blocks[0])
        req_blocks = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return cow_blocks
        new_blocks = self._get_new_blocks(request_id, num_new)
        req_blocks.extend(new_blocks)
        return cow_blocks + new_blocks

    def _get_new_blocks(self, request_id: str, num_blocks: int) -> list[KVCacheBlock]:
        pool = self.block_pool
        return call_for_request(
            pool.observer, request_id, self.kv_cache_group_id, None, pool.get_new_blocks, num_blocks
        )

    def _apply_cow(
        self, request_id: str, block_idx: int, source: KVCacheBlock, cow_block: KVCacheBlock
    ) -> None:
        """The request's table points at ``cow_block`` instead of the shared ``source``; both
        stay held (one extra ref on ``cow_block``) until the copy has run on the worker."""
        req_blocks = self.req_to_blocks[request_id]
        assert req_blocks[block_idx] is source and not source.is_null and source.ref_cnt > 0
        req_blocks[block_idx] = cow_block
        self._pending_cow_copies.append((source, cow_block))
        cow_block.ref_cnt += 1
        self._tell_copy(request_id, source, cow_block, COPY_PARTIAL_HIT)

    def _tell_copy(
        self, request_id: str, source: KVCacheBlock, cow_block: KVCacheBlock, reason: str
    ) -> None:
        """The observer hears each queued copy when it is decided (ours: vLLM decides it here
        and hands it out in ``take_kv_cache_block_copies``)."""
        observer = self.block_pool.observer
        if observer is not None:
            observer.on_decision(
                "copied",
                request_id,
                block_ids=(cow_block.block_id,),
                group=self.kv_cache_group_id,
                source_block_id=source.block_id,
                reason=reason,
            )

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """(source, copy) pairs queued since the last call."""
        taken, self._pending_cow_copies = self._pending_cow_copies, []
        return taken

    def reachable_block_mask(
        self,
        start_block: int,
        end_block: int,
        retention_interval: Optional[int],
        reachable_boundaries: Sequence[int],
    ) -> Optional[list[bool]]:
        """Which of blocks [start_block, end_block) get a hash; None = all of them.
        Full attention can hit at any block boundary, so it keeps every block."""
        return None

    def cache_blocks(
        self,
        request,
        num_tokens: int,
        retention_interval: Optional[int] = 0,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        boundaries = list(replay_boundaries)
        if request.shared_prefix_boundary:
            boundaries.append(request.shared_prefix_boundary)
            if self.use_eagle:
                # a request that leaves the shared prefix right after it has no block past the
                # junction to match and drop, so its hit ends one block lower
                boundaries.append(request.shared_prefix_boundary - self.block_size)
        mask = self.reachable_block_mask(num_cached, num_full, retention_interval, boundaries)
        self.block_pool.cache_full_blocks(
            request,
            self.req_to_blocks[request.request_id],
            num_cached,
            num_full,
            self.block_size,
            self.kv_cache_group_id,
            mask,
        )
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str) -> None:
        """Free in reverse order: a request's tail blocks reach the queue first, so shared
        prefix blocks (freed last) stay cached longest."""
        req_blocks = self.req_to_blocks.pop(request_id, [])
        pool = self.block_pool
        call_for_request(
            pool.observer,
            request_id,
            self.kv_cache_group_id,
            None,
            pool.free_blocks,
            reversed(req_blocks),
        )
        self.num_cached_block.pop(request_id, None)
        self._partial_hit_reqs.pop(request_id, None)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        blocks = self.req_to_blocks[request_id]
        num_skipped_blocks = min(num_skipped_tokens // self.block_size, len(blocks))
        removed, slots = [], []
        for i in range(num_skipped_blocks - 1, -1, -1):
            if blocks[i] is self._null_block:
                break  # everything before it was nulled by an earlier call
            removed.append(blocks[i])
            slots.append(i)
            blocks[i] = self._null_block
        if removed:
            pool = self.block_pool
            if pool.observer is not None:
                pool.observer.on_decision(
                    "window_skipped",
                    request_id,
                    block_ids=tuple(b.block_id for b in removed),
                    group=self.kv_cache_group_id,
                    slots=tuple(slots),
                    num_computed_tokens=total_computed_tokens,
                )
            call_for_request(
                pool.observer,
                request_id,
                self.kv_cache_group_id,
                FREE_WINDOW,
                pool.free_blocks,
                removed,
            )

    def new_step_starts(self) -> None:
        """A scheduler step begins (only Mamba keeps per-step state)."""

    @abstractmethod
    def find_longest_cache_hit(
        self,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        drop_eagle_block: bool = False,
    ) -> tuple[list[list[KVCacheBlock]], int]:
        """(cached blocks of the longest hit per group in ``kv_cache_group_ids``, its length
        in tokens), at most ``max_length`` tokens and a multiple of
        ``cache_hit_alignment_tokens``; each attention type defines its own search.

        ``drop_eagle_block`` (an EAGLE/MTP drafter): the last matched block is given up, so
        it is computed again and the drafter gets the hidden states of its tokens."""


class FullAttentionManager(SingleTypeKVCacheManager):
    supports_fine_grained_hash_lookup: ClassVar[bool] = True

    def find_longest_cache_hit(
        self, block_hashes, max_length, kv_cache_group_ids, drop_eagle_block=False
    ):
        """Left to right; the chain means the first miss ends the hit. With hits inside a
        block, the first block not fully cached is then probed at each hash boundary inside
        it, longest first (a partial entry, ``cache_partial_block``). The EAGLE drop takes
        one block off a hit, or one hash block when hits end inside blocks."""
        bs, align = self.block_size, self.cache_hit_alignment_tokens
        pool = self.block_pool
        hashes = resolve_block_hashes(
            block_hashes,
            pool.hash_block_size,
            bs,
            supports_fine_grained_hash_lookup=True,
            alignment_tokens=align,
        )
        fine = align < bs and bs % align == 0
        full_hashes = BlockHashListWithBlockSize(hashes, align, bs) if fine else hashes
        out: list[list[KVCacheBlock]] = [[] for _ in kv_cache_group_ids]
        for block_hash in full_hashes[: max_length // bs]:
            cached = pool.get_cached_block(block_hash, kv_cache_group_ids)
            if cached is None:
                break
            for dst, blk in zip(out, cached):
                dst.append(blk)
        hit_length = len(out[0]) * bs
        if fine:
            scale = bs // align
            first = len(out[0]) * scale
            last = min(first + scale - 1, max_length // align, len(hashes))
            for fine_idx in range(last - 1, first - 1, -1):
                cached = pool.get_cached_block(hashes[fine_idx], kv_cache_group_ids)
                if cached is None:
                    continue
                for dst, blk in zip(out, cached):
                    dst.append(blk)
                hit_length = (fine_idx + 1) * align
                break
        if drop_eagle_block and hit_length > 0:
            hit_length -= min(align, bs)
        hit_length -= hit_length % align
        for dst in out:
            del dst[cdiv(hit_length, bs) :]
        return out, hit_length

    def cache_blocks(self, request, num_tokens, retention_interval=0, replay_boundaries=()):
        super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
        if self.block_size != self.block_pool.hash_block_size:
            self._cache_partial_tail_block(request, num_tokens)

    def _cache_partial_tail_block(self, request, num_tokens: int) -> None:
        """Key the prompt's last hash boundary (where a resend's hit stops) when it falls
        inside a block; the boundaries before it inside that block are not keyed."""
        hbs = self.block_pool.hash_block_size
        # an EAGLE lookup reads the whole prompt before it drops a hash block
        limit = request.num_prompt_tokens if self.use_eagle else request.num_prompt_tokens - 1
        boundary = min(limit // hbs, len(request.block_hashes)) * hbs
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_to_blocks[request.request_id]
        block_idx = boundary // self.block_size
        if block_idx >= len(blocks):
            return
        self.block_pool.cache_partial_block(
            request, blocks[block_idx], boundary, self.kv_cache_group_id, self.block_size
        )


class SlidingWindowManager(SingleTypeKVCacheManager):
    def __init__(
        self,
        kv_cache_spec: SlidingWindowSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        max_admission_blocks_per_request: Optional[int] = None,
    ) -> None:
        super().__init__(
            kv_cache_spec,
            block_pool,
            enable_caching,
            kv_cache_group_id,
            max_admission_blocks_per_request,
        )
        self.sliding_window = kv_cache_spec.sliding_window
        # A token sees itself and the W-1 before it, so W-1 earlier tokens must be cached.
        self.contiguous_blocks = cdiv(self.sliding_window - 1, self.block_size)

    def _contiguous_blocks_for_hit(self, use_eagle: bool) -> int:
        """Cached blocks in a row a hit needs: the window's, and with the EAGLE drop one more
        (matched, then dropped)."""
        return self.contiguous_blocks + int(use_eagle)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def reachable_block_mask(
        self, start_block, end_block, retention_interval, reachable_boundaries
    ):
        """A hit ending at an aligned boundary (``cache_hit_alignment_tokens``) needs the
        ``contiguous_blocks`` blocks before it, so only those tails are worth a hash. Interval
        None: a tail at every aligned boundary (all blocks, or none for a window of 1); n > 0:
        a tail every n tokens; and, unless None, the tails ending where a later request can
        stop (the resend cap ``num_prompt_tokens - 1`` and a shared-prefix boundary, each
        rounded down to the alignment). An alignment that is not a multiple of the block size
        cannot be drawn block by block: every block then gets a hash."""
        align = self.cache_hit_alignment_tokens
        if align % self.block_size:
            return None
        need = self._contiguous_blocks_for_hit(self.use_eagle)
        # with the EAGLE drop the matched run ends one block past the boundary it serves
        shift = int(self.use_eagle)
        mask = [False] * (end_block - start_block)
        segment_tokens = align if retention_interval is None else retention_interval
        if segment_tokens:
            per_segment = segment_tokens // self.block_size
            if need >= per_segment:
                return None
            for i in range(start_block, end_block):
                if i >= shift and (i - shift) % per_segment >= per_segment - need:
                    mask[i - start_block] = True
        if retention_interval is not None:
            for boundary in reachable_boundaries:
                end = boundary // align * align // self.block_size + shift
                for j in range(max(start_block, end - need), min(end_block, end)):
                    mask[j - start_block] = True
        return mask

    def find_longest_cache_hit(
        self, block_hashes, max_length, kv_cache_group_ids, drop_eagle_block=False
    ):
        """Right to left: the first run of ``contiguous_blocks`` cached blocks covers the
        window; blocks before it are outside the window and become null. The EAGLE drop
        asks for one block more in the run, then gives up its last block. A run must end on
        the alignment (``cache_hit_alignment_tokens``, after the drop), and a hit shorter
        than a window is cut back to it."""
        bs, align = self.block_size, self.cache_hit_alignment_tokens
        block_hashes = resolve_block_hashes(block_hashes, self.block_pool.hash_block_size, bs)
        max_blocks = max_length // bs
        null = self.block_pool.null_block
        out = [[null] * max_blocks for _ in kv_cache_group_ids]
        need = self._contiguous_blocks_for_hit(drop_eagle_block)
        run = 0
        found = False
        for i in range(max_blocks - 1, -1, -1):
            cached = self.block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if cached is None:
                run = 0
                continue
            if run == 0 and bs != align:
                # a run may only end where the hit (after the drop) lands on the alignment
                if ((i if drop_eagle_block else i + 1) * bs) % align:
                    continue
            for dst, blk in zip(out, cached):
                dst[i] = blk
            run += 1
            if run >= need:
                for dst in out:
                    del dst[i + run :]
                found = True
                break
        if not found:
            # Fewer than a window's worth: only a run starting at block 0 counts.
            for dst in out:
                del dst[run:]
            self._cut_to_alignment(out)
        if drop_eagle_block and out[0]:
            for dst in out:
                dst.pop()
            # the drop can leave the hit off the alignment when blocks are finer than it
            self._cut_to_alignment(out)
        return out, len(out[0]) * self.block_size

    def _cut_to_alignment(self, out: list[list[KVCacheBlock]]) -> None:
        """Drop trailing blocks until the hit ends on ``cache_hit_alignment_tokens``."""
        bs, align = self.block_size, self.cache_hit_alignment_tokens
        while bs != align and len(out[0]) * bs % align:
            for dst in out:
                dst.pop()


class MambaManager(SingleTypeKVCacheManager):
    """State blocks of a linear-attention group (vLLM 0.34's MambaManager, without
    prefill-checkpoint blocks, EAGLE and the connector's boundary-state hand-offs).

    Invariants. Mode "none": the table is one running state (plus ``num_speculative_blocks``)
    sized like any table, and prefix caching is off. Mode "align": slot i stands for the
    state after ``(i + 1) * block_size`` tokens; a request holds at most the state it resumes
    from, the one it writes this step and its speculative blocks; every other slot is the null
    block. The previous step's state (``last_state_block_idx``) is released once the next
    step has read it; a slot left behind by ``remove_skipped_blocks`` is never visited again
    (``_num_retired_blocks``). A state cached this step is not a hit until the next step
    (its bytes are written by this step's forward pass). With ``prefix_match_unit`` finer
    than the block, the state at the prompt's last hash boundary is keyed even inside a block
    and its hit is copied before the hitting request writes into it.
    """

    supports_fine_grained_hash_lookup: ClassVar[bool] = True

    def __init__(
        self,
        kv_cache_spec: MambaSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        max_admission_blocks_per_request: Optional[int] = None,
    ) -> None:
        super().__init__(
            kv_cache_spec,
            block_pool,
            enable_caching,
            kv_cache_group_id,
            max_admission_blocks_per_request,
        )
        self.mamba_cache_mode = kv_cache_spec.mamba_cache_mode
        if enable_caching and self.mamba_cache_mode != "align":
            raise ValueError("Mamba prefix caching requires mamba_cache_mode='align'")
        self.num_speculative_blocks = kv_cache_spec.num_speculative_blocks
        self.cached_blocks_this_step: set[bytes] = set()
        self.last_state_block_idx: dict[str, int] = {}
        self._num_retired_blocks: dict[str, int] = {}
        self._allocated_block_reqs: set[str] = set()

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # Only the state after the last computed token is needed.
        return num_computed_tokens - 1

    def find_longest_cache_hit(
        self, block_hashes, max_length, kv_cache_group_ids, drop_eagle_block=False
    ):
        """Right to left: the last cached state up to ``max_length`` is the whole hit (earlier
        states are not needed), padded in front with null blocks. With hits inside a block,
        every hash boundary is probed (a state keyed there by ``cache_partial_block``).
        A state group never drops a block for EAGLE (a draft model has no Mamba layers); the
        coordinator refuses the drop with a Mamba group, whose EAGLE checkpoints are not
        modelled."""
        pool, bs, align = self.block_pool, self.block_size, self.cache_hit_alignment_tokens
        null = pool.null_block
        hashes = resolve_block_hashes(
            block_hashes,
            pool.hash_block_size,
            bs,
            supports_fine_grained_hash_lookup=True,
            alignment_tokens=align,
        )
        if align < bs and bs % align == 0:
            scale = bs // align
            for fine_idx in range(min(max_length // align, len(hashes)) - 1, -1, -1):
                cached = pool.get_cached_block(hashes[fine_idx], kv_cache_group_ids)
                if cached:
                    block_idx = fine_idx // scale
                    return [[null] * block_idx + [b] for b in cached], (fine_idx + 1) * align
            return [[] for _ in kv_cache_group_ids], 0
        for i in range(max_length // bs - 1, -1, -1):
            cached = pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached:
                if align != bs and (i + 1) * bs % align:
                    continue
                return [[null] * i + [blk] for blk in cached], (i + 1) * bs
        return [[] for _ in kv_cache_group_ids], 0

    def reachable_block_mask(
        self, start_block, end_block, retention_interval, reachable_boundaries
    ):
        """A hit needs exactly the one state ending on its boundary. Interval None: every
        state; 0: only the states where a later request can stop; n > 0: those plus one
        every n tokens."""
        if retention_interval is None:
            return None
        mask = [False] * (end_block - start_block)
        if retention_interval:
            per_segment = retention_interval // self.block_size
            if per_segment <= 1:
                return None
            first = (start_block + per_segment) // per_segment * per_segment - 1
            for i in range(first - start_block, len(mask), per_segment):
                mask[i] = True
        align = self.cache_hit_alignment_tokens
        for boundary in reachable_boundaries:
            # a hit lands on the alignment, so the state kept is the one there
            block = boundary // align * align // self.block_size - 1
            if start_block <= block < end_block:
                mask[block - start_block] = True
        return mask

    def get_num_blocks_to_allocate(
        self,
        request_id,
        num_tokens,
        new_computed_blocks,
        total_computed_tokens,
        apply_admission_cap=False,
        num_tokens_main_model=None,
        num_local_computed_tokens=None,
    ):
        if num_local_computed_tokens is None:
            num_local_computed_tokens = total_computed_tokens
        if new_computed_blocks and new_computed_blocks[-1].block_hash in (
            self.cached_blocks_this_step
        ):
            # More than the pool holds: the request waits for the step that writes the state.
            return self.block_pool.num_gpu_blocks + 1
        if self.mamba_cache_mode != "align":
            return super().get_num_blocks_to_allocate(
                request_id,
                num_tokens + self.block_size * self.num_speculative_blocks,
                new_computed_blocks,
                total_computed_tokens,
                apply_admission_cap,
                num_local_computed_tokens=num_local_computed_tokens,
            )
        # Lookahead slots are left out: draft models have no Mamba layers, and they would
        # break the alignment.
        if num_tokens_main_model is not None:
            num_tokens = num_tokens_main_model
        num_required = cdiv(num_tokens, self.block_size) + self.num_speculative_blocks
        num_new = num_required - len(new_computed_blocks) - len(self.req_to_blocks[request_id])
        has_partial_hit = (
            self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens)
            or request_id in self._partial_hit_reqs
        )
        if has_partial_hit:
            num_new = max(num_new, 0) + 1
        if num_new > 0:
            cap = 1 + int(has_partial_hit)
            if request_id not in self._allocated_block_reqs:
                cap += self.num_speculative_blocks
            num_new = min(num_new, cap)
        evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        # A negative num_new (blocks held past the need) lowers the sum, as in vLLM.
        return num_new + evictable

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model=None):
        """Align mode: returns the table's new tail (null slots, relocated speculative
        blocks, fresh blocks), which is what the worker appends to its block table."""
        k = self.num_speculative_blocks
        if self.mamba_cache_mode != "align":
            return super().allocate_new_blocks(request_id, num_tokens + self.block_size * k)
        if num_tokens_main_model is not None:
            num_tokens = num_tokens_main_model
        req_blocks = self.req_to_blocks[request_id]
        num_required = cdiv(num_tokens, self.block_size) + k
        partial_hit = self._partial_hit_reqs.get(request_id)
        if num_required <= len(req_blocks) and partial_hit is None:
            self._allocated_block_reqs.add(request_id)
            return []
        prev_len = len(req_blocks)
        allocated_before = request_id in self._allocated_block_reqs
        if allocated_before:
            # The running state sits just before the speculative blocks.
            self.last_state_block_idx[request_id] = prev_len - 1 - k
        elif prev_len > 0:
            # A prefix hit: its last block is the state to resume from.
            self.last_state_block_idx[request_id] = prev_len - 1
        num_skipped = num_required - k - 1
        if prev_len < num_skipped:
            req_blocks.extend([self._null_block] * (num_skipped - prev_len))
        if allocated_before:
            for i in range(prev_len - k, prev_len):
                if i >= num_skipped:
                    break
                # A speculative scratch block moves to the new tail; its slot becomes null.
                req_blocks.append(req_blocks[i])
                req_blocks[i] = self._null_block
        num_new = max(num_required - len(req_blocks), 0) + int(partial_hit is not None)
        assert num_new <= 1 + int(partial_hit is not None) + (0 if allocated_before else k)
        new_blocks = self._get_new_blocks(request_id, num_new)
        returned = req_blocks[prev_len:]
        if partial_hit is not None:
            block_idx, source = partial_hit
            cow_block, new_blocks = new_blocks[0], new_blocks[1:]
            if allocated_before:
                # A running request's table only grows, so it keeps writing into ``source``;
                # the cache entry moves to the copy instead, filled before the forward pass.
                assert req_blocks[block_idx] is source
                self.block_pool.move_block_hashes(source, cow_block)
                self._pending_cow_copies.append((source, cow_block))
                source.ref_cnt += 1
                self._tell_copy(request_id, source, cow_block, COPY_KEEP_CACHED)
                if cow_block.block_hash is not None:
                    self.cached_blocks_this_step.add(cow_block.block_hash)
            else:
                self._apply_cow(request_id, block_idx, source, cow_block)
                returned = [cow_block] + returned
        req_blocks.extend(new_blocks)
        self._allocated_block_reqs.add(request_id)
        self._partial_hit_reqs.pop(request_id, None)
        returned.extend(new_blocks)
        return returned

    def _free_state_blocks(self, request_id: str, blocks: list[KVCacheBlock]) -> None:
        pool = self.block_pool
        call_for_request(
            pool.observer, request_id, self.kv_cache_group_id, FREE_WINDOW, pool.free_blocks, blocks
        )

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        if self.mamba_cache_mode != "align":
            super().remove_skipped_blocks(request_id, total_computed_tokens)
            return
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens > 0:
            blocks = self.req_to_blocks[request_id]
            first = self._num_retired_blocks.get(request_id, 0)
            last = min(num_skipped_tokens // self.block_size, len(blocks))
            if first < last:
                # Prefill leaves null gaps between states: skip them, do not stop at them.
                freed = []
                for i in range(last - 1, first - 1, -1):
                    if not blocks[i].is_null:
                        freed.append(blocks[i])
                        blocks[i] = self._null_block
                if freed:
                    self._free_state_blocks(request_id, freed)
                self._num_retired_blocks[request_id] = last
        idx = self.last_state_block_idx.get(request_id)
        if idx is not None and idx < cdiv(total_computed_tokens, self.block_size) - 1:
            blocks = self.req_to_blocks[request_id]
            if not blocks[idx].is_null:
                self._free_state_blocks(request_id, [blocks[idx]])
                blocks[idx] = self._null_block

    def cache_blocks(self, request, num_tokens, retention_interval=0, replay_boundaries=()):
        rid = request.request_id
        before = self.num_cached_block.get(rid, 0)
        super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
        after = self.num_cached_block.get(rid, 0)
        if self.mamba_cache_mode == "align":
            partial_key = self._cache_partial_tail_block(request, num_tokens)
            if partial_key is not None:
                self.cached_blocks_this_step.add(partial_key)
        blocks = self.req_to_blocks[rid]
        for i in range(before, after):
            if not blocks[i].is_null and blocks[i].block_hash is not None:
                self.cached_blocks_this_step.add(blocks[i].block_hash)

    def _cache_partial_tail_block(self, request, num_tokens: int) -> Optional[bytes]:
        """At the prompt's last hash boundary (where a resend stops), key the state there,
        even inside a block; the next step's forward pass would overwrite it in place, so
        the request's next allocation gives the cache a private copy (copy-on-write)."""
        hbs = self.block_pool.hash_block_size
        if num_tokens <= 0 or num_tokens % hbs:
            return None
        if num_tokens != max((request.num_prompt_tokens - 1) // hbs * hbs, 0):
            return None
        block_idx = cdiv(num_tokens, self.block_size) - 1
        blocks = self.req_to_blocks[request.request_id]
        if block_idx >= len(blocks) or blocks[block_idx].is_null:
            return None
        source = blocks[block_idx]
        if source.block_hash_num_tokens == num_tokens:
            return None  # keyed here already (a hit or an earlier step)
        key = self.block_pool.cache_partial_block(
            request, source, num_tokens, self.kv_cache_group_id, self.block_size
        )
        if key is not None and num_tokens % self.block_size:
            self._partial_hit_reqs[request.request_id] = (block_idx, source)
            self.num_cached_block[request.request_id] = block_idx
        return key

    def new_step_starts(self) -> None:
        self.cached_blocks_this_step.clear()

    def free(self, request_id: str) -> None:
        self._allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self._num_retired_blocks.pop(request_id, None)
        super().free(request_id)


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec,
    block_pool: BlockPool,
    enable_caching: bool,
    kv_cache_group_id: int,
    max_in_flight_tokens: int,
    max_model_len: int,
) -> SingleTypeKVCacheManager:
    cap = kv_cache_spec.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return SlidingWindowManager(
            kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, cap
        )
    if isinstance(kv_cache_spec, FullAttentionSpec):
        return FullAttentionManager(
            kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, cap
        )
    if isinstance(kv_cache_spec, MambaSpec):
        return MambaManager(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id, cap)
    raise ValueError(f"no manager for KV cache spec {type(kv_cache_spec).__name__}")
