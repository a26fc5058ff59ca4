"""The extensible KV cache's measurement after warm-up (vLLM 0.34.0:
vllm/v1/worker/extensible_kv_cache.py).

vLLM reserves the cache's addresses in virtual memory for the capacity the profiling estimate
gives, runs the warm-up (and captures CUDA graphs) with only a few blocks' pages committed, then
measures the device's free memory and commits as many blocks as ``measure_kv_cache_bytes``
allows. kvcore keeps that arithmetic (pure Python); the lab's engine reserves nothing (its pool is
a tensor made once the count is known), so only the count is modelled, not the paging.
"""

from __future__ import annotations

GiB = 1 << 30
# vLLM's margins on CUDA (ROCm keeps 3 GiB and 1 GiB): the memory kept free beyond the measured
# peak, for transients the profiling forward does not reach, and for allocations outside torch.
KV_CACHE_MARGIN_FLOOR_BYTES = 1 * GiB
KV_CACHE_MARGIN_FRACTION = 0.75
KV_CACHE_NON_TORCH_RESERVE_BYTES = GiB // 2


def measure_kv_cache_bytes(
    *,
    init_free_memory: int,
    free_memory: int,
    committed_bytes: int,
    requested_memory: int,
    transient_peak_bytes: int = 0,
    torch_reserve_growth_bytes: int = 0,
    margin_floor_bytes: int = KV_CACHE_MARGIN_FLOOR_BYTES,
    margin_fraction: float = KV_CACHE_MARGIN_FRACTION,
) -> int:
    """The bytes the KV cache may take, from the memory measured after warm-up (vLLM's function
    of this name, the same arithmetic):

        used by the engine  = init_free_memory - free_memory - committed_bytes
        headroom            = free_memory + committed_bytes
        margin              = max(margin_floor_bytes, margin_fraction * transient_peak_bytes)
        bytes               = min(requested_memory - used by the engine, headroom - margin)
                              - max(transient_peak_bytes, torch_reserve_growth_bytes)

    and 0 when that is negative. ``requested_memory`` is ``ceil(total * utilization)``: with the
    utilization unset (1.0) the device's memory bounds it; a utilization below 1.0 caps it."""
    non_kv_used = init_free_memory - free_memory - committed_bytes
    headroom = free_memory + committed_bytes
    margin = max(margin_floor_bytes, int(transient_peak_bytes * margin_fraction))
    available = min(requested_memory - non_kv_used, headroom - margin)
    available -= max(transient_peak_bytes, torch_reserve_growth_bytes)
    return max(available, 0)
