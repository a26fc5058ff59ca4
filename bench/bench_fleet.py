"""A fleet of replicas (paged_kv_lab/fleet) against vLLM 0.34.0's Scheduler and Dynamo's mocker.

    .venv/bin/python bench/bench_fleet.py --vllm --requests 300          # per-replica equality
    .venv/bin/python bench/bench_fleet.py --dynamo --requests 300        # side by side with Dynamo
    ... --replicas 4 --num-gpu-blocks 4000 --block-size 512 --json out.json

- ``--vllm``: a fleet under sequential arrival (each router in ``--routers``); every replica's
  requests, in trace order, go through vLLM 0.34.0's own Scheduler / KVCacheManager / BlockPool
  (bench/bench_replay.py's driver, ``VLLM_VENV``, default /tmp/vllm034-venv); every request's hit
  tokens and each replica's PrefixCacheStats totals must be identical.
- ``--dynamo``: the same trace, workers and pool through Dynamo's mocker
  (``dynamo._core.run_mocker_trace_replay``, ai-dynamo-runtime 1.6.1 in ``DYNAMO_VENV``, default
  /tmp/dynamo-venv: ``python -m venv /tmp/dynamo-venv && /tmp/dynamo-venv/bin/pip install
  ai-dynamo-runtime==1.6.1``), round robin and its KV router with ``KvRouterConfig()``'s
  defaults, beside our fleet under timestamps arrival with round robin, ``dynamo`` and
  ``prefix``. Reported: each run's wall time, prefix reuse (tokens reused / prompt tokens) on both
  sides, how many requests each worker got, and our wall and CPU time over Dynamo's (round robin
  against its round robin, ``dynamo`` against the median of its KV router's runs). Skipped, with the
  reason, when the environment is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def dynamo_venv() -> str | None:
    venv = os.environ.get("DYNAMO_VENV", "/tmp/dynamo-venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.isfile(py):
        return None
    ok = subprocess.run([py, "-c", "import dynamo._core"], capture_output=True, timeout=120)
    return venv if ok.returncode == 0 else None


def _dynamo_worker(job: dict) -> dict:
    """Runs under Dynamo's interpreter: the mocker on the trace, one result per router mode."""
    from dynamo._core import KvRouterConfig, run_mocker_trace_replay

    out = {}
    modes = ["round_robin"] + [f"kv_router#{i}" for i in range(job["runs"])]
    for name in modes:
        mode = name.split("#")[0]
        kw = dict(
            extra_engine_args={
                "engine": {"num_gpu_blocks": job["num_gpu_blocks"], "block_size": job["block_size"]}
            },
            num_workers=job["replicas"],
            router_mode=mode,
            trace_block_size=job["trace_block_size"],
            capture_per_request=True,
        )
        if mode == "kv_router":
            kw["router_config"] = KvRouterConfig()
        t0, c0 = time.perf_counter(), time.process_time()
        r = run_mocker_trace_replay([job["trace"]], **kw)
        cpu = time.process_time() - c0  # every thread of the process
        s = r.summary
        per = r.per_request or []
        workers = [0] * job["replicas"]
        for p in per:
            workers[p["decode_worker_idx"]] += 1
        out[name] = {
            "reused_ratio": s["prefix_cache_reused_ratio"],
            "reused_tokens": sum(p["reused_input_tokens"] for p in per),
            "input_tokens": s["total_input_tokens"],
            "mean_ttft_ms": s["mean_ttft_ms"],
            "requests_per_worker": workers,
            "wall_s": time.perf_counter() - t0,
            "cpu_s": cpu,
        }
    import importlib.metadata as md

    out["version"] = md.version("ai-dynamo-runtime")
    return out


def run_dynamo(job: dict, venv: str) -> dict:
    proc = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-I", os.path.abspath(__file__), "--dynamo-worker"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "DYN_LOG": "error", "RUST_LOG": "error"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"Dynamo worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# our router -> Dynamo's mode it is set beside (``dynamo``: its KV router's cost function)
SIDE_BY_SIDE = {"round_robin": "round_robin", "dynamo": "kv_router"}


