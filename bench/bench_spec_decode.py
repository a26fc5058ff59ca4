"""Speculative decoding benchmark: acceptance rate and decode speed-up of the n-gram proposer.

Runs the full engine greedily on prompts whose answers repeat text the prompt already holds
(where prompt lookup guesses well), and on a free-form one (where it guesses badly), with
``engine.speculative`` off and on, and prints per prompt: drafts proposed and accepted, the
acceptance rate, tokens gained per verification step, engine steps, decode tokens/s and the
speed-up. Decode time is measured from the end of the prefill step to the last step, so the
prompt's forward does not count. It also checks that both runs produced the same tokens.

    python bench/bench_spec_decode.py                  # SmolLM2 when installed, else tiny-random
    python bench/bench_spec_decode.py --k 5 --max-n 4  # other proposer settings
    python bench/bench_spec_decode.py --repeat 3       # best of 3 on a busy machine

Figures: see the README's *Speculative decoding* section (the machine is shared: the load
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
from record.engine import Engine  # noqa: E402
from record.scenario import EngineSettings, RequestSpec, Scenario, SpeculativeConfig  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2" if smollm2_available() else "tiny-random")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--min-n", type=int, default=2, help="prompt_lookup_min")
    ap.add_argument("--max-n", type=int, default=4, help="prompt_lookup_max")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, device="cpu")
    spec = SpeculativeConfig(
        num_speculative_tokens=args.k, prompt_lookup_min=args.min_n, prompt_lookup_max=args.max_n
    )
    load0 = os.getloadavg()[0]
    print(
        f"model {model.name}, cpu, {torch.get_num_threads()} threads; k={args.k}, "
        f"n in [{args.min_n}, {args.max_n}], {args.max_tokens} tokens, best of {args.repeat}\n"
    )
    print(
        "| prompt | drafts | accepted | acceptance | tokens/verify step | steps off → on "
        "| decode tok/s off → on | speed-up | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, prompt in PROMPTS.items():
        best_off = best_on = float("inf")
        for _ in range(args.repeat):
            base, t_off, steps_off = run(model, prompt, None, args.max_tokens)
            eng, t_on, steps_on = run(model, prompt, spec, args.max_tokens)
            best_off, best_on = min(best_off, t_off), min(best_on, t_on)
        same = base.outputs()["r"]["token_ids"] == eng.outputs()["r"]["token_ids"]
        st = eng.spec_decoding_stats
        n = args.max_tokens - 1
        print(
            f"| {name} | {st.num_draft_tokens} | {st.num_accepted_tokens} | "
            f"{st.acceptance_rate:.0%} "
            f"| {st.mean_acceptance_length:.2f} | {steps_off} → {steps_on} | {n / best_off:.1f} → "
            f"{n / best_on:.1f} | {best_off / best_on:.2f}× | {'yes' if same else 'NO'} |"
        )
    print(f"\n(load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at the end)")


if __name__ == "__main__":
    main()
