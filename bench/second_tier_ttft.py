"""Time to first token by tier on lesson 10's scenario
(paged_kv_lab/content/lessons/secondtier/scenario.json):
each request's prompt split into GPU hit, CPU hit and computed tokens, and its TTFT (the wall time
of the steps from the one it arrived in to the one that sampled its first token), over several
runs.

    .venv/bin/python bench/second_tier_ttft.py --runs 5                 # SmolLM2 on the CPU
    .venv/bin/python bench/second_tier_ttft.py --model tiny-random --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    import torch

    from kvcore.model import load_model
    from paged_kv_lab.content.tiers import tier_rows
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.run.scenario import load_scenario

    model = load_model(args.model, args.device)
    scenario = load_scenario(
        os.path.join(REPO, "paged_kv_lab", "content", "lessons", "secondtier", "scenario.json")
    )
    by_request: dict[str, list] = {}
    for _ in range(args.runs):
        for row in tier_rows(Engine(scenario, model=model).run()):
            by_request.setdefault(row.request_id, []).append(row)
    print(f"{args.model} on {args.device}, torch {torch.__version__}, {args.runs} runs")
    print("request case     prompt  gpu  cpu  computed  steps  TTFT ms (each run)  median")
    for rid, rows in by_request.items():
        r = rows[0]
        each = ", ".join(f"{x.ttft_ms:.0f}" for x in rows)
        median = statistics.median(x.ttft_ms for x in rows)
        print(
            f"{rid:7s} {r.case:8s} {r.num_prompt_tokens:6d} {r.gpu_hit_tokens:4d} "
            f"{r.cpu_hit_tokens:4d} {r.computed_tokens:9d} {r.ttft_steps:6d}  {each}  {median:.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
