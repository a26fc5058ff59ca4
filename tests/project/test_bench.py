"""The benchmarks' drivers still fit the code they measure (no timing is asserted here)."""

import importlib
import math
import sys

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT))


@pytest.mark.parametrize(
    "name",
    [
        "bench_engine",
        "bench_dtype",
        "bench_kvcore",
        "step_anatomy",
        "bench_player",
        "bench_pool_vs_vllm",
        "bench_fairness",
        "bench_soak",
        "bench_spec_decode",
        "bench_trace",
        "bench_kv_events",
        "bench_replay",
    ],
)
def test_every_benchmark_imports(name):
    importlib.import_module(f"bench.{name}")


def test_engine_and_runner_backends_generate_the_same_tokens(tiny_model, one_torch_thread):
    from bench.bench_engine import engine_backend, paged_runner_backend
    from bench.timing import step_seconds_interleaved

    prompts = [tiny_model.encode_prompt(q) for q in ("Name a colour.", "Why is the sky blue?")]
    engine_run = engine_backend(tiny_model)
    runner_run, _, _ = paged_runner_backend(tiny_model)
    by_engine = engine_run(prompts, 5)
    by_runner = runner_run(prompts, 5)
    assert [by_engine[f"r{i}"]["token_ids"] for i in range(2)] == [
        by_runner[f"r{i}"] for i in range(2)
    ]
    steps = step_seconds_interleaved(
        {"e": (engine_run, prompts), "r": (runner_run, prompts)}, 4, repeat=1
    )
    assert all(math.isfinite(s) and s > 0 for s in steps.values())


def test_paired_ratios_pair_the_runs_of_one_round():
    from bench.timing import paired_ratios, step_rounds

    order = []
    seconds = {"base": iter([0.2, 0.4, 0.3]), "other": iter([0.1, 0.1, 0.2])}

    def backend(name):
        def run(prompts, n):
            order.append(name)
            run.step_seconds = next(seconds[name])

        return run

    rounds = step_rounds(
        {"base": (backend("base"), []), "other": (backend("other"), [])}, 1, repeat=3
    )
    assert order == ["base", "other", "other", "base", "base", "other"]  # who goes first rotates
    assert rounds == {"base": [0.2, 0.4, 0.3], "other": [0.1, 0.1, 0.2]}
    assert paired_ratios(rounds, "base", "other") == pytest.approx([2.0, 4.0, 1.5])


def test_step_breakdown_parts_add_up(tiny_model, one_torch_thread):
    from bench.step_anatomy import attention_free_steps, stacking_gain, step_breakdown

    prompts = [tiny_model.encode_prompt(q) for q in ("Name a colour.", "Why is the sky blue?")]
    parts = step_breakdown(tiny_model, prompts, steps=3, repeat=1)
    assert parts["linear"] > 0 and parts["attention"] > 0 and parts["rest"] > 0
    assert parts["linear"] + parts["attention"] + parts["rest"] == pytest.approx(parts["step"])
    floors = attention_free_steps(tiny_model, 4, steps=2, repeat=1)
    assert set(floors) == {"packed", "plain"} and all(v > 0 for v in floors.values())
    gain = stacking_gain(tiny_model, prompts, steps=3)
    assert set(gain) == {"stacked", "unstacked"} and all(v > 0 for v in gain.values())
