"""vLLM 0.34.0's extensible KV cache: the settings' resolution (kvcore/config/cache.py,
kvcore/config/vllm.py) and the last step of its sizing (kvcore/core/kv_cache_planning.py:
``finalize_extensible_kv_cache``, ``shrink_kv_cache_configs``), by their decisions and against
vLLM 0.34.0's own functions (tests/support/reference/vllm_extensible_kv_cache.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.config.cache import CacheConfig
from kvcore.config.scheduler import SchedulerConfig
from kvcore.config.vllm import resolve_enable_extensible_kv_cache
from kvcore.core.kv_cache_planning import finalize_extensible_kv_cache, shrink_kv_cache_configs
from kvcore.kv_cache_interface import (
    KVCacheConfig,
    KVCacheGroupSpec,
    full_attention,
    sliding_window,
)
from kvcore.worker.worker_base import CompilationTimes
from support.kv import VLLM_VENV_034 as VENV
from support.kv import ask_vllm


def groups_of(kinds, block_size: int) -> tuple[KVCacheGroupSpec, ...]:
    """None: a full-attention group; a number: a sliding-window group of that window."""
    return tuple(
        full_attention(block_size, (f"layers.{i}",))
        if w is None
        else sliding_window(block_size, w, (f"layers.{i}",))
        for i, w in enumerate(kinds)
    )


def finalize(case: dict):
    """kvcore's answer for a case of the differential's shape."""
    groups = groups_of(case["groups"], case["block_size"])
    workers = [KVCacheConfig(cap, groups) for cap in case["capacity"]]
    scheduler = KVCacheConfig(min(case["capacity"]), groups)
    sched_cfg = SchedulerConfig(
        max_model_len=case["max_model_len"], max_num_batched_tokens=case["max_num_batched_tokens"]
    )
    cache = CacheConfig(enable_extensible_kv_cache=True)
    times = [CompilationTimes(num_kv_blocks=n) for n in case["measured"]]
    try:
        n = finalize_extensible_kv_cache(sched_cfg, cache, workers, scheduler, times)
    except (ValueError, AssertionError) as e:
        return {"error": type(e).__name__, "message": str(e)}
    return {"num_blocks": n, "num_gpu_blocks": cache.num_gpu_blocks}


def case(measured, capacity=(100,), max_model_len=512, groups=(None,), block_size=16):
    return {
        "block_size": block_size,
        "max_model_len": max_model_len,
        "max_num_batched_tokens": 256,
        "groups": list(groups),
        "capacity": list(capacity),
        "measured": list(measured),
    }


# -- the settings ------------------------------------------------------------------------------


def test_unset_utilization_resolves_by_the_sizing_mode():
    assert CacheConfig(enable_extensible_kv_cache=True).resolved_gpu_memory_utilization == 1.0
    assert CacheConfig(enable_extensible_kv_cache=False).resolved_gpu_memory_utilization == 0.92
    stated = CacheConfig(gpu_memory_utilization=0.5, enable_extensible_kv_cache=True)
    assert stated.resolved_gpu_memory_utilization == 0.5
    with pytest.raises(ValueError):
        CacheConfig(gpu_memory_utilization=1.5)


def test_extensible_resolves_on_for_a_gpu_unless_the_size_is_stated():
    assert resolve_enable_extensible_kv_cache(CacheConfig()) is True
    assert resolve_enable_extensible_kv_cache(CacheConfig(), cuda_alike=False) is False
    for stated in ({"kv_cache_memory_bytes": 1 << 30}, {"num_gpu_blocks_override": 64}):
        c = CacheConfig(**stated)
        assert resolve_enable_extensible_kv_cache(c) is False
        assert c.enable_extensible_kv_cache is False
        assert c.resolved_gpu_memory_utilization == 0.92
        with pytest.raises(ValueError, match="measured memory"):
            resolve_enable_extensible_kv_cache(
                CacheConfig(enable_extensible_kv_cache=True, **stated)
            )
    with pytest.raises(ValueError, match="CUDA and ROCm"):
        resolve_enable_extensible_kv_cache(CacheConfig(enable_extensible_kv_cache=True), False)
    assert (
        resolve_enable_extensible_kv_cache(CacheConfig(enable_extensible_kv_cache=False)) is False
    )


# -- the decisions -----------------------------------------------------------------------------


def test_the_smallest_worker_measurement_wins():
    assert finalize(case([70, 50, 90], capacity=(100, 100, 100))) == {
        "num_blocks": 50,
        "num_gpu_blocks": 50,
    }


def test_never_above_the_reserved_capacity_and_capacity_without_measurements():
    assert finalize(case([500]))["num_blocks"] == 100
    assert finalize(case([None, None]))["num_blocks"] == 100
    assert finalize(case([None, 60]))["num_blocks"] == 60


def test_refuses_when_max_model_len_no_longer_fits():
    # 1024 tokens of 16-token blocks: 64 blocks; 50 measured leave 49 beside the null block
    got = finalize(case([50], max_model_len=1024))
    assert got["error"] == "ValueError"
    assert "no longer fits" in got["message"] and "784" in got["message"]
    assert "num_blocks" in finalize(case([65], max_model_len=1024))  # 64 usable: just fits
    assert finalize(case([1]))["message"].startswith("No available memory")


def test_shrink_lowers_every_config_and_never_raises_one():
    groups = groups_of([None], 16)
    configs = [KVCacheConfig(100, groups), KVCacheConfig(80, groups)]
    out = shrink_kv_cache_configs(SchedulerConfig(max_model_len=256), configs, 40)
    assert [c.num_blocks for c in out] == [40, 40] and [c.num_blocks for c in configs] == [100, 80]
    with pytest.raises(AssertionError):
        shrink_kv_cache_configs(SchedulerConfig(max_model_len=256), configs, 90)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.integers(0, 400)), min_size=1, max_size=4),
    st.integers(2, 300),
    st.integers(1, 2048),
)
def test_the_count_is_the_min_capped_by_capacity(measured, capacity, max_model_len):
    got = finalize(case(measured, capacity=(capacity,), max_model_len=max_model_len))
    known = [n for n in measured if n is not None]
    expect = min(min(known, default=capacity), capacity)
    if "num_blocks" in got:
        assert got["num_blocks"] == got["num_gpu_blocks"] == expect
        assert -(-max_model_len // 16) <= expect - 1
    else:
        assert expect - 1 < -(-max_model_len // 16)


# -- against vLLM 0.34.0 -----------------------------------------------------------------------

CASES = [
    case([50, 70], capacity=(100, 100)),
    case([70, 50, 90], capacity=(120, 100, 130)),
    case([500]),
    case([None]),
    case([None, 60], capacity=(100, 100)),
    case([50], max_model_len=1024),
    case([65], max_model_len=1024),
    case([64], max_model_len=1024),
    case([1]),
    case([2], max_model_len=16),
    case([40], groups=(None, 64), max_model_len=1024),
    case([90], groups=(None, 64), max_model_len=1024),
    case([30], groups=(32, 32), max_model_len=4096, block_size=8),
    case([12], groups=(None,), max_model_len=333, block_size=32),
]


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_finalize_equals_vllms_own_functions():
    theirs = ask_vllm("vllm_extensible_kv_cache.py", CASES)
    for c, ours, vllm in zip(CASES, map(finalize, CASES), theirs):
        if "error" in vllm:
            assert ours.get("error") == vllm["error"], (c, ours, vllm)
            # the longest length that still fits, where vLLM names one
            said = re.search(r"maximum model length is (\d+)", vllm["message"])
            if said:
                assert f"fits is {said.group(1)}." in ours["message"], (c, ours, vllm)
            else:
                assert "fits is" not in ours["message"], (c, ours, vllm)
        else:
            assert ours == {
                "num_blocks": vllm["num_blocks"],
                "num_gpu_blocks": vllm["num_gpu_blocks"],
            }
            assert set(vllm["num_blocks_after"]) == {vllm["num_blocks"]}
