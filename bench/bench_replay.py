"""Replay speed, scaling, and ours against vLLM 0.34.0's own Scheduler on the same trace.

    .venv/bin/python bench/bench_replay.py                 # the full shipped trace, bs 16 and 512
    .venv/bin/python bench/bench_replay.py --block-sizes 512 --requests 1000
    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/bench_replay.py --vllm  # + vLLM side by side
    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/bench_replay.py --equality 200 \
        --block-sizes 16
    ... --json out.json

What it reports, per block size:

- **speed**: requests/s and block operations/s of ``workload.replay`` on the trace (sequential
  arrival, replay defaults, fast-forward on and off), in CPU seconds of the process (this
  2-core machine is shared: CPU time is far steadier than wall time under load; both sides of
  the vLLM comparison are measured the same way, and the load average is printed). Block
  operations are counted in a separate, untimed run with a counting ``KVCacheObserver`` on the
  pool: blocks allocated (``get_new_blocks``), touched, freed, newly cached, evicted.
- **scaling**: the CPU time of the first quarter, half and whole trace, per request and per
  token (prompt + answer; the trace's later requests are longer, so per token is the fair unit).
- **vs vLLM** (``--vllm``): vLLM 0.34.0's own ``Scheduler`` + ``KVCacheManager`` + ``BlockPool``,
  built from a real ``VllmConfig`` (a one-layer Llama config written to a temporary folder, no
  weights, ``skip_tokenizer_init``; the same engine settings), driven model-free with the same
  tokens and the same sequential arrival in a worker process under vLLM's interpreter
  (``bash scripts/vllm_env.sh`` builds it). Reported side by side, with the ratio ours / vLLM.
- **equality** (``--equality N``): the first N requests through both; every request's hit tokens
  (vLLM's ``Request.num_cached_tokens``), preemptions and the PrefixCacheStats totals must be
  identical. tests/differential/test_replay_vllm.py runs the same check on the test slice.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if REPO not in sys.path:  # the worker runs this file isolated (-I), under vLLM's interpreter
    sys.path.insert(0, REPO)

VLLM_VERSION = "0.34.0"


# -- the vLLM side (runs under vLLM's interpreter) -------------------------------------------
def _vllm_scheduler(settings: dict, max_model_len: int):
    """vLLM 0.34.0's Scheduler as its engine builds it, for a one-layer full-attention model."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    from bench.vllm_tiny_model import one_layer_scheduler, tiny_model_folder

    bs = settings["block_size"]
    # the folder is read while the config and the Scheduler are built
    with tiny_model_folder(max_model_len, prefix="vllm-replay-") as folder:
        model = ModelConfig(
            model=folder, skip_tokenizer_init=True, max_model_len=max_model_len, dtype="float32"
        )
        sched = SchedulerConfig(
            max_num_seqs=settings["max_num_seqs"],
            max_num_batched_tokens=settings["max_num_batched_tokens"],
            max_model_len=max_model_len,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
            policy=settings["policy"],
            long_prefill_token_threshold=settings["long_prefill_token_threshold"],
            watermark=settings["watermark"],
            # True (vLLM 0.33's and 0.34's default) admits a waiting request only if its whole
            # prompt fits (our "full_sequence"); False is the older first-chunk admission.
            scheduler_reserve_full_isl=settings["admission"] == "full_sequence",
        )
        cache = CacheConfig(
            block_size=bs,
            enable_prefix_caching=settings["enable_prefix_caching"],
            prefix_caching_hash_algo=settings["hash_algo"],  # the same hashing work on both sides
        )
        config = VllmConfig(
            model_config=model,
            scheduler_config=sched,
            cache_config=cache,
            device_config=DeviceConfig(device="cpu"),
        )
        return one_layer_scheduler(config, settings["num_gpu_blocks"], bs)