def ratios(ours: dict, dynamo: dict) -> dict:
    """Our wall and CPU time over Dynamo's, per router that has a counterpart there (the KV
    router: its median run by wall time, its runs being unseeded). CPU time counts every thread
    of each process (Dynamo's mocker runs on a Tokio runtime), and a loaded machine disturbs it
    far less than wall time."""
    out = {}
    for policy, mode in SIDE_BY_SIDE.items():
        if policy not in ours:
            continue
        runs = sorted(
            ((v["wall_s"], v["cpu_s"]) for k, v in dynamo.items() if k.split("#")[0] == mode)
        )
        if not runs:
            continue
        wall, cpu = runs[len(runs) // 2]
        mine = ours[policy]
        out[policy] = {
            "against": mode,
            "ours_s": mine["wall_s"],
            "dynamo_s": wall,
            "ratio": mine["wall_s"] / wall,
            "ours_cpu_s": mine["cpu_s"],
            "dynamo_cpu_s": cpu,
            "cpu_ratio": mine["cpu_s"] / cpu if cpu else float("inf"),
        }
    return out


def vllm_equality(trace_path: str, trace, settings, routers, replicas) -> dict:
    from bench.bench_replay import run_vllm, vllm_job, vllm_venv
    from paged_kv_lab.fleet.trace_fleet import fleet_result, trace_fleet

    venv = vllm_venv()
    if venv is None:
        return {"skipped": "no vLLM 0.34.0 environment (bash scripts/vllm_env.sh)"}
    fleets, jobs, where = {}, [], []
    for policy in routers:
        fleet = trace_fleet(trace, settings, replicas, policy)
        fleet.run()
        fleets[policy] = fleet
        for j, routed in enumerate(fleet.routed):
            if routed:
                job = vllm_job(trace_path, settings, len(trace), settings.engine.max_model_len)
                job["indices"] = list(routed)
                jobs.append(job)
                where.append((policy, j))
    theirs = dict(zip(where, run_vllm({"jobs": jobs}, venv)))
    out = {}
    for policy, fleet in fleets.items():
        rows = []
        for j, (r, routed) in enumerate(zip(fleet.replicas, fleet.routed)):
            if not routed:
                continue
            v = theirs[(policy, j)]
            totals = r.kv_cache_manager.prefix_cache_totals
            rows.append(
                {
                    "replica": j,
                    "requests": len(routed),
                    "hit_tokens": totals.hits,
                    "vllm_hit_tokens": v["totals"]["hits"],
                    "equal": [r.hit_tokens[i] for i in routed] == v["hit_tokens"]
                    and (totals.queries, totals.hits)
                    == (v["totals"]["queries"], v["totals"]["hits"]),
                }
            )
        out[policy] = {"hit_rate": fleet_result(fleet).hit_rate, "replicas": rows}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=None)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--block-size", type=int, default=512)
    p.add_argument("--num-gpu-blocks", type=int, default=4000)
    p.add_argument("--routers", default="round_robin,prefix,dynamo")
    p.add_argument("--vllm", action="store_true")
    p.add_argument("--dynamo", action="store_true")
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--token-ms", type=float, default=0.05)
    p.add_argument("--dynamo-runs", type=int, default=3, help="KV-router runs (unseeded there)")
    p.add_argument("--json")
    p.add_argument("--dynamo-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dynamo_worker:
        print(json.dumps(_dynamo_worker(json.loads(sys.stdin.read()))))
        return 0
    import tempfile

    from paged_kv_lab.fleet.trace_fleet import fleet_replay
    from paged_kv_lab.workloads import SHIPPED_TRACE
    from paged_kv_lab.workloads.replay import replay_settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    path = args.trace or str(SHIPPED_TRACE)
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()][: args.requests]
    tmp = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    tmp.writelines(lines)
    tmp.close()
    trace = load_trace(tmp.name)
    engine = {"block_size": args.block_size, "num_gpu_blocks": args.num_gpu_blocks}
    routers = args.routers.split(",")
    report: dict = {"trace": path, "requests": len(trace), "replicas": args.replicas, **engine}
    if args.vllm:
        settings = replay_settings(trace, engine)
        report["vllm"] = vllm_equality(tmp.name, trace, settings, routers, args.replicas)
        for policy, d in report["vllm"].items():
            if policy == "skipped":
                print(f"vLLM: skipped ({d})")
                continue
            ok = all(r["equal"] for r in d["replicas"])
            print(
                f"vLLM 0.34.0, sequential, {policy}: hit rate {d['hit_rate']:.2%}; per replica "
                + ", ".join(f"{r['replica']}: {r['requests']} req" for r in d["replicas"])
                + f"; every hit equal: {ok}"
            )
    if args.dynamo:
        settings = replay_settings(
            trace, engine, arrival="timestamps", step_ms=args.step_ms, token_ms=args.token_ms
        )
        ours = {}
        for policy in routers:
            c0 = time.process_time()
            f = fleet_replay(trace, settings, args.replicas, policy)
            cpu = time.process_time() - c0
            ours[policy] = {
                "reused_ratio": f.hit_tokens / f.prompt_tokens,
                "requests_per_worker": [r.requests for r in f.replicas],
                "wall_s": f.wall_s,
                "cpu_s": cpu,
            }
            timing = f"step {args.step_ms} ms + {args.token_ms} ms/token"
            print(
                f"ours (timestamps, {timing}), {policy}: {f.wall_s:.2f} s ({cpu:.2f} s CPU), "
                f"prefix reuse "
                f"{ours[policy]['reused_ratio']:.2%}, requests per replica "
                f"{ours[policy]['requests_per_worker']}"
            )
        report["ours"] = ours
        venv = dynamo_venv()
        if venv is None:
            print("Dynamo: skipped (no ai-dynamo-runtime in DYNAMO_VENV, default /tmp/dynamo-venv)")
        else:
            job = {
                "trace": tmp.name,
                "replicas": args.replicas,
                "block_size": args.block_size,
                "num_gpu_blocks": args.num_gpu_blocks,
                "trace_block_size": trace.block_size,
                "runs": args.dynamo_runs,
            }
            d = run_dynamo(job, venv)
            report["dynamo"] = d
            for mode in [k for k in d if k != "version"]:
                m = d[mode]
                print(
                    f"Dynamo {d['version']} mocker, {mode}: {m['wall_s']:.2f} s "
                    f"({m['cpu_s']:.2f} s CPU), prefix reuse "
                    f"{m['reused_ratio']:.2%}, mean TTFT {m['mean_ttft_ms']:.0f} ms, requests per "
                    f"worker {m['requests_per_worker']}"
                )
            report["ratio"] = ratios(ours, d)
            for policy, r in report["ratio"].items():
                print(
                    f"ours / Dynamo's, {policy} against its {r['against']}: wall time "
                    f"{r['ratio']:.2f}x ({r['ours_s']:.2f} s / {r['dynamo_s']:.2f} s), CPU time "
                    f"{r['cpu_ratio']:.2f}x ({r['ours_cpu_s']:.2f} s / {r['dynamo_cpu_s']:.2f} s)"
                )
    os.unlink(tmp.name)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
