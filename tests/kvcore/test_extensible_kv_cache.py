"""vLLM 0.34.0's extensible KV cache: the settings' resolution (kvcore/config/cache.py,
kvcore/config/vllm.py) and the last step of its sizing (kvcore/core/kv_cache_planning.py:
``finalize_extensible_kv_cache``, ``shrink_kv_cache_configs``), by their decisions and against
vLLM 0.34.0's own functions (tests/support/reference/vllm_extensible_kv_cache.py)."""

from __future__ import annotations

import re
from dataclasses import replace
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
from kvcore.model.memory import MemoryProfile, num_gpu_blocks_from_profile
from kvcore.worker.extensible_kv_cache import measure_kv_cache_bytes
from kvcore.worker.worker_base import CompilationTimes
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.why.sentences import sizing_sentences
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


def test_measure_keeps_the_peak_and_a_margin_free():
    g = 1 << 30
    # a 80 GiB device, 20 GiB taken by weights and warm-up, 2 GiB activation peak
    m = dict(
        init_free_memory=80 * g, free_memory=60 * g, committed_bytes=0, transient_peak_bytes=2 * g
    )
    assert (
        measure_kv_cache_bytes(requested_memory=80 * g, **m) == 60 * g - 3 * g // 2 - 2 * g
    )  # margin: 0.75 x the peak
    # a utilization of 0.5 caps it: 40 GiB less the 20 used, less the peak
    assert measure_kv_cache_bytes(requested_memory=40 * g, **m) == 18 * g
    assert measure_kv_cache_bytes(requested_memory=10 * g, **m) == 0


MEASURES = [
    dict(
        init_free_memory=i << 28,
        free_memory=f << 28,
        committed_bytes=c << 20,
        requested_memory=r << 28,
        transient_peak_bytes=p << 24,
        torch_reserve_growth_bytes=t << 24,
    )
    for i, f, c, r, p, t in [
        (320, 240, 0, 320, 100, 0),
        (320, 240, 64, 160, 100, 300),
        (320, 300, 0, 320, 0, 0),
        (320, 10, 0, 320, 50, 0),
        (100, 90, 512, 95, 400, 10),
    ]
]

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
def test_finalize_and_measure_equal_vllms_own_functions():
    got = ask_vllm("vllm_extensible_kv_cache.py", {"finalize": CASES, "measure": MEASURES})
    assert got["measure"] == [measure_kv_cache_bytes(**m) for m in MEASURES]
    theirs = got["finalize"]
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


# -- the lab's sizing, both ways (kvcore/model/memory.py) --------------------------------------


class _SmolLM2:  # SmolLM2-135M's shape: 16 x 30 x 2 x 3 x 64 x 4 = 737,280 bytes a 16-token block
    num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size, head_dim = (
        30,
        9,
        3,
        576,
        64,
    )


G = 1 << 30
BLOCK = 737_280
# an 80 GiB GPU: 10 GiB of weights, a 2 GiB activation peak, 1 GiB else; after warm-up 66 GiB
# free of the 79 GiB free at start (CUDA graphs and workspaces took 2 GiB more than profiled)
MEASURED = MemoryProfile(
    "cuda:0", "shape", "float32", 256, 80 * G, 10 * G, 2 * G, 1 * G,
    init_free_memory=79 * G, free_memory=66 * G,
)  # fmt: skip


