"""vLLM 0.34.0's side of tests/kvcore/test_extensible_kv_cache.py's differential, run by the vLLM
scratch environment's Python: for each case (JSON on stdin: block size, max_model_len,
max_num_batched_tokens, the groups -- null a full-attention layer, a number a sliding window --,
each worker's reserved capacity in blocks, and each worker's measured ``num_kv_blocks`` or null),
vLLM's own ``get_kv_cache_config_from_groups`` builds every worker's ``KVCacheConfig`` for its
capacity, and vLLM's own ``finalize_extensible_kv_cache`` settles the count (calling vLLM's own
``shrink_kv_cache_configs``). Writes, as JSON, one
``{num_blocks, num_gpu_blocks, num_blocks_after}`` per case, or ``{error, message}`` when vLLM
refuses (under "finalize"); and, under "measure", vLLM's own ``measure_kv_cache_bytes`` for each
keyword case of the spec's "measure" list.

What is not vLLM's here is only the configuration a server would carry: a namespace with the
fields these functions read (as tests/support/reference/vllm_block_size.py builds it), on a CUDA
device with the extensible KV cache on, and one attention layer of 1 KV head per group."""

import copy
import json
import sys
from types import SimpleNamespace as NS

import torch
from vllm.v1.core import kv_cache_planning
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.worker_base import CompilationTimes


def config_for(case: dict) -> NS:
    cache = NS(
        cache_dtype="auto",
        block_size=case["block_size"],
        num_gpu_blocks_override=None,
        enable_extensible_kv_cache=True,
        gpu_memory_utilization=None,
        resolved_gpu_memory_utilization=1.0,
        num_gpu_blocks=None,
        kv_cache_size_tokens=None,
        kv_cache_max_concurrency=None,
        prefix_cache_retention_interval=0,
        mamba_cache_mode="none",
        get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC,
    )
    max_len = case["max_model_len"]
    tokens = case["max_num_batched_tokens"]
    return NS(
        cache_config=cache,
        model_config=NS(max_model_len=max_len, original_max_model_len=max_len, use_mla=False),
        parallel_config=NS(
            tensor_parallel_size=1, decode_context_parallel_size=1, prefill_context_parallel_size=1
        ),
        speculative_config=None,
        scheduler_config=NS(disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=tokens),
        attention_config=NS(hisparse_config=None),
        max_in_flight_tokens=tokens,  # no speculative decoding: the step's token budget
        kv_transfer_config=None,
        device_config=NS(device_type="cuda"),
    )


def run(case: dict) -> dict:
    config = config_for(case)
    groups = []
    for i, window in enumerate(case["groups"]):
        kw = dict(block_size=case["block_size"], num_kv_heads=1, head_size=8, dtype=torch.float32)
        spec = (
            FullAttentionSpec(**kw)
            if window is None
            else SlidingWindowSpec(sliding_window=window, **kw)
        )
        groups.append(KVCacheGroupSpec([f"layers.{i}"], spec))
    per_block = kv_cache_planning._pool_bytes_per_block(config, groups)
    workers = [
        kv_cache_planning.get_kv_cache_config_from_groups(config, groups, cap * per_block)
        for cap in case["capacity"]
    ]
    # generate_scheduler_kv_cache_config: a copy of a worker's, with the smallest capacity
    scheduler = copy.deepcopy(min(workers, key=lambda c: c.num_blocks))
    times = [CompilationTimes(0.0, 0.0, n) for n in case["measured"]]
    try:
        n = kv_cache_planning.finalize_extensible_kv_cache(config, workers, scheduler, times)
    except (ValueError, AssertionError) as e:
        return {"error": type(e).__name__, "message": str(e)}
    return {
        "num_blocks": n,
        "num_gpu_blocks": config.cache_config.num_gpu_blocks,
        "num_blocks_after": [w.num_blocks for w in (*workers, scheduler)],
    }


def measure(case: dict) -> int:
    """vLLM's own ``measure_kv_cache_bytes`` for a case of keyword arguments (CUDA's margins)."""
    from vllm.v1.worker.extensible_kv_cache import measure_kv_cache_bytes

    return measure_kv_cache_bytes(**case)


if __name__ == "__main__":
    spec = json.load(sys.stdin)
    print(
        json.dumps(
            {
                "finalize": [run(c) for c in spec["finalize"]],
                "measure": [measure(c) for c in spec["measure"]],
            }
        )
    )
