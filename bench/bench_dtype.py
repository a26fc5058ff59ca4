"""Half precision: how far the paged runner drifts from transformers, and what it costs.

For each dtype: the largest logit difference between the paged runner and one full
transformers forward over the same tokens, next to transformers' own drift (its
``generate`` with a KV cache vs that full forward) -- two correct implementations already
differ by that much in this dtype; greedy tokens equal to ``generate``'s (and, for any
divergence, ``generate``'s top-2 margin there); and the paged decode step with 8 requests.

The paged side is bare kvcore (``bench/step_anatomy.py: BareEngine``: KVCacheManager, Scheduler
and EngineCore over a GPUModelRunner, no Recorder, no Snapshot), every prompt in one batch,
stopping at EOS; the runner's ``execute_logits`` is kept for every sampled position and the
greedy token is their argmax, as ``execute`` takes it.  The comparison is
``kvcore.model.reference.agreement_with_generate``, the one tests/differential/test_model_dtype.py
holds to its bounds (the test drives the recording Engine instead).

    python bench/bench_dtype.py                          # SmolLM2, cpu, float32 and bfloat16
    python bench/bench_dtype.py --dtypes float32 bfloat16 float16 --device cuda
    python bench/bench_dtype.py --model tiny-random --dtypes float32 bfloat16 float16
    python bench/bench_dtype.py --model tiny-random --new-tokens 8   # quick: does it still run?

On the project's 2-core CPU float16 is very slow (no fast fp16 kernels: ~5 min for the
agreement run alone), so it is left out by default there.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from bench.bench_engine import QUESTIONS, paged_runner_backend  # noqa: E402
from bench.step_anatomy import BareEngine, bench_settings  # noqa: E402
from bench.timing import step_seconds_interleaved  # noqa: E402
from kvcore.model import (  # noqa: E402
    ATTENTION_MODELS,
    DTYPE_CHOICES,
    load_model,
    smollm2_available,
)
from kvcore.model.reference import Agreement, agreement_with_generate  # noqa: E402
from kvcore.utils.math_utils import cdiv  # noqa: E402
from kvcore.worker.gpu.model_runner import GPUModelRunner  # noqa: E402


class LogitsTap:
    """What EngineCore calls as its model runner: the real runner's ``execute_logits``, every
    sampled position's logits kept by request, the greedy token their argmax."""

    def __init__(self, runner: GPUModelRunner) -> None:
        self.runner = runner
        self.logits: dict[str, list[torch.Tensor]] = defaultdict(list)

    @property
    def last_inputs(self):
        return self.runner.last_inputs

    def execute(self, items):
        logits = self.runner.execute_logits(items)
        for rid, lg in logits.items():
            self.logits[rid].append(lg)
        return {rid: int(torch.argmax(lg)) for rid, lg in logits.items()}


@torch.inference_mode()
def measure_agreement(loaded, prompts, new_tokens: int, block_size: int = 16) -> Agreement:
    """Run ``prompts`` together through bare kvcore (a pool just large enough, every prompt in
    the first batch, each request stopping at EOS or after ``new_tokens``) and compare with
    ``generate`` one by one."""
    blocks = 1 + sum(cdiv(len(p) + new_tokens, block_size) for p in prompts)
    runner = GPUModelRunner(loaded, blocks, block_size)
    eng = BareEngine(runner, bench_settings(prompts, block_size, blocks))
    tap = eng.engine_core.model_runner = LogitsTap(runner)
    for i, p in enumerate(prompts):
        eng.add(f"r{i}", p, new_tokens, eos_ids=loaded.eos_ids, ignore_eos=False)
    first = eng.step().scheduler_output.num_scheduled_tokens
    if len(first) != len(prompts):
        raise RuntimeError("every prompt should be in the first batch")
    paged = eng.run()
    return agreement_with_generate(loaded, prompts, new_tokens, paged, tap.logits)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", choices=ATTENTION_MODELS, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "bfloat16"],
        choices=DTYPE_CHOICES,
    )
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    name = args.model or ("smollm2" if smollm2_available() else "tiny-random")
    print(
        f"# Paged KV Lab half-precision benchmark ({name}, {args.device}, torch "
        f"{torch.__version__}, "
        f"{torch.get_num_threads()} threads; {len(QUESTIONS)} chat prompts, up to "
        f"{args.new_tokens} "
        f"new tokens, stopping at EOS)\n"
    )
    print(
        "| dtype | paged vs full forward: max abs logit diff | transformers' own drift | "
        "greedy tokens equal to generate | divergences (request, position, generate's top-2 "
        "margin) "
        "| paged decode step, 8 requests (ms) | agreement run (s) |"
    )
    print("|---|---:|---:|---:|---|---:|---:|")
    for dt in args.dtypes:
        loaded = load_model(name, args.device, dt)
        prompts = [loaded.encode_prompt(q) for q in QUESTIONS]
        t0 = time.perf_counter()
        a = measure_agreement(loaded, prompts, args.new_tokens)
        secs = time.perf_counter() - t0
        run, _, _ = paged_runner_backend(loaded)
        run(prompts, 2)  # warm-up
        step_ms = step_seconds_interleaved({"paged": (run, prompts)}, 12, repeat=2)["paged"] * 1e3
        div = ", ".join(f"({r}, {k}, {m:.3g})" for r, k, m in a.divergences) or "none"
        print(
            f"| {dt} | {a.paged_diff:.3g} | {a.reference_noise:.3g} | "
            f"{a.tokens_equal}/{a.tokens_total} "
            f"| {div} | {step_ms:.1f} | {secs:.1f} |",
            flush=True,
        )
        del loaded, run
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
