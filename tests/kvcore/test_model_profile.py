"""Memory profiling -> num_gpu_blocks (kvcore/model/profile.py, kvcore/model/memory.py:
KVCacheSizing)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from kvcore.model.memory import GiB, MemoryProfile, bytes_per_block, num_gpu_blocks_from_profile
from kvcore.model.profile import LiveTensorBytes, profile_model, weights_bytes
from paged_kv_lab.cli.main import main
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario, load_scenario

PROFILE = MemoryProfile(
    device="cuda:0",
    model="m",
    dtype="float16",
    max_num_batched_tokens=256,
    total_memory=80 * GiB,
    weights_memory=3 * GiB + 12345,
    peak_activation_memory=700_000_001,
    other_memory=500_000_000,
)


class _Config:  # SmolLM2's shape
    num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size, head_dim = (
        30,
        9,
        3,
        576,
        64,
    )


def test_the_derivation_is_vllms_arithmetic_exactly():
    s = num_gpu_blocks_from_profile(PROFILE, _Config, 16, "float16", 0.9, 8192, environ={})
    requested = math.ceil(80 * GiB * 0.9)
    assert s.requested_memory == requested == 77309411328
    available = requested - (3 * GiB + 12345) - 700_000_001 - 500_000_000
    assert s.available_kv_cache_memory == available
    per_block = 16 * 30 * 2 * 3 * 64 * 2
    assert s.bytes_per_block == per_block == bytes_per_block(_Config, 16, "float16")
    assert s.num_gpu_blocks == available // per_block == 197721
    assert s.blocks_per_request == 512
    assert s.max_concurrency == pytest.approx(197721 / 512)
    # block_size that does not divide max_model_len: vLLM's ceil, not block_size / max_model_len
    odd = num_gpu_blocks_from_profile(PROFILE, _Config, 48, "float16", 0.9, 1000, environ={})
    assert odd.blocks_per_request == 21 and odd.max_concurrency == odd.num_gpu_blocks / 21
    text = "\n".join(s.lines())
    # a CUDA profile
    assert "197,721" in text and "0.9" in text and "vLLM's CPU backend" not in text
    assert json.loads(json.dumps(s.to_dict()))["num_gpu_blocks"] == 197721


def test_no_room_gives_zero_blocks_and_bad_settings_are_refused():
    tight = num_gpu_blocks_from_profile(PROFILE, _Config, 16, "float16", 0.05, 8192, environ={})
    assert tight.available_kv_cache_memory < 0 and tight.num_gpu_blocks == 0
    for util in (0, 1.01, -0.5):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            num_gpu_blocks_from_profile(PROFILE, _Config, 16, "float16", util, 8192, environ={})


def test_vllm_cpu_backend_rule_is_shown_beside():
    cpu = replace(PROFILE, device="cpu", process_memory=2 * GiB)
    auto = num_gpu_blocks_from_profile(cpu, _Config, 16, "float32", 0.5, 8192, environ={})
    assert auto.cpu_backend_kv_cache_memory == math.ceil(80 * GiB * 0.5) - 2 * GiB
    assert auto.cpu_backend_num_blocks == (38 * GiB) // (16 * 30 * 2 * 3 * 64 * 4)
    fixed = num_gpu_blocks_from_profile(
        cpu, _Config, 16, "float32", 0.5, 8192, environ={"VLLM_CPU_KVCACHE_SPACE": "4"}
    )
    assert fixed.cpu_backend_kv_cache_memory == 4 * GiB
    assert "VLLM_CPU_KVCACHE_SPACE=4 GiB" in "\n".join(fixed.lines())
    with pytest.raises(ValueError, match="VLLM_CPU_KVCACHE_SPACE"):
        num_gpu_blocks_from_profile(
            cpu, _Config, 16, "float32", 0.5, 8192, environ={"VLLM_CPU_KVCACHE_SPACE": "4G"}
        )


def test_live_tensor_bytes_counts_what_ops_allocate_while_alive():
    before = torch.ones(1000)
    with LiveTensorBytes() as m:
        x = torch.randn(1000)  # +4000
        y = x * 2  # +4000 -> 8000 (peak)
        del x  # -4000
        z = y.view(10, 100)  # a view: nothing new
        before.add_(1)  # in place, on memory from before: nothing
        w = before[:10]  # a view of memory from before: nothing
        assert m.current == 4000
        del y, z
        assert m.current == 0
    assert m.peak == 8000 and w.numel() == 10


def test_profile_of_the_tiny_model_is_positive_and_plausible(tiny_model):
    lm = tiny_model
    cfg = lm.config
    p = profile_model(lm, max_num_batched_tokens=64, block_size=16)
    params = sum(t.numel() * t.element_size() for t in lm.model.parameters())  # tied: counted once
    assert p.weights_memory == weights_bytes(lm.model) >= params > 0
    # at least the hidden states of 64 tokens, and far below what the KV pool of a real run takes
    hidden = 64 * cfg.hidden_size * 4
    assert hidden <= p.peak_activation_memory < 1000 * hidden
    assert p.total_memory > p.weights_memory and p.other_memory > 0 and p.process_memory > 0
    bigger = profile_model(lm, max_num_batched_tokens=256, block_size=16)
    assert bigger.peak_activation_memory > p.peak_activation_memory


def _scenario(**engine) -> Scenario:
    return Scenario(
        model="tiny-random",
        device="cpu",
        engine=EngineSettings(**{"block_size": 16, "max_num_batched_tokens": 64, **engine}),
        requests=(
            RequestSpec("A", prompt_token_ids=tuple(range(3, 40)), max_tokens=6),
            RequestSpec("B", prompt_token_ids=tuple(range(3, 30)), max_tokens=6, arrival_step=1),
        ),
    )


def _utilization_for(lm, blocks: int, block_size: int = 16) -> float:
    """A gpu_memory_utilization that leaves room for about ``blocks`` blocks on this machine now
    (the process's resident memory moves a little between two profiles)."""
    p = profile_model(lm, 64, block_size)
    return (
        p.non_kv_cache_memory + blocks * bytes_per_block(lm.config, block_size, lm.dtype)
    ) / p.total_memory


def test_auto_sizes_a_working_engine(tiny_model):
    util = _utilization_for(tiny_model, 300)
    # max_model_len stated: the extensible KV cache (on by default) refuses a pool that cannot
    # hold one request of the model's 8,192 tokens, as vLLM 0.34 does
    eng = Engine(
        _scenario(num_gpu_blocks="auto", gpu_memory_utilization=util, max_model_len=1024),
        model=tiny_model,
    )
    assert eng.kv_cache_sizing.sizing_path == "measured"
    n = eng.settings.num_gpu_blocks
    # the RSS moves a little between profiles
    assert n == eng.kv_cache_sizing.num_gpu_blocks and 2 <= n < 5000
    assert eng.runner.num_blocks == n and eng.snapshot().num_gpu_blocks == n
    eng.run()
    fixed = Engine(_scenario(num_gpu_blocks=64), model=tiny_model)
    fixed.run()
    assert eng.outputs() == fixed.outputs() and all(
        len(o["token_ids"]) == 6 for o in eng.outputs().values()
    )


def test_the_extensible_kv_cache_refuses_a_max_model_len_that_no_longer_fits(tiny_model):
    util = _utilization_for(tiny_model, 300)
    with pytest.raises(ValueError, match="no longer fits"):
        Engine(_scenario(num_gpu_blocks="auto", gpu_memory_utilization=util), model=tiny_model)
    # off, the estimate sizes the pool and, as before, no such check is made
    off = Engine(
        _scenario(
            num_gpu_blocks="auto", gpu_memory_utilization=util, enable_extensible_kv_cache=False
        ),
        model=tiny_model,
    )
    assert off.kv_cache_sizing.sizing_path == "estimate"


def test_auto_without_room_says_why(tiny_model):
    with pytest.raises(ValueError, match="no room for a KV cache"):
        Engine(_scenario(num_gpu_blocks="auto", gpu_memory_utilization=1e-6), model=tiny_model)


def test_cli_profile_and_run_print_the_derivation(tiny_model, tmp_path, capsys):
    assert (
        main(
            [
                "profile",
                "--model",
                "tiny-random",
                "--device",
                "cpu",
                "--max-num-batched-tokens",
                "64",
                "--gpu-memory-utilization",
                "0.5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "num_gpu_blocks" in out and "peak activations" in out and "vLLM's CPU backend" in out
    # vLLM 0.34's setting by its name, and the path that gave the count
    assert "enable_extensible_kv_cache: true" in out and "(measured)" in out
    assert "comes from the memory measured free after the model's warm-up" in out
    assert "machine's available memory stands for" in out
    off = ["--no-enable-extensible-kv-cache", "--max-num-batched-tokens", "64"]
    assert main(["profile", "--model", "tiny-random", "--device", "cpu", *off]) == 0
    out = capsys.readouterr().out
    assert "enable_extensible_kv_cache: false" in out and "used as 0.92" in out
    assert "comes from the profiling estimate" in out
    assert main(["profile", "--model", "tiny-random", "--gpu-memory-utilization", "1.5"]) == 2
    # the run loads its own model, and this process may have grown since it was measured (an xdist
    # worker that ran the real-model tests before this one): 8,000 blocks of 64 KiB (512 MB) leave
    # room for both; 1,000 (64 MB) once fell short by 28 MB in a full run
    util = _utilization_for(tiny_model, 8000, block_size=64)
    f = tmp_path / "auto.json"
    f.write_text(
        json.dumps(
            {
                "model": "tiny-random",
                "device": "cpu",
                "engine": {
                    "num_gpu_blocks": "auto",
                    "gpu_memory_utilization": util,
                    "enable_extensible_kv_cache": True,
                    "max_num_batched_tokens": 64,
                    "block_size": 64,
                },
                "requests": [{"id": "A", "prompt_token_ids": [5, 6, 7, 8, 9], "max_tokens": 3}],
            }
        )
    )
    assert load_scenario(f).engine.num_gpu_blocks == "auto"
    trace_file = tmp_path / "t.jsonl"
    assert main(["run", str(f), "--quiet", "--trace", str(trace_file)]) == 0
    out = capsys.readouterr().out
    assert "= num_gpu_blocks" in out and "== outputs" in out
    header = json.loads(trace_file.read_text().splitlines()[0])
    # the trace replays anywhere
    assert isinstance(header["scenario"]["engine"]["num_gpu_blocks"], int)
    # the count came from the extensible path; the record states the count, and reads back
    assert "comes from the memory measured free" in out
    assert "enable_extensible_kv_cache" not in header["scenario"]["engine"]
    assert (
        load_scenario(header["scenario"]).engine.num_gpu_blocks
        == (header["scenario"]["engine"]["num_gpu_blocks"])
    )
