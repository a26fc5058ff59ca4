"""The differentials against vLLM 0.34.0 on many random seeds: a slow job, not a test (issue 36).

Seven differentials that the test suite runs on a handful of fixed seeds, here on as many random
ones as asked, the seeds drawn from a master seed that is printed first (give it back with
``--seed`` to run the same seeds again):

- ``replay``, the plain Scheduler: a random Mooncake-format trace per seed (requests sharing
  random prefixes, random arrivals) replayed through vLLM's Scheduler / KVCacheManager / BlockPool
  and ours (bench/bench_replay.py): every request's hit tokens and preemptions, the step count and
  the prefix-cache totals;
- ``hybrid``: full-attention + Mamba layouts through vLLM's KVCacheManager and ours
  (bench/hybrid_vs_vllm.py): each chunk a random first seed, its traces in every configuration;
- ``offload``: the CPU tier (bench/offload_vs_vllm.py): one random trace per seed, ours against
  vLLM's SimpleCPUOffloadScheduler and KVCacheManager, every step's lookups, stores, loads, block
  tables, free queues and failed-load rollbacks;
- ``offload_scheduler``: the same traces on vLLM's own ``Scheduler.schedule()`` with its
  SimpleCPUOffloadConnector and on kvcore's (``bench/offload_vs_vllm.py --scheduler``), each
  deciding by itself: every step's three waiting queues, admissions, statuses and block tables; a
  run that stalls must stall on both sides in the same state (counted apart, not a difference);
- ``pd``: prefill here, decode there (bench/pd_vs_vllm.py): one random trace per seed through our
  P/D pair and two of vLLM's Schedulers with its NixlConnector, every step;
- ``lookahead``: our Scheduler against vLLM's with ``num_lookahead_tokens > 0``
  (scripts/vllm_lookahead_diff.py): each chunk a random seed that draws its traces;
- ``fleet``: a random trace per seed through a fleet (2 to 4 replicas, a router drawn among ours)
  under sequential arrival; each replica's requests, in trace order, through vLLM's Scheduler
  (bench/bench_replay.py's driver): every request's hit tokens and each replica's prefix-cache
  totals.

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
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

DIFFERENTIALS = ("replay", "hybrid", "offload", "offload_scheduler", "pd", "lookahead", "fleet")


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


def run_offload_scheduler(venv: str, seeds: list[int], chunk: int) -> dict:
    import offload_vs_vllm

    steps, failures, traces, stalled = 0, [], 0, []
    for part in chunks(seeds, chunk):
        res = offload_vs_vllm.scheduler_differential(venv, part)
        steps += res["steps"]
        traces += len(part)
        failures += res["failures"]
        stalled += [t["seed"] for t in res["traces"] if t["stalled"]]
        print(
            f"  offload_scheduler: {len(part)} traces, {len(res['failures'])} differ, "
            f"{sum(1 for t in res['traces'] if t['stalled'])} stall on both sides",
            flush=True,
        )
    return {"traces": traces, "steps": steps, "failures": failures, "stalled": stalled}


def run_hybrid(venv: str, seeds: list[int], chunk: int) -> dict:
    """One worker per chunk: ``chunk`` consecutive traces from a random first seed, each in every
    configuration of bench/hybrid_vs_vllm.py (a trace is one seed in one configuration)."""
    import hybrid_vs_vllm

    failures, traces, steps = [], 0, 0
    for first in seeds[: max(1, len(seeds) // chunk)]:
        res = hybrid_vs_vllm.differential(
            venv, range(first, first + chunk), list(hybrid_vs_vllm.HYBRID_CONFIGS)
        )
        traces += res["runs"]
        steps += res["steps"]
        failures += res["first_differences"]
        n = res["runs"] - res["identical"]
        print(
            f"  hybrid: seeds {first}..{first + chunk - 1}, {res['runs']} traces, {n} differ",
            flush=True,
        )
    return {"traces": traces, "steps": steps, "failures": failures}


def run_pd(venv: str, seeds: list[int], chunk: int) -> dict:
    import pd_vs_vllm

    failures, traces, steps = [], 0, 0
    for part in chunks(seeds, chunk):
        res = pd_vs_vllm.differential(venv, part)
        traces += res["traces"]
        steps += res["exercised"]["steps"]
        failures += res["failures"]
        print(f"  pd: {len(part)} traces, {len(res['failures'])} differ", flush=True)
    return {"traces": traces, "steps": steps, "failures": failures}


def run_lookahead(venv: str, seeds: list[int], chunk: int) -> dict:
    """One run of the script per seed, each drawing ``chunk`` traces from its seed."""
    failures, traces, steps = [], 0, 0
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
        found = re.search(r"(\d+) steps", last)
        steps += int(found.group(1)) if found else 0
        print(f"  lookahead: seed {seed}, {chunk} traces: {last[:160]}", flush=True)
        if proc.returncode != 0:
            failures.append({"seed": seed, "first": last})
            break
    return {"traces": traces, "steps": steps, "failures": failures}


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
    failures, steps = [], 0
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
                steps += v["steps"]
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
    return {"traces": len(seeds), "steps": steps, "failures": failures}


def run_fleet(venv: str, seeds: list[int], chunk: int) -> dict:
    """Per seed: ``random_trace(seed)`` through a fleet under sequential arrival, its replica
    count, router, block size and pool drawn from a stream of its own; every replica's sub-trace
    through vLLM's Scheduler must give each request the same hit and the same totals."""
    from bench.bench_replay import run_vllm, vllm_job
    from paged_kv_lab.fleet.router import policies
    from paged_kv_lab.fleet.trace_fleet import trace_fleet
    from paged_kv_lab.workloads.replay import replay_settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    failures, replicas_compared, steps, hit_tokens = [], 0, 0, 0
    with tempfile.TemporaryDirectory(prefix="many-seed-fleet-") as tmp:
        for part in chunks(seeds, chunk):
            fleets, jobs, where = {}, [], []
            for seed in part:
                path = os.path.join(tmp, f"{seed}.jsonl")
                random_trace(seed, path)
                trace = load_trace(path)
                rng = random.Random(f"fleet {seed}")  # the trace's own draws stay as they were
                bs = rng.choice([16, 64])
                overrides = {
                    "block_size": bs,
                    "num_gpu_blocks": rng.randint(10_000, 30_000) // bs,
                    "max_num_seqs": rng.choice([2, 8]),
                }
                settings = replay_settings(trace, overrides)
                fleet = trace_fleet(trace, settings, rng.randint(2, 4), rng.choice(policies()))
                fleet.run()
                fleets[seed] = fleet
                for j, routed in enumerate(fleet.routed):
                    if routed:
                        job = vllm_job(path, settings, None, settings.engine.max_model_len)
                        job["indices"] = list(routed)
                        jobs.append(job)
                        where.append((seed, j))
            theirs = dict(zip(where, run_vllm({"jobs": jobs}, venv, timeout=3600)))
            for (seed, j), v in theirs.items():
                r, routed = fleets[seed].replicas[j], fleets[seed].routed[j]
                totals = r.kv_cache_manager.prefix_cache_totals
                got = ([r.hit_tokens[i] for i in routed], (totals.queries, totals.hits))
                want = (v["hit_tokens"], (v["totals"]["queries"], v["totals"]["hits"]))
                replicas_compared += 1
                steps += v["steps"]
                hit_tokens += totals.hits
                if got != want:
                    failures.append(
                        {
                            "seed": seed,
                            "replica": j,
                            "ours": str(got)[:300],
                            "vllm": str(want)[:300],
                        }
                    )
            print(f"  fleet: {len(part)} traces, {len(failures)} differ", flush=True)
    return {
        "traces": len(seeds),
        "replicas": replicas_compared,
        "steps": steps,
        "hit_tokens": hit_tokens,
        "failures": failures,
    }


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
        run = {
            "replay": run_replay,
            "hybrid": run_hybrid,
            "offload": run_offload,
            "offload_scheduler": run_offload_scheduler,
            "pd": run_pd,
            "lookahead": run_lookahead,
            "fleet": run_fleet,
        }[name]
        res = run(venv, seeds, args.chunk)
        res["seconds"] = round(time.time() - start)
        results[name] = res
        steps = f" ({res['steps']} steps)" if res.get("steps") else ""
        n = len(res["failures"])
        print(f"{name}: {res['traces']} traces{steps}, {n} differ, {res['seconds']} s")
        for f in res["failures"][:5]:
            print(f"  differs: {f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"master_seed": master, **results}, fh, indent=1)
    return 1 if any(r["failures"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
