"""Planning the KV cache's groups from the layers' specs (vLLM 0.34.0: v1/core/kv_cache_planning.py;
0.33.0 kept these functions in the same file).

kvcore models four of that file's decisions: how many layers share one KV cache group of a
hybrid model (``uniform_page_group_size``), what becomes of the layers' specs when the hybrid KV
cache manager is off (``unify_hybrid_kv_cache_specs``), and the last step of vLLM 0.34's
extensible KV cache: the block count settled from what the workers measured free after warm-up
(``finalize_extensible_kv_cache``), and the configs lowered to it, with the refusal when
``max_model_len`` no longer fits (``shrink_kv_cache_configs``). All are pure functions of specs,
counts and settings; the bytes (memory per block, the capacity reserved, the memory measured)
are the lab's arithmetic in :mod:`kvcore.model.memory`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from kvcore.config.cache import CacheConfig
from kvcore.config.scheduler import SchedulerConfig
from kvcore.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcore.utils.math_utils import cdiv


def uniform_page_group_size(bucket_sizes: Sequence[int]) -> int:
    """How many layers each KV cache group of a hybrid model holds (vLLM 0.34's
    ``kv_cache_planning._get_kv_cache_groups_uniform_page_size``), given the number of layers
    of each kind: the smallest kind's count, or the largest's when no kind has 1.5 times as
    many layers as the smallest. One block of the shared pool is this many pages."""
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < smallest * 1.5 else smallest


def unify_hybrid_kv_cache_specs(kv_cache_spec: dict) -> None:
    """With the hybrid KV cache manager off, make every layer's spec one kind, in place (vLLM
    0.34.0: ``kv_cache_planning.unify_hybrid_kv_cache_specs``, called first thing by
    ``get_kv_cache_groups`` when ``disable_hybrid_kv_cache_manager`` is set).

    ``kv_cache_spec`` maps layer names to specs. Specs that are already one kind are left as they
    are (every layer sliding with one window stays sliding). When full-attention and
    sliding-window layers are both present, every sliding-window layer gets a
    ``FullAttentionSpec`` (of the full-attention layers' block size when they share one): it is
    then given a block for every token of a request, and keeps them all, though its attention
    still reads only its window. Nothing else is converted: a Mamba (state) layer beside
    attention layers leaves two kinds, and that is a ValueError, as in vLLM ("Failed to promote
    local KV cache specs to one unified type"; vLLM keeps apart only the attention layers whose
    cache is not sharded across decode context parallel ranks, which the lab does not model)."""
    if len(set(kv_cache_spec.values())) <= 1:
        return
    specs = kv_cache_spec.values()
    full_sizes = {s.block_size for s in specs if isinstance(s, FullAttentionSpec)}
    if full_sizes and any(isinstance(s, SlidingWindowSpec) for s in specs):
        for name, spec in list(kv_cache_spec.items()):
            if isinstance(spec, SlidingWindowSpec):
                size = next(iter(full_sizes)) if len(full_sizes) == 1 else spec.block_size
                kv_cache_spec[name] = FullAttentionSpec(size)
    if len(set(kv_cache_spec.values())) > 1:
        raise ValueError("Failed to promote local KV cache specs to one unified type.")


def _max_blocks_per_request(
    scheduler_config: SchedulerConfig, groups: Sequence[KVCacheGroupSpec]
) -> int:
    """Blocks one request of ``max_model_len`` tokens can hold at once, summed over the groups
    (vLLM 0.34.0's ``_max_memory_usage_bytes_from_groups`` divided by the pool's bytes per block:
    every group's page has the same bytes). Full attention: every block of the request; sliding
    window: the window plus one step's tokens, and one more; Mamba: its running states (2 in
    "align" mode, 1 in "none", plus the speculative blocks)."""
    max_len = scheduler_config.max_model_len
    total = 0
    for group in groups:
        spec = group.kv_cache_spec
        if isinstance(spec, MambaSpec):
            total += (2 if spec.mamba_cache_mode == "align" else 1) + spec.num_speculative_blocks
        else:
            capped = spec.max_admission_blocks_per_request(
                scheduler_config.max_num_batched_tokens, max_len
            )
            total += cdiv(max_len, spec.block_size) if capped is None else capped
    return total


def _estimate_max_model_len_from_groups(
    scheduler_config: SchedulerConfig, groups: Sequence[KVCacheGroupSpec], usable_blocks: int
) -> int:
    """The longest ``max_model_len`` whose request fits in ``usable_blocks`` (a binary search
    over 1..max_model_len, as vLLM's function of this name); 0 when not even one token fits."""

    def fits(n: int) -> bool:
        return _max_blocks_per_request(replace(scheduler_config, max_model_len=n), groups) <= (
            usable_blocks
        )

    left, right = 1, scheduler_config.max_model_len
    if not fits(left):
        return 0
    best = 1
    while left <= right:
        mid = (left + right) // 2
        if fits(mid):
            best, left = mid, mid + 1
        else:
            right = mid - 1
    return best


def shrink_kv_cache_configs(
    scheduler_config: SchedulerConfig, kv_cache_configs: Sequence[KVCacheConfig], num_blocks: int
) -> list[KVCacheConfig]:
    """Lower every config to ``num_blocks`` blocks once the extensible KV cache is sized from
    measured memory (vLLM 0.34.0: ``kv_cache_planning.shrink_kv_cache_configs``).

    ``num_blocks`` is never above a config's own count (an AssertionError, as vLLM's assert). A
    ValueError refuses a count whose blocks, less the null block the pool holds back, no longer
    hold one request of ``max_model_len`` tokens: its message gives the longest length that still
    fits, as vLLM's ``_check_enough_kv_cache_memory`` does; no usable block at all is refused as
    "no available memory".

    Where it differs from vLLM's, and why: vLLM takes the ``VllmConfig``; kvcore has none, and
    the two values read from it (``max_model_len``, and ``max_num_batched_tokens`` for a sliding
    window's in-flight tokens) are kvcore's ``SchedulerConfig``'s. vLLM lowers its configs in
    place and also cuts each KV cache tensor's size in proportion; kvcore's ``KVCacheConfig`` is
    frozen and holds no tensors, so the lowered configs are returned, in order, and nothing else
    changes. The needed memory is counted in blocks, which equals vLLM's bytes because every
    group's page has the pool's bytes per block."""
    out = []
    for config in kv_cache_configs:
        assert num_blocks <= config.num_blocks, (num_blocks, config.num_blocks)
        groups = config.kv_cache_groups
        usable = num_blocks - 1  # the null block is held back by the BlockPool
        if usable <= 0:
            raise ValueError(
                "No available memory for the cache blocks: the memory measured after warm-up "
                f"holds {num_blocks} block(s), the null block included."
            )
        needed = _max_blocks_per_request(scheduler_config, groups)
        if needed > usable:
            longest = _estimate_max_model_len_from_groups(scheduler_config, groups, usable)
            estimate = f" The longest max_model_len that fits is {longest}." if longest > 0 else ""
            raise ValueError(
                f"max_model_len ({scheduler_config.max_model_len}) no longer fits: one request "
                f"needs {needed} blocks, and the KV cache sized after warm-up has {usable} "
                f"usable blocks (num_blocks {num_blocks} less the null block).{estimate} "
                "Decrease max_model_len or max_num_seqs, or free device memory."
            )
        out.append(replace(config, num_blocks=num_blocks))
    return out


def finalize_extensible_kv_cache(
    scheduler_config: SchedulerConfig,
    cache_config: CacheConfig,
    kv_cache_configs: Sequence[KVCacheConfig],
    scheduler_kv_cache_config: KVCacheConfig,
    compilation_times: Sequence,
) -> int:
    """Settle the extensible KV cache's block count from what the workers measured free after
    warm-up (vLLM 0.34.0: ``kv_cache_planning.finalize_extensible_kv_cache``), and return it.

    Every worker must use one count, so it is the smallest ``num_kv_blocks`` the workers
    reported (each ``compilation_times`` item's, ``kvcore.worker.worker_base.CompilationTimes``;
    a None is a worker that measured nothing), never above the capacity reserved before warm-up
    (the scheduler config's ``num_blocks``); with no measurement at all, the capacity stays.
    ``shrink_kv_cache_configs`` then lowers the workers' and the scheduler's configs to it (a
    ValueError when ``max_model_len`` no longer fits), and ``cache_config.num_gpu_blocks``
    records it.

    Where it differs from vLLM's, and why: ``scheduler_config`` and ``cache_config`` stand for
    the ``VllmConfig`` (kvcore has none). kvcore's configs are frozen, so the lowered configs are
    not written back: the caller builds its pool from the count returned (the lab's engine does).
    vLLM fits ``max_model_len`` again when it was "auto" (-1) and logs the capacity
    (``update_kv_cache_capacity``); kvcore models neither, its ``max_model_len`` is always
    stated."""
    capacity = scheduler_kv_cache_config.num_blocks
    measured = [t.num_kv_blocks for t in compilation_times if t.num_kv_blocks is not None]
    num_blocks = min(min(measured, default=capacity), capacity)
    shrink_kv_cache_configs(
        scheduler_config, [*kv_cache_configs, scheduler_kv_cache_config], num_blocks
    )
    cache_config.num_gpu_blocks = num_blocks
    return num_blocks
