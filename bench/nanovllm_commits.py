"""nano-vllm at bb823b3 against nano-vllm at 2f352ae, on the same trace (model-free).

    .venv/bin/python bench/nanovllm_commits.py
    .venv/bin/python bench/nanovllm_commits.py TRACE.jsonl --num-gpu-blocks 2000 --block-size 512

Each commit's model (paged_kv_lab/designs/nanovllm/) runs the trace's requests one after
another (as ``python -m paged_kv_lab compare`` does) and reports, from its events: hit tokens,
prompts
found cached whole (a full last block hit: 2f352ae only), wrong hits (a stale entry whose block
holds the same tokens after another prefix: 2f352ae only), stale misses (2f352ae; bb823b3 has
deleted those entries), and whether every request got the same hit tokens at both commits.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from paged_kv_lab.designs import design_events as ev
from paged_kv_lab.designs.nanovllm import COMMITS
from paged_kv_lab.designs.sim import NanoRun
from paged_kv_lab.designs.three_designs import trace_requests
from paged_kv_lab.workloads.trace_formats import load_trace

HERE = Path(__file__).resolve().parent.parent
RUNS = [
    (HERE / "tests/fixtures/traces/mooncake_slice.jsonl", 5000, 16),
    (HERE / "paged_kv_lab/workloads/traces/mooncake_synthetic_trace.jsonl", 2000, 512),
]


def run(path: Path, num_blocks: int, block_size: int) -> None:
    reqs = trace_requests(load_trace(path))
    hits = {}
    for commit in COMMITS:
        n = {"wrong hits": 0, "stale misses": 0, "whole prompts": 0}

        def see(e, n=n) -> None:
            if isinstance(e, ev.BlockHit) and e.wrong_prefix:
                n["wrong hits"] += 1
            elif isinstance(e, ev.BlockMiss) and e.reason == "stale":
                n["stale misses"] += 1

        t0 = time.process_time()
        sim = NanoRun(num_blocks, block_size, observer=see, commit=commit)
        for req in reqs:
            r = sim.run(req)
            n["whole prompts"] += r.prompt_tokens > 0 and r.hit_tokens == r.prompt_tokens
        hits[commit] = [r.hit_tokens for r in sim.results]
        print(
            f"{path.name} ({len(reqs):,} requests, {num_blocks:,} blocks of {block_size}) "
            f"nano-vllm {commit}: {sum(hits[commit]):,} hit tokens, "
            + ", ".join(f"{v:,} {k}" for k, v in n.items())
            + f" ({time.process_time() - t0:.0f} s CPU)"
        )
    same = len(set(map(tuple, hits.values()))) == 1
    print(f"  every request the same hit tokens at both commits: {same}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", nargs="?", type=Path)
    p.add_argument("--num-gpu-blocks", type=int, default=5000)
    p.add_argument("--block-size", type=int, default=16)
    a = p.parse_args()
    for path, nb, bs in [(a.trace, a.num_gpu_blocks, a.block_size)] if a.trace else RUNS:
        run(path, nb, bs)


if __name__ == "__main__":
    main()