def test_unset_settings_take_the_measured_path_at_utilization_one():
    s = num_gpu_blocks_from_profile(MEASURED, _SmolLM2, 16, "float32", None, 4096, None)
    assert s.enable_extensible_kv_cache and s.gpu_memory_utilization == 1.0
    assert s.sizing_path == "measured"
    assert s.capacity_blocks == (80 * G - 13 * G) // BLOCK  # the estimate at 1.0, reserved
    # min(80 - 13, 66 - 1.5) - 2 GiB: the free memory less the margin and the peak
    assert s.measured_kv_cache_memory == 66 * G - 3 * G // 2 - 2 * G
    assert s.num_gpu_blocks == s.measured_num_blocks == (62 * G + G // 2) // BLOCK
    assert s.num_gpu_blocks < s.capacity_blocks
    assert any("(measured)" in line for line in s.lines())


def test_a_stated_utilization_caps_the_measured_count_and_the_capacity_caps_it_too():
    s = num_gpu_blocks_from_profile(MEASURED, _SmolLM2, 16, "float32", 0.2, 4096, None)
    assert s.sizing_path == "measured" and s.gpu_memory_utilization == 0.2
    # 16 GiB requested, 13 GiB used by the engine after warm-up, the 2 GiB peak kept free
    assert s.num_gpu_blocks == s.measured_num_blocks == G // BLOCK
    assert s.capacity_blocks == 3 * G // BLOCK
    # warm-up took less than the profile's estimate: the measurement exceeds the reservation
    light = replace(MEASURED, free_memory=70 * G)
    s = num_gpu_blocks_from_profile(light, _SmolLM2, 16, "float32", 0.2, 4096, None)
    assert s.measured_kv_cache_memory == 5 * G
    assert s.num_gpu_blocks == s.measured_num_blocks == s.capacity_blocks == 3 * G // BLOCK


def test_off_or_stated_bytes_take_the_estimate_at_092():
    off = num_gpu_blocks_from_profile(MEASURED, _SmolLM2, 16, "float32", None, 4096, None, **{
        "enable_extensible_kv_cache": False})  # fmt: skip
    assert off.sizing_path == "estimate" and off.gpu_memory_utilization == 0.92
    assert off.num_gpu_blocks == off.estimate_num_gpu_blocks
    stated = num_gpu_blocks_from_profile(
        MEASURED, _SmolLM2, 16, "float32", None, 4096, None, kv_cache_memory_bytes=G
    )
    assert not stated.enable_extensible_kv_cache and stated.num_gpu_blocks == G // BLOCK
    with pytest.raises(ValueError, match="kv_cache_memory_bytes"):
        num_gpu_blocks_from_profile(
            MEASURED, _SmolLM2, 16, "float32", None, 4096, None,
            kv_cache_memory_bytes=G, enable_extensible_kv_cache=True,
        )  # fmt: skip
    # a profile that measured nothing after warm-up keeps the estimate
    bare = replace(MEASURED, init_free_memory=None, free_memory=None)
    s = num_gpu_blocks_from_profile(bare, _SmolLM2, 16, "float32", None, 4096, None)
    assert s.sizing_path == "estimate" and s.gpu_memory_utilization == 1.0


def test_the_reader_is_told_the_setting_and_the_path_in_each_language():
    measured = num_gpu_blocks_from_profile(MEASURED, _SmolLM2, 16, "float32", None, 4096, None)
    off = num_gpu_blocks_from_profile(
        MEASURED, _SmolLM2, 16, "float32", 0.5, 4096, None, enable_extensible_kv_cache=False
    )
    for lang in ("en", "zh"):
        said = [tr(t, lang) for t in sizing_sentences(measured)]
        assert "enable_extensible_kv_cache" in said[0] and "None" in said[0]
        assert (
            f"{measured.num_gpu_blocks:,}" in said[1] and f"{measured.capacity_blocks:,}" in said[1]
        )
        assert "kv_cache_planning.py#L1864-L1906" in said[1] and "vllm.py#L3180-L3269" in said[0]
        assert "gpu_worker.py#L672-L841" in tr(sizing_sentences(off)[1], lang)
        said_off = [tr(t, lang) for t in sizing_sentences(off)]
        assert "false" in said_off[0] and "0.5" in said_off[0]
    assert [t.key for t in sizing_sentences(off)] == ["sizing.setting", "sizing.path.estimate"]
    assert [t.key for t in sizing_sentences(measured)] == ["sizing.setting", "sizing.path.measured"]
    cpu = replace(MEASURED, device="cpu")
    cpu_sizing = num_gpu_blocks_from_profile(cpu, _SmolLM2, 16, "float32", None, 4096, {}, None)
    assert sizing_sentences(cpu_sizing)[-1].key == "sizing.cpu_stands_for"


def test_the_reader_is_told_when_vllm_would_refuse_the_pool():
    # 0.2 of 80 GiB: 1 GiB measured, 1,456 blocks of 16 tokens; 4,096 tokens need 256, 65,536 need
    # 4,096
    fits = num_gpu_blocks_from_profile(MEASURED, _SmolLM2, 16, "float32", 0.2, 4096, None)
    assert "sizing.would_refuse" not in [t.key for t in sizing_sentences(fits)]
    long = num_gpu_blocks_from_profile(MEASURED, _SmolLM2, 16, "float32", 0.2, 65536, None)
    (refusal,) = [t for t in sizing_sentences(long) if t.key == "sizing.would_refuse"]
    assert "4,096 blocks" in tr(refusal) and f"{long.num_gpu_blocks - 1:,} beside" in tr(refusal)
    assert "kv_cache_planning.py#L1827-L1861" in tr(refusal, "zh")