def vllm_replay(job: dict) -> dict:
    """The trace through vLLM's own Scheduler, model-free, with workload.replay's arrival rules
    (sequential, or timestamps on the same integer-nanosecond step-time model); a request that
    has computed all its tokens samples PLACEHOLDER_TOKEN; ``max_tokens`` = output_length, EOS
    ignored."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    from paged_kv_lab.workloads.tokens import PLACEHOLDER_TOKEN, prompt_token_ids
    from paged_kv_lab.workloads.trace_formats import Trace, load_trace

    trace = load_trace(job["trace"])
    if job.get("requests"):
        trace = trace.slice(0, job["requests"])
    if job.get("indices") is not None:  # a sub-trace (a fleet replica's requests), trace order
        trace = Trace(
            trace.name,
            trace.format,
            trace.block_size,
            tuple(trace.requests[i] for i in job["indices"]),
        )
    s = job["settings"]
    max_model_len = job["max_model_len"]
    sched = _vllm_scheduler(s, max_model_len)
    hash_fn = get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(s["block_size"], hash_fn)
    made: dict[str, Request] = {}
    hits: dict[str, int] = {}
    preemptions: dict[str, int] = {}
    reqs = trace.requests
    t0 = time.perf_counter()
    c0 = time.process_time()
    build = 0.0
    nxt = 0
    steps = 0
    totals = {
        "requests": 0,
        "queries": 0,
        "hits": 0,
        "preempted_requests": 0,
        "preempted_queries": 0,
        "preempted_hits": 0,
    }
    arrival = job.get("arrival", "sequential")
    clock = 0
    step_ns = round(job.get("step_ms", 10.0) * 1e6)
    token_ns = round(job.get("token_ms", 0.05) * 1e6)
    due = [round(r.arrival_ms * 1e6 / job.get("speedup", 1.0)) for r in reqs]
    due = [d - min(due) for d in due]
    while nxt < len(reqs) or sched.has_unfinished_requests():
        new_reqs = []
        if arrival == "sequential":
            if nxt < len(reqs) and not sched.has_unfinished_requests():
                new_reqs.append(reqs[nxt])
                nxt += 1
        else:
            if nxt < len(reqs) and not sched.has_unfinished_requests() and due[nxt] > clock:
                clock = due[nxt]
            while nxt < len(reqs) and due[nxt] <= clock:
                new_reqs.append(reqs[nxt])
                nxt += 1
        for tr in new_reqs:
            b0 = time.perf_counter()
            req = Request(
                tr.request_id,
                prompt_token_ids(tr, trace.block_size),
                SamplingParams(max_tokens=tr.output_length, ignore_eos=True),
                None,
                arrival_time=float(tr.index),
                block_hasher=hasher,
            )
            build += time.perf_counter() - b0
            made[req.request_id] = req
            sched.add_request(req)
        out = sched.schedule()
        steps += 1
        for new in out.scheduled_new_reqs:
            # vLLM's per-request figure: the first prefill's local prefix-cache hit (a request
            # resumed after preemption comes back as a new one; its first figure stands).
            if new.req_id not in hits:
                stats = made[new.req_id].prefill_stats
                hits[new.req_id] = stats.num_local_cached_tokens
                assert stats.num_local_cached_tokens == new.num_computed_tokens
        ids = list(out.num_scheduled_tokens)
        sampled = [
            [PLACEHOLDER_TOKEN] if made[r].num_computed_tokens >= made[r].num_tokens else []
            for r in ids
        ]
        outputs = sched.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=ids,
                sampled_token_ids=sampled,
            ),
        )
        clock += step_ns + token_ns * out.total_num_scheduled_tokens
        for rid in ids:  # finished: keep its figure, let its tokens go
            if rid not in sched.requests:
                preemptions[rid] = made.pop(rid).num_preemptions
        # update_from_output hands out the step's SchedulerStats with its outputs.
        for eco in outputs.values():
            p = eco.scheduler_stats.prefix_cache_stats if eco.scheduler_stats else None
            if p is not None:
                for k in totals:
                    totals[k] += getattr(p, k)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    return {
        "vllm": __import__("vllm").__version__,
        "wall_s": wall,
        "cpu_s": cpu,
        "request_build_s": build,
        "steps": steps,
        "totals": totals,
        "hit_tokens": [hits.get(r.request_id, -1) for r in reqs],
        "num_preemptions": [preemptions.get(r.request_id, -1) for r in reqs],
    }


def run_vllm(job: dict, venv: str, timeout: float = 3600) -> dict:
    """``vllm_replay(job)`` in a worker process under ``venv``'s interpreter (``{"jobs": [...]}``:
    each of them, in one process, and the list of their results)."""
    py = os.path.join(venv, "bin", "python")
    proc = subprocess.run(
        [py, "-I", os.path.abspath(__file__), "--vllm-worker"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONHASHSEED": "0"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM worker failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out if "jobs" in job else out[0]


def vllm_venv() -> str | None:
    """The scratch environment with vLLM 0.34.0 (VLLM_VENV, else /tmp/vllm034-venv), or None."""
    venv = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")
    return venv if os.path.isfile(os.path.join(venv, "bin", "python")) else None


# -- our side ---------------------------------------------------------------------------------
def vllm_job(trace_path: str, settings, requests: int | None, max_model_len: int) -> dict:
    e = settings.engine
    return {
        "trace": os.path.abspath(trace_path),
        "requests": requests,
        "max_model_len": max_model_len,
        "arrival": settings.arrival,
        "speedup": settings.speedup,
        "step_ms": settings.step_ms,
        "token_ms": settings.token_ms,
        "settings": {
            k: getattr(e, k)
            for k in (
                "block_size",
                "num_gpu_blocks",
                "max_num_seqs",
                "max_num_batched_tokens",
                "policy",
                "long_prefill_token_threshold",
                "watermark",
                "enable_prefix_caching",
                "admission",
                "hash_algo",
            )
        },
    }


def count_block_ops(trace, settings) -> dict:
    """One untimed replay whose pool has a counting observer: the blocks each pool call
    handled (allocated, touched, freed, newly cached) and the evictions."""
    from kvcore.core.kv_cache_observer import KVCacheObserver
    from paged_kv_lab.workloads.replay import Replay

    class BlockOps(KVCacheObserver):
        allows_fast_forward = True  # skipped steps make no pool call

        def __init__(self) -> None:
            self.counts = {"allocated": 0, "touched": 0, "freed": 0, "cached": 0}

        def on_blocks_allocated(self, blocks) -> None:
            self.counts["allocated"] += len(blocks)

        def on_blocks_touched(self, blocks) -> None:
            self.counts["touched"] += len(blocks)

        def on_blocks_freed(self, blocks, to_head, to_tail) -> None:
            self.counts["freed"] += len(blocks)

        def on_blocks_cached(self, request, blocks, block_size) -> None:
            self.counts["cached"] += len(blocks)

    run = Replay(trace, settings)
    ops = BlockOps()
    run.block_pool.observer = ops
    run.advance()
    counts = dict(ops.counts, evicted=run.evictions)
    counts["total"] = sum(counts.values())
    return counts


def timed_replay(trace, settings) -> tuple[float, object]:
    """(CPU seconds, result): process time, which a machine busy with other work disturbs far
    less than wall time (both sides of every comparison are measured the same way)."""
    from paged_kv_lab.workloads.replay import replay

    c0 = time.process_time()
    result = replay(trace, settings)
    return time.process_time() - c0, result


def machine() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in load],
        "processor": platform.processor() or platform.machine(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", help="the trace (default: the shipped Mooncake trace)")
    p.add_argument("--requests", type=int, help="only the first N requests")
    p.add_argument("--block-sizes", default="16,512")
    p.add_argument("--vllm", action="store_true", help="also time vLLM's own Scheduler")
    p.add_argument("--equality", type=int, metavar="N", help="check N requests against vLLM")
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.vllm_worker:
        job = json.loads(sys.stdin.read())
        jobs = job["jobs"] if "jobs" in job else [job]
        print(json.dumps([vllm_replay(j) for j in jobs]))  # one import of vLLM for them all
        return 0

    from paged_kv_lab.run.scenario import parse_engine_overrides
    from paged_kv_lab.workloads import SHIPPED_TRACE
    from paged_kv_lab.workloads.replay import replay_settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    path = args.trace or str(SHIPPED_TRACE)
    full = load_trace(path)
    trace = full.slice(0, args.requests) if args.requests else full
    overrides = parse_engine_overrides(args.set)
    report: dict = {"trace": path, "requests": len(trace), "machine": machine(), "runs": []}
    print(f"trace {path}: {len(trace):,} requests; machine {report['machine']}")
    venv = vllm_venv()
    if (args.vllm or args.equality) and venv is None:
        print("no vLLM environment (bash scripts/vllm_env.sh builds /tmp/vllm034-venv): skipped")
    for bs in [int(x) for x in args.block_sizes.split(",")]:
        settings = replay_settings(trace, {**overrides, "block_size": bs})
        row: dict = {"block_size": bs, "num_gpu_blocks": settings.engine.num_gpu_blocks}
        if args.equality:
            sl = full.slice(0, args.equality)
            s = replay_settings(sl, {**overrides, "block_size": bs})
            row["equality"] = equality(path, sl, s, venv) if venv else None
            print(f"bs {bs}: equality over {len(sl)} requests: {row['equality']}")
            report["runs"].append(row)
            continue
        ops = count_block_ops(trace, settings)
        wall, result = timed_replay(trace, settings)
        from dataclasses import replace

        wall_noff, _ = timed_replay(trace, replace(settings, fast_forward=False))
        row.update(
            cpu_s=wall,
            cpu_s_no_fast_forward=wall_noff,
            requests_per_s=len(trace) / wall,
            block_ops=ops,
            block_ops_per_s=ops["total"] / wall,
            steps=result.steps,
            fast_forwarded_steps=result.fast_forwarded_steps,
            hit_rate=result.hit_rate,
        )
        print(
            f"bs {bs}: {wall:.1f} s CPU ({len(trace) / wall:,.0f} requests/s, "
            f"{ops['total'] / wall:,.0f} block ops/s; {ops}); "
            f"no fast-forward {wall_noff:.1f} s CPU; "
            f"hit rate {result.hit_rate:.2%}"
        )
        if not args.no_scaling:
            row["scaling"] = []
            for frac in (4, 2, 1):
                part = trace.slice(0, len(trace) // frac)
                w, _ = timed_replay(part, replay_settings(part, {**overrides, "block_size": bs}))
                tokens = part.prompt_tokens + part.output_tokens
                row["scaling"].append(
                    {
                        "requests": len(part),
                        "tokens": tokens,
                        "cpu_s": w,
                        "us_per_request": w / len(part) * 1e6,
                        "ns_per_token": w / tokens * 1e9,
                    }
                )
                print(
                    f"   scaling: {len(part):,} requests {w:.1f} s CPU "
                    f"({w / len(part) * 1e6:,.0f} us/request, "
                    f"{w / tokens * 1e9:,.0f} ns/token)"
                )
        if args.vllm and venv:
            v = run_vllm(
                vllm_job(path, settings, args.requests, settings.engine.max_model_len), venv
            )
            row["vllm_cpu_s"] = v["cpu_s"]
            row["vllm_wall_s"] = v["wall_s"]
            row["vllm_request_build_s"] = v["request_build_s"]
            row["ratio_ours_vs_vllm"] = wall / v["cpu_s"]
            row["ratio_ours_no_ff_vs_vllm"] = wall_noff / v["cpu_s"]
            row["same_hits"] = v["hit_tokens"] == [r.hit_tokens for r in result.per_request]
            print(
                f"   vLLM {v['vllm']} Scheduler: {v['cpu_s']:.1f} s CPU "
                f"({v['wall_s']:.1f} s wall); "
                f"ours/vLLM {wall / v['cpu_s']:.2f}"
                f" (no fast-forward {wall_noff / v['cpu_s']:.2f}); same hits: {row['same_hits']}"
            )
        report["runs"].append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def equality(path: str, trace, settings, venv: str) -> dict:
    """Both engines on ``trace``: per-request hit tokens, preemptions and the totals."""
    from paged_kv_lab.workloads.replay import replay

    ours = replay(trace, settings)
    v = run_vllm(vllm_job(path, settings, len(trace), settings.engine.max_model_len), venv)
    mine = [r.hit_tokens for r in ours.per_request]
    same = v["hit_tokens"] == mine
    return {
        "requests": len(trace),
        "same_hit_tokens": same,
        "same_preemptions": v["num_preemptions"] == [r.num_preemptions for r in ours.per_request],
        "same_totals": v["totals"]["hits"] == ours.hit_tokens
        and v["totals"]["queries"] == ours.queries,
        "hit_tokens": ours.hit_tokens,
        "vllm_hit_tokens": v["totals"]["hits"],
        "first_difference": next(
            (i for i, (a, b) in enumerate(zip(mine, v["hit_tokens"])) if a != b), None
        ),
    }


if __name__ == "__main__":
    sys.exit(main())
