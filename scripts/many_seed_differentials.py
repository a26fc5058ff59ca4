"""The differentials against vLLM 0.34.0 on many random seeds: a slow job, not a test (issue 36).

Three differentials that the test suite runs on a handful of fixed seeds, here on as many random
ones as asked, the seeds drawn from a master seed that is printed first (give it back with
``--seed`` to run the same seeds again):

- ``offload``: the CPU tier (bench/offload_vs_vllm.py): one random trace per seed, ours against
  vLLM's SimpleCPUOffloadScheduler and KVCacheManager, every step's lookups, stores, loads, block
  tables, free queues and failed-load rollbacks;
- ``lookahead``: our Scheduler against vLLM's with ``num_lookahead_tokens > 0``
  (scripts/vllm_lookahead_diff.py): each chunk a random seed that draws its traces;
- ``replay``: a random Mooncake-format trace per seed (requests sharing random prefixes, random
  arrivals) replayed through vLLM's Scheduler / KVCacheManager / BlockPool and ours
  (bench/bench_replay.py): every request's hit tokens and preemptions, the step count and the
  prefix-cache totals.

    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python scripts/many_seed_differentials.py --count 2000
    .venv/bin/python scripts/many_seed_differentials.py --count 300 --only offload --seed 7

Every seed where a differential differs is printed (the offload and replay differentials go on
past them; the lookahead script stops at its first); exit status 1 if any did.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

DIFFERENTIALS = ("offload", "lookahead", "replay")


def chunks(seq, n):
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def run_offload(venv: str, seeds: list[int], chunk: int) -> dict:
    import offload_vs_vllm

    steps, failures, traces = 0, [], 0
    for part in chunks(seeds, chunk):
        crashed = []
        try:
            res = offload_vs_vllm.differential(venv, part)
        except Exception:  # our side crashed on a trace: name it, compare the others
            for seed in part:
                try:
                    offload_vs_vllm.our_run(offload_vs_vllm.random_case(seed))
                except Exception as exc:
                    crashed.append({"seed": seed, "error": f"ours: {type(exc).__name__}: {exc}"})
            bad = {c["seed"] for c in crashed}
            res = offload_vs_vllm.differential(venv, [s for s in part if s not in bad])
        steps += res["exercised"]["steps"]
        traces += len(part)
        failures += crashed + res["failures"]
        n = len(crashed) + len(res["failures"])
        print(f"  offload: {len(part)} traces, {n} differ", flush=True)
    return {"traces": traces, "steps": steps, "failures": failures}


def run_lookahead(venv: str, seeds: list[int], chunk: int) -> dict:
    """One run of the script per seed, each drawing ``chunk`` traces from its seed."""
    failures, traces = [], 0
    script = os.path.join(REPO, "scripts", "vllm_lookahead_diff.py")
    for seed in seeds[: max(1, len(seeds) // chunk)]:
        proc = subprocess.run(
            [
                os.path.join(venv, "bin", "python"),
                script,
                "--traces",
                str(chunk),
                "--seed",
                str(seed),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
        )
        traces += chunk
        last = (proc.stdout.strip().splitlines() or [proc.stderr[-500:]])[-1]
        print(f"  lookahead: seed {seed}, {chunk} traces: {last[:160]}", flush=True)
        if proc.returncode != 0:
            failures.append({"seed": seed, "first": last})
            break
    return {"traces": traces, "failures": failures}


def random_trace(seed: int, path: str) -> None:
    """A Mooncake-format trace: 24 requests drawing their blocks' hash ids from 4 prefixes."""
    rng = random.Random(seed)
    prefixes = [list(range(1000 * p, 1000 * p + rng.randint(1, 12))) for p in range(4)]
    t, fresh = 0, 100000
    with open(path, "w") as fh:
        for _ in range(24):
            t += rng.randint(0, 3000)
            ids = list(rng.choice(prefixes)[: rng.randint(0, 12)])
            n_own = rng.randint(1, 6)
            ids += list(range(fresh, fresh + n_own))
            fresh += n_own
            length = 512 * (len(ids) - 1) + rng.randint(1, 512)
            row = {"timestamp": t, "input_length": length, "output_length": rng.randint(1, 24)}
            fh.write(json.dumps({**row, "hash_ids": ids}) + "\n")


def run_replay(venv: str, seeds: list[int], chunk: int) -> dict:
    from bench.bench_replay import run_vllm, vllm_job
    from paged_kv_lab.workloads.replay import replay, replay_settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    overrides = {"block_size": 16, "num_gpu_blocks": 900, "max_num_seqs": 8}
    failures = []
    with tempfile.TemporaryDirectory(prefix="many-seed-replay-") as tmp:
        for part in chunks(seeds, chunk):
            ours, jobs = [], []
            for seed in part:
                path = os.path.join(tmp, f"{seed}.jsonl")
                random_trace(seed, path)
                trace = load_trace(path)
                arrival = "timestamps" if seed % 2 else "sequential"
                settings = replay_settings(trace, overrides, arrival=arrival)
                ours.append(replay(trace, settings))
                jobs.append(vllm_job(path, settings, None, settings.engine.max_model_len))
            theirs = run_vllm({"jobs": jobs}, venv, timeout=3600)
            for seed, mine, v in zip(part, ours, theirs):
                got = (
                    [r.hit_tokens for r in mine.per_request],
                    [r.num_preemptions for r in mine.per_request],
                    mine.steps,
                    (mine.queries, mine.hit_tokens),
                )
                want = (
                    v["hit_tokens"],
                    v["num_preemptions"],
                    v["steps"],
                    (v["totals"]["queries"], v["totals"]["hits"]),
                )
                if got != want:
                    failures.append({"seed": seed, "ours": str(got)[:300], "vllm": str(want)[:300]})
            print(f"  replay: {len(part)} traces, {len(failures)} differ", flush=True)
            if failures:
                break
    return {"traces": len(seeds), "failures": failures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=2000, help="random seeds per differential")
    ap.add_argument("--seed", type=int, help="the master seed (default: drawn, and printed)")
    ap.add_argument("--only", choices=DIFFERENTIALS, action="append")
    ap.add_argument("--chunk", type=int, default=100, help="traces per vLLM process")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    venv = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        print(f"skipped: no vLLM 0.34.0 environment at {venv} (bash scripts/vllm_env.sh)")
        return 0
    master = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"master seed {master} (--seed {master} runs these seeds again)", flush=True)
    rng = random.Random(master)
    results = {}
    for name in args.only or DIFFERENTIALS:
        seeds = rng.sample(range(1 << 30), args.count)
        print(f"{name}: {args.count} seeds, first {seeds[:5]}", flush=True)
        start = time.time()
        run = {"offload": run_offload, "lookahead": run_lookahead, "replay": run_replay}[name]
        res = run(venv, seeds, args.chunk)
        res["seconds"] = round(time.time() - start)
        results[name] = res
        print(f"{name}: {res['traces']} traces, {len(res['failures'])} differ, {res['seconds']} s")
        for f in res["failures"][:5]:
            print(f"  differs: {f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"master_seed": master, **results}, fh, indent=1)
    return 1 if any(r["failures"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
