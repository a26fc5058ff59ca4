"""Half precision: the paged runner follows transformers as closely as transformers follows itself.

In float32 the paged engine's greedy tokens equal ``generate`` exactly (test_engine_equality).
In bfloat16 / float16 two correct implementations already disagree in the last bits: the
yardstick is transformers' own drift between ``generate`` (with its KV cache) and one full
forward over the same tokens.  The paged runner must stay within twice that drift, and any
greedy divergence must sit on a near tie that this much rounding can flip.
"""

from typing import Sequence

import pytest
import torch

from kvcore.model import load_model
from kvcore.model.reference import Agreement, agreement_with_generate
from kvcore.utils.math_utils import cdiv
from kvcore.worker.gpu.model_runner import GPUModelRunner
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario
from support.runner_tap import TappedRun, req

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [
    [17, 254, 1033, 88, 4012, 7, 391, 2290, 56, 1777, 640],
    [12, 9001, 345, 78, 2048, 31, 4444, 500, 61, 909, 17, 254, 1033, 88, 4012, 7, 391, 2290, 56],
    [640, 12, 9001],
    [2290, 56, 1777, 640, 12, 9001, 345, 78, 2048, 31],
]


@pytest.fixture(scope="module", params=["bfloat16", "float16"])
def tiny_half(request):
    return load_model("tiny-random", device="cpu", dtype=request.param)


@torch.inference_mode()
def measure_agreement(
    loaded, prompts: Sequence[Sequence[int]], new_tokens: int, block_size: int = 16
) -> Agreement:
    """Run ``prompts`` together through the engine (its paged runner watched,
    tests/support/runner_tap.py) and compare with ``generate`` one by one
    (kvcore.model.reference.agreement_with_generate, the measure bench/bench_dtype.py prints
    too)."""
    blocks = 1 + sum(cdiv(len(p) + new_tokens, block_size) for p in prompts)
    run = TappedRun(
        loaded,
        [req(f"r{i}", p, new_tokens) for i, p in enumerate(prompts)],
        poison=None,
        block_size=block_size,
        num_gpu_blocks=blocks,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=max(256, sum(map(len, prompts))),
    )
    paged = run.run()
    assert len(run.batches[1]) == len(prompts), "every prompt in the first batch"
    return agreement_with_generate(loaded, prompts, new_tokens, paged, run.logits)


def check(a):
    assert a.tokens_total > 0
    assert a.reference_noise > 0  # half precision really is in use
    assert a.paged_diff <= 2 * a.reference_noise + 1e-5, a
    assert a.divergences_explained, a


def test_pools_take_the_model_dtype(tiny_half):
    runner = GPUModelRunner(tiny_half, num_blocks=8, block_size=4)
    assert {t.dtype for t in runner.kv_caches} == {tiny_half.dtype}


def test_only_float32_weights_are_laid_out_input_major(tiny_half, tiny_model):
    """The loader stores float32 Linear weights input-major (faster in MKL's sgemm) and leaves
    half-precision ones row-major: on a CPU without native bfloat16 matmuls (AVX2) an
    input-major bfloat16 weight multiplies ~7x slower, which made the SmolLM2 bfloat16 test
    below take 100 CPU-seconds instead of 15."""
    half = [m.weight for m in tiny_half.model.modules() if isinstance(m, torch.nn.Linear)]
    full = [m.weight for m in tiny_model.model.modules() if isinstance(m, torch.nn.Linear)]
    assert half and all(w.is_contiguous() for w in half)
    assert full and all(w.t().is_contiguous() for w in full)


def test_half_precision_runner_agrees_with_transformers(tiny_half):
    check(measure_agreement(tiny_half, PROMPTS, 16, block_size=4))


def test_float32_agreement_is_exact_greedy(tiny_model):
    a = measure_agreement(tiny_model, PROMPTS, 16, block_size=4)
    assert a.tokens_equal == a.tokens_total and not a.divergences
    assert a.paged_diff < 1e-4


def test_engine_runs_a_bfloat16_scenario_end_to_end(tiny_model):
    sc = Scenario(
        model="tiny-random",
        device="cpu",
        dtype="bfloat16",
        engine=EngineSettings(block_size=4, num_gpu_blocks=12),
        requests=(
            RequestSpec(id="a", prompt_token_ids=tuple(PROMPTS[0]), max_tokens=6),
            RequestSpec(id="b", prompt_token_ids=tuple(PROMPTS[0][:8]), max_tokens=6),
        ),
    )
    eng = Engine(sc, debug=True)  # loads the model itself, in the scenario's dtype
    eng.run()
    assert eng.model.dtype == torch.bfloat16
    assert {t.dtype for t in eng.runner.kv_caches} == {torch.bfloat16}
    ref = eng.model.model
    with torch.inference_mode():
        x = torch.tensor([PROMPTS[0]])
        want = ref.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=6,
            min_new_tokens=6,
            do_sample=False,
            pad_token_id=0,
        )[0, len(PROMPTS[0]) :].tolist()
    assert eng.outputs()["a"]["token_ids"] == want
    assert any(e.kind == "cache_hit" for r in eng.history for e in r.events)


@pytest.mark.slow
def test_smollm2_bfloat16_agrees_with_transformers(smollm2):
    """Four short openings of different lengths to continue, batched, in blocks of 4 tokens: each
    request crosses several block boundaries while it decodes its 16 tokens. (The chat template's
    system turn made every prompt ~36 tokens and the answers stopped early at the turn's end; in
    bfloat16 on a CPU every token compared costs a forward of SmolLM2 in generate.)"""
    m = load_model("smollm2", device="cpu", dtype="bfloat16")
    prompts = [
        m.encode_prompt(q, chat=False)
        for q in (
            "The capital of France is",
            "A haiku about the sea:",
            "Three prime numbers are",
            "The sky is blue because",
        )
    ]
    assert len(set(map(len, prompts))) > 1
    check(measure_agreement(m, prompts, 16, block_size=4))
