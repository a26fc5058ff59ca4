"""A hybrid scenario that leaves ``block_size`` or ``num_gpu_blocks`` out gets them resolved from
its model as vLLM 0.34 resolves them on a GPU: the attention block, from
``CacheConfig.DEFAULT_BLOCK_SIZE`` (64), raised until its page holds a gated delta-net state
(``Platform._align_hybrid_block_size``), and the stated KV budget
(``kv_cache_memory_bytes``) divided by one block of the shared pool, a group's pages
(``get_kv_cache_config_from_groups``). Hand-checked numbers for tiny-hybrid and real models'
shapes; the same numbers from vLLM 0.34.0's own functions (its scratch environment,
``VLLM_VENV``); the
scenario, ``run`` and ``replay`` ends; an attention-only scenario without ``block_size`` at
vLLM 0.34's GPU default, 64 (the same from vLLM 0.34.0's own classes)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcore.core.kv_cache_planning import uniform_page_group_size
from kvcore.model.memory import (
    DEFAULT_BLOCK_SIZE,
    MemoryProfile,
    hybrid_bytes_per_block,
    hybrid_group_counts,
    hybrid_page_sizes,
    num_gpu_blocks_from_profile,
)
from kvcore.model.shapes import TINY_HYBRID, hybrid_shape
from paged_kv_lab.content.datafile import load
from paged_kv_lab.content.hybrid_pages import MODELS_FILE, HybridModelData
from paged_kv_lab.run.scenario import (
    ScenarioError,
    block_size_note,
    load_scenario,
    scenario_to_dict,
)
from paged_kv_lab.text.i18n import tr
from support.cli import run_cli_here
from support.kv import VLLM_VENV_034 as VENV
from support.kv import ask_vllm

TINY = hybrid_shape("tiny-hybrid")
LINEAR, FULL = "linear_attention", "full_attention"
# a profile for the arithmetic alone: with kv_cache_memory_bytes stated, only the budget counts
PROFILE = MemoryProfile("cuda:0", "shape", "bfloat16", 256, 80 << 30, 0, 0, 0)


def real(name: str):
    """A model of hybrid_models.yaml as a config: its shape, and its layer kinds by its
    full_attention_interval (every interval-th layer is full attention)."""
    m = next(m for m in load(MODELS_FILE, list[HybridModelData]) if m.name == name)
    c = m.config
    every = c["full_attention_interval"]
    kinds = [FULL if (i + 1) % every == 0 else LINEAR for i in range(c["num_hidden_layers"])]
    # the recurrent states' dtype where the config names it (Qwen3.5's mamba_ssm_dtype)
    ssm = {} if m.ssm_dtype is None else {"mamba_ssm_dtype": m.ssm_dtype}
    return SimpleNamespace(**c, **ssm, layer_types=kinds), m.dtype, m.ssm_dtype


def test_tiny_hybrid_by_hand():
    # one layer's K + V per token: 2 x 2 kv heads x 16 x 4 B = 256 B; a state: conv
    # (2 x 2 x 16 + 4 x 16 = 128 channels) x 3 x 4 B = 1,536 B + recurrent 4 x 16 x 16 x 4 B
    # = 4,096 B; from vLLM 0.34's 64 tokens: 64 x 256 B = 16,384 B >= 5,632 B, kept
    z = hybrid_page_sizes(TINY, "float32")
    assert (z.attn_bytes_per_token, z.conv_state_bytes, z.recurrent_state_bytes) == (
        256,
        1536,
        4096,
    )
    assert (z.block_size, z.page_bytes, z.padding_bytes) == (64, 16384, 10752)
    # bf16 halves both sides: the same 64 tokens, an 8,192 B page
    half = hybrid_page_sizes(TINY, "bfloat16")
    assert (half.block_size, half.page_bytes) == (64, 8192)
    # FlashInfer's gated delta-net prefill in align mode: steps of lcm(64, 64) = 64 tokens
    assert hybrid_page_sizes(TINY, "float32", prefill_checkpoint_alignment=64).block_size == 64
    # vLLM 0.33 started from 16: steps of 16, 16 x 256 B = 4,096 B < 5,632 B <= 32 x 256 B
    assert hybrid_page_sizes(TINY, "float32", block_size=16).block_size == 32
    # 3 linear layers and 1 full: 3 >= 1.5 x 1, so groups of 1 layer, a block is one page
    assert uniform_page_group_size([3, 1]) == 1
    assert hybrid_bytes_per_block(TINY, 32, "float32") == 8192
    # a stated block too small for a state (kvcore keeps it): the page is the state's own size
    assert hybrid_bytes_per_block(TINY, 4, "float32") == 5632


def test_qwen3_next_and_qwen35_shapes_by_hand():
    cfg, dtype, ssm = real("Qwen3-Next-80B-A3B")
    z = hybrid_page_sizes(cfg, dtype, ssm)
    # K + V: 2 x 2 kv heads x 256 x 2 B = 2,048 B a token; state: conv (2 x 16 x 128 + 32 x 128
    # = 8,192 channels) x 3 x 2 B = 49,152 B + recurrent 32 x 128 x 128 x 2 B = 1,048,576 B;
    # steps of 64 tokens: 8 x 64 x 2,048 B = 1,048,576 B < 1,097,728 B <= 9 x 64 x 2,048 B
    assert (z.attn_bytes_per_token, z.state_bytes, z.block_size) == (2048, 1_097_728, 576)
    assert hybrid_page_sizes(cfg, dtype, ssm, prefill_checkpoint_alignment=64).block_size == 576
    # from 0.33's 16, in steps of 16: 34 x 16 = 544
    assert hybrid_page_sizes(cfg, dtype, ssm, block_size=16).block_size == 544
    # 36 linear and 12 full layers: 36 >= 1.5 x 12, groups of 12; a block is 12 pages
    assert uniform_page_group_size([36, 12]) == 12
    assert hybrid_bytes_per_block(cfg, 576, dtype, ssm) == 12 * 576 * 2048 == 14_155_776
    cfg, dtype, ssm = real("Qwen3.5-9B")
    z = hybrid_page_sizes(cfg, dtype, ssm)
    # 2 x 4 x 256 x 2 B = 4,096 B a token; state 49,152 B + 32 x 128 x 128 x 4 B (float32
    # recurrent state) = 2,146,304 B; 8 x 64 x 4,096 B = 2,097,152 B is one short, 9 x 64 holds
    assert (z.attn_bytes_per_token, z.state_bytes, z.block_size) == (4096, 2_146_304, 576)
    assert hybrid_bytes_per_block(cfg, 576, dtype, ssm) == 8 * 576 * 4096


def test_a_hybrid_scenario_without_block_size_runs_at_vllms_size():
    resolved = load_scenario({"model": "tiny-hybrid"})
    assert resolved.engine.block_size == hybrid_page_sizes(TINY, "float32").block_size
    assert load_scenario({"model": "tiny-hybrid", "dtype": "bfloat16"}).engine.block_size == 64
    # a stated size is kept (vLLM would raise 4 to 32; the note says so)
    stated = load_scenario({"model": "tiny-hybrid", "engine": {"block_size": 4}})
    assert stated.engine.block_size == 4
    # attention-only models: vLLM 0.34's GPU default, and the file format is what it was
    plain = load_scenario({"model": "tiny-random"})
    assert plain.engine.block_size == DEFAULT_BLOCK_SIZE == 64 and block_size_note(plain) is None
    assert "kv_cache_memory_bytes" not in scenario_to_dict(plain)["engine"]
    # --model replaces the file's model before the block size is resolved
    assert load_scenario({}, {"model": "tiny-hybrid"}).engine.block_size == 64
    assert load_scenario({"model": "tiny-hybrid"}, {"model": "smollm2"}).engine.block_size == 64
    # linear layers come from the model: prefix_match_unit finer than the block is allowed
    finer = load_scenario({"model": "tiny-hybrid", "engine": {"prefix_match_unit": 4}})
    assert finer.engine.prefix_match_unit == 4
    with pytest.raises(ScenarioError, match="hits land on the block size"):
        load_scenario({"model": "tiny-random", "engine": {"prefix_match_unit": 4}})
    # vLLM refuses a prefix_match_unit that does not divide the resolved block size
    with pytest.raises(ScenarioError, match=r"must divide block_size \(64\); got 12"):
        load_scenario({"model": "tiny-hybrid", "engine": {"prefix_match_unit": 12}})


def test_a_stated_kv_budget_makes_num_gpu_blocks_auto():
    s = load_scenario({"model": "tiny-hybrid", "engine": {"kv_cache_memory_bytes": 10**6}})
    assert s.engine.num_gpu_blocks == "auto" and s.engine.kv_cache_memory_bytes == 10**6
    kept = {"kv_cache_memory_bytes": 10**6, "num_gpu_blocks": 40}
    assert load_scenario({"model": "tiny-hybrid", "engine": kept}).engine.num_gpu_blocks == 40
    assert load_scenario({"model": "tiny-hybrid"}).engine.num_gpu_blocks == 64
    with pytest.raises(ScenarioError, match="kv_cache_memory_bytes"):
        load_scenario({"engine": {"kv_cache_memory_bytes": 0}})


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_note_says_resolved_kept_or_raised(lang):
    def note(bs):
        engine = {} if bs is None else {"block_size": bs}
        return block_size_note(load_scenario({"model": "tiny-hybrid", "engine": engine}))

    assert note(None).key == note(64).key == "block_size.resolved"
    # 32 tokens (0.33's size) hold a state: vLLM 0.34 keeps a stated 32
    assert note(32).key == note(128).key == "block_size.kept"
    # 40 tokens hold a state, yet the backends' alignment of 16 takes vLLM to 48
    assert note(40).key == note(4).key == "block_size.raised"
    assert note(40).fields["vllm"] == 48 and note(4).fields["vllm"] == 32
    for bs in (None, 64, 40):
        text = tr(note(bs), lang)
        assert "Platform._align_hybrid_block_size" in text and "5,632" in text


@pytest.fixture(scope="module")
def hybrid():
    from paged_kv_lab.store.timeline import lesson_model

    # the model the hybrid lesson's tests share (loaded once a session), not a fresh copy
    return lesson_model("tiny-hybrid", "cpu")


def test_run_prints_the_resolved_block_size_and_records_the_pool(tmp_path, monkeypatch, hybrid):
    import kvcore.model

    monkeypatch.setattr(kvcore.model, "load_model", lambda name, *a, **k: hybrid)
    budget = 48 * 8192
    path = tmp_path / "hybrid.json"
    prompt = "You are a helpful assistant. Question: what is a block?"
    scenario = {
        "model": "tiny-hybrid",
        "device": "cpu",
        # a small profile: one forward of 16 tokens
        "engine": {"kv_cache_memory_bytes": budget, "max_num_batched_tokens": 16},
        "requests": [{"id": "A", "prompt": prompt, "max_tokens": 1, "ignore_eos": True}],
    }
    path.write_text(json.dumps(scenario))
    out = tmp_path / "trace.jsonl"
    r = run_cli_here("run", path, "--trace", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(tr(block_size_note(load_scenario(path)), "en"))
    assert "kv_cache_memory_bytes as stated" in r.stdout
    header = json.loads(out.read_text().splitlines()[0])["scenario"]["engine"]
    assert header["block_size"] == 64 and header["num_gpu_blocks"] == budget // 16384


def test_replay_resolves_from_a_named_hybrid_model():
    from paged_kv_lab.workloads import SHIPPED_TRACE
    from paged_kv_lab.workloads.replay import replay_settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    trace = load_trace(SHIPPED_TRACE).slice(0, 5)
    s = replay_settings(trace, {"model": "tiny-hybrid"}).engine
    assert s.block_size == 64 and s.layer_types == TINY_HYBRID["layer_types"]
    budget = replay_settings(trace, {"model": "tiny-hybrid", "kv_cache_memory_bytes": 10**8})
    assert budget.engine.num_gpu_blocks == 10**8 // 16384
    bf16 = {"model": "tiny-hybrid", "dtype": "bfloat16", "kv_cache_memory_bytes": 10**8}
    assert replay_settings(trace, bf16).engine.num_gpu_blocks == 10**8 // 8192
    assert (
        replay_settings(trace, {"model": "tiny-hybrid", "block_size": 32}).engine.block_size == 32
    )
    assert replay_settings(trace, {}).engine.block_size == 16
    with pytest.raises(ScenarioError, match="kv_cache_memory_bytes"):
        replay_settings(trace, {"num_gpu_blocks": "auto"})


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_an_attention_only_model_without_block_size_gets_vllms_gpu_default():
    """The lab models a GPU server on any device: vLLM 0.34.0's GPU size, not its CPU platform's."""
    theirs = ask_vllm("vllm_default_block_size.py", {}, venv=VENV)
    assert theirs == {"gpu": DEFAULT_BLOCK_SIZE, "cpu": 128}
    assert load_scenario({"model": "smollm2"}).engine.block_size == theirs["gpu"]


def vllm_cases():
    shapes = [(TINY, d, None, 10**6) for d in ("float32", "bfloat16")]
    shapes += [(*real(n), 10**10) for n in ("Qwen3-Next-80B-A3B", "Qwen3.5-9B")]
    for cfg, dtype, ssm, budget in shapes:
        for stated in (None, 8, 40, 1024):
            for mode, alignment in (("align", None), ("align", 64), ("none", None)):
                yield cfg, dtype, ssm, budget, stated, mode, alignment


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_vllms_own_functions_resolve_the_same_block_size_and_pool():
    cases = list(vllm_cases())
    spec = [
        {
            "shape": {**vars(cfg), "layer_types": list(cfg.layer_types)},
            "dtype": dtype,
            "ssm_dtype": ssm,
            "block_size": stated,
            "mamba_cache_mode": mode,
            "checkpoint_alignment": alignment,
            "budget": budget,
            "max_model_len": 8192,
        }
        for cfg, dtype, ssm, budget, stated, mode, alignment in cases
    ]
    theirs = ask_vllm("vllm_block_size.py", spec, venv=VENV)
    raised = 0
    for (cfg, dtype, ssm, budget, stated, mode, alignment), vllm in zip(cases, theirs):
        z = hybrid_page_sizes(
            cfg, dtype, ssm, block_size=stated or 64, prefill_checkpoint_alignment=alignment
        )
        at = (dtype, stated, mode, alignment, vllm)
        assert z.block_size == vllm["block_size"], at
        assert z.page_bytes == vllm["page_size_bytes"], at
        assert (z.page_bytes if z.padding_bytes else None) == vllm["mamba_page_size_padded"], at
        # the pool and the concurrency as `num_gpu_blocks: "auto"` derives them
        sizing = num_gpu_blocks_from_profile(
            PROFILE, cfg, z.block_size, dtype, 0.9, 8192, kv_cache_memory_bytes=budget
        )
        assert sizing.num_gpu_blocks == budget // sizing.bytes_per_block == vllm["num_blocks"], at
        attention, states = hybrid_group_counts(cfg, mode)
        blocks = attention * -(-8192 // z.block_size) + states
        assert vllm["max_concurrency"] == pytest.approx(vllm["num_blocks"] / blocks), at
        if mode == "align" and alignment is None:  # the engine's: align, no checkpoint blocks
            assert sizing.max_concurrency == pytest.approx(vllm["max_concurrency"]), at
        raised += stated is not None and z.block_size != stated
    assert raised > 0, "some stated sizes are raised (else the stated path proves little)"
