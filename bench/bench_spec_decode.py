"""Speculative decoding benchmark: no speculation vs the n-gram proposer vs the draft model.

Runs the full engine greedily, one request at a time, on prompts whose answers repeat text the
prompt already holds (where prompt lookup guesses well) and on free text (where it guesses badly),
three ways: ``engine.speculative`` off, ``method: ngram`` and ``method: draft_model`` (the target's
first L layers, self-speculative). Per prompt and method it prints: drafts proposed and accepted,
the acceptance rate, **tokens per target forward** (decode tokens / decode steps: each step is one
forward of the whole target model), draft-model forwards, decode wall time and tokens/s, and
whether the tokens equal the run without speculation. Decode time is measured from the end of the
prefill step to the last step, so the prompt's forward does not count.

    python bench/bench_spec_decode.py --threads 1           # SmolLM2 when installed, else tiny
    python bench/bench_spec_decode.py --k 4 --layers 8      # other proposer settings
    python bench/bench_spec_decode.py --sweep-layers 4,8,12,16 --max-tokens 48
                                                            # acceptance per draft depth
    python bench/bench_spec_decode.py --repeat 3            # best of 3 on a busy machine

Figures: docs/speculative-decoding.md and docs/results.md (the machine is shared: the load
average is printed with them).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from kvcore.model import load_model, smollm2_available  # noqa: E402
from paged_kv_lab.run.engine import Engine  # noqa: E402
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario, SpeculativeConfig  # noqa: E402

PROMPTS = {
    "copy list": "Copy this list exactly, twice:\napple, banana, cherry, date, elderberry, fig, "
    "grape, "
    "honeydew, kiwi, lemon, mango, nectarine, orange, papaya.\n\nCopy 1:\napple, banana,",
    "rename code": "Rewrite this Python function with the variable `total` renamed to `acc`:\n\n"
    "def add_all(items):\n    total = 0\n    for item in items:\n        total = total + item\n"
    "    return total\n\nRewritten:\n\ndef add_all(items):\n",
    "free text": "Tell me a short story about a lighthouse keeper who finds a message in a bottle.",
}


def run(model, prompt: str, speculative, max_tokens: int):
    """(engine, decode seconds, decode steps) for one greedy request."""
    sc = Scenario(
        model=model.name,
        device="cpu",
        engine=EngineSettings(
            num_gpu_blocks=256, max_num_batched_tokens=1024, speculative=speculative
        ),
        requests=(RequestSpec(id="r", prompt=prompt, max_tokens=max_tokens, ignore_eos=True),),
    )
    eng = Engine(sc, model=model)
    eng.step()  # the prompt: not decode
    t0 = time.perf_counter()
    recs = eng.run()
    return eng, time.perf_counter() - t0, len(recs)


def methods(args) -> dict[str, SpeculativeConfig | None]:
    return {
        "none": None,
        "ngram": SpeculativeConfig(
            num_speculative_tokens=args.k,
            prompt_lookup_min=args.min_n,
            prompt_lookup_max=args.max_n,
        ),
        f"draft L={args.layers}": SpeculativeConfig(
            method="draft_model", num_speculative_tokens=args.k, num_draft_layers=args.layers
        ),
    }


def table(model, args, configs: dict) -> None:
    print(
        "| prompt | method | drafts | accepted | acceptance | tokens / target forward "
        "| target forwards | draft forwards | decode s | decode tok/s | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    n = args.max_tokens - 1  # decode tokens: the first came with the prompt
    for name, prompt in PROMPTS.items():
        best: dict[str, tuple] = {}
        for _ in range(args.repeat):  # interleaved, so a load spike hits every method alike
            for label, sp in configs.items():
                eng, secs, steps = run(model, prompt, sp, args.max_tokens)
                if label not in best or secs < best[label][1]:
                    best[label] = (eng, secs, steps)
        base = best["none"][0].outputs()["r"]["token_ids"] if "none" in best else None
        for label, (eng, secs, steps) in best.items():
            st = eng.spec_decoding_stats
            drafter = eng.drafter
            fwd = getattr(drafter, "num_forwards", 0)
            same = base is None or eng.outputs()["r"]["token_ids"] == base
            print(
                f"| {name} | {label} | {st.num_draft_tokens} | {st.num_accepted_tokens} | "
                f"{st.acceptance_rate:.0%} | {n / steps:.2f} | {steps} | {fwd} | {secs:.2f} | "
                f"{n / secs:.1f} | {'yes' if same else 'NO'} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2" if smollm2_available() else "tiny-random")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--min-n", type=int, default=2, help="prompt_lookup_min")
    ap.add_argument("--max-n", type=int, default=4, help="prompt_lookup_max")
    ap.add_argument("--layers", type=int, default=0, help="draft layers (0: the default)")
    ap.add_argument("--sweep-layers", default="", help="comma-separated draft depths only")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, device="cpu")
    num_layers = model.config.num_hidden_layers
    args.layers = args.layers or max(1, num_layers * 3 // 4)
    load0 = os.getloadavg()[0]
    print(
        f"model {model.name} ({num_layers} layers), cpu, {torch.get_num_threads()} threads; "
        f"k={args.k}, n-grams of {args.min_n}-{args.max_n}, {args.max_tokens} tokens, "
        f"best of {args.repeat}\n"
    )
    if args.sweep_layers:
        depths = [int(x) for x in args.sweep_layers.split(",")]
        configs = {
            f"draft L={d}": SpeculativeConfig(
                method="draft_model", num_speculative_tokens=args.k, num_draft_layers=d
            )
            for d in depths
        }
        table(model, args, {"none": None, **configs})
    else:
        table(model, args, methods(args))
    print(f"\n(load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
