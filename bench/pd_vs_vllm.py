"""Prefill here, decode there, against vLLM 0.34.0's own Scheduler with its own NixlConnector.

Each trace is a few requests over three shared prefixes, arriving one after another. Our P/D
pair runs it (paged_kv_lab/disagg/pd.py: two kvcore engines with our NixlConnector, a stand-in
model, a worker that pulls in the step it was told to). Every step either replica took is then
replayed, in the same order, on two of vLLM's own ``Scheduler``\\ s built from a real
``VllmConfig`` whose ``kv_transfer_config`` names vLLM's ``NixlConnector`` (its pull-mode
scheduler half; ``kv_producer`` for prefill, ``kv_consumer`` for decode), with the same
requests, the same sampled tokens and a fake worker that reports what ours reported
(``finished_sending``, ``finished_recving``, ``failed_recving``, ``invalid_block_ids``): the
transfers are the worker's, everything else vLLM decides itself. A request goes to vLLM's
decode scheduler with the ``kv_transfer_params`` vLLM's prefill scheduler returned for it, as the
proxy does. Per step both sides must agree on:

- ``scheduled``: the tokens each request computes;
- ``pulls``: the decode blocks each pull fills and the prefill blocks it reads;
- ``params``: what a finished prefill request hands over (remote block ids, token count);
- ``tables``: the block table of every request the scheduler holds (one waiting for its K/V,
  one finished whose blocks wait for the reader, included);
- ``status`` and ``computed``: each held request's status and computed tokens;
- ``free_queue``: the free queue, head to tail; ``cached``: the blocks with a hash (so the
  delayed caching of pulled blocks shows).

Some traces make pulls fail (``kv_load_failure_policy`` "recompute" or "fail"); some cap the
loads in flight (vLLM 0.34's ``max_num_inflight_kv_loads``: 1, 2 or 3), so that a pull may
start while the decode replica's running batch is full.

vLLM runs in a worker process under the Python of a scratch environment with the real
vllm==0.34.0 (``bash scripts/vllm_env.sh``; ``VLLM_VENV`` names it):

    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/pd_vs_vllm.py              # 200 traces
    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/pd_vs_vllm.py --traces 20 --json out.json

Without ``VLLM_VENV`` it says how to make one and exits 0 (skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from typing import Any

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if REPO not in sys.path:
    sys.path.insert(0, REPO)

VLLM_VERSION = "0.34.0"
ASPECTS = ("scheduled", "pulls", "params", "tables", "status", "computed", "free_queue", "cached")


# -- the traces and our side -------------------------------------------------------------------
def random_case(seed: int) -> dict[str, Any]:
    """Requests over three shared prefixes, one arriving every few ticks, two small pools."""
    rng = random.Random(seed)
    block_size = rng.choice([2, 4, 8])
    prefixes = [[rng.randrange(1000) for _ in range(6 * block_size)] for _ in range(3)]
    requests, tick = [], 0
    for i in range(rng.randint(3, 9)):
        n = rng.randint(2, 5 * block_size + 1)
        tail = [rng.randrange(1000) for _ in range(rng.randint(0, 3))]
        prompt = (prefixes[rng.randrange(3)][:n] + tail)[: 6 * block_size]
        # prompt and answer fit the smallest pool (7 usable blocks): a request that can never
        # fit is aborted here and waits forever in vLLM (docs/fidelity.md)
        max_tokens = min(rng.randint(1, 5), 7 * block_size - len(prompt))
        requests.append(
            {"id": f"R{i}", "prompt": prompt, "max_tokens": max_tokens, "arrival": tick}
        )
        tick += rng.randint(0, 4)
    failing = rng.random() < 0.4
    # vLLM 0.34's cap on in-flight loads, from a stream of its own (the other draws stay as
    # they were): set, the decode replica's pulls may start while its running batch is full
    inflight = random.Random(f"inflight/{seed}").choice([None, None, 1, 2, 3])
    if inflight:  # arrivals closer together, so that pulls wait for a full batch
        for r in requests:
            r["arrival"] //= 4
    return {
        "seed": seed,
        "block_size": block_size,
        "prefill_blocks": rng.randint(8, 16),
        "decode_blocks": rng.randint(8, 16),
        "max_num_seqs": rng.choice([1, 2, 4]),
        "requests": requests,
        "kv_load_failure_policy": rng.choice(["recompute", "fail"]),
        "fail_loads": [r["id"] for r in requests if failing and rng.random() < 0.5],
        "max_num_inflight_kv_loads": inflight,
    }


def _settings(case: dict, num_gpu_blocks: int):
    from paged_kv_lab.run.scenario import EngineSettings

    return EngineSettings(
        block_size=case["block_size"],
        num_gpu_blocks=num_gpu_blocks,
        max_num_seqs=case["max_num_seqs"],
        hash_algo="sha256",
        max_num_inflight_kv_loads=case.get("max_num_inflight_kv_loads"),
    )


def pd_engine(case: dict[str, Any]):
    """Our P/D pair for the trace (a PDEngine, not yet stepped)."""
    from paged_kv_lab.disagg.pd import DECODE, PREFILL, PDEngine
    from paged_kv_lab.run.engine import NoModelRunner
    from paged_kv_lab.run.scenario import RequestSpec, Scenario

    sc = Scenario(
        name=f"pd-{case['seed']}",
        engine=_settings(case, max(case["prefill_blocks"], case["decode_blocks"])),
        requests=tuple(
            RequestSpec(
                id=r["id"],
                prompt_token_ids=tuple(r["prompt"]),
                max_tokens=r["max_tokens"],
                arrival_step=r["arrival"],
                ignore_eos=True,
            )
            for r in case["requests"]
        ),
    )
    return PDEngine(
        sc,
        runner_factory=NoModelRunner,
        debug=True,
        kv_load_failure_policy=case["kv_load_failure_policy"],
        fail_loads=tuple(case["fail_loads"]),
        pool_sizes={PREFILL: case["prefill_blocks"], DECODE: case["decode_blocks"]},
    )


def our_run(case: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """(the replay script, our observations), one entry per step of either replica."""
    pd = pd_engine(case)
    script: list[dict] = []
    seen: list[dict] = []
    for name, eng in pd.engines.items():
        _hook(name, eng, script, seen)
    while pd.has_unfinished() and pd.tick < 1000:
        pd.step()
    assert not pd.has_unfinished(), f"trace {case['seed']} did not finish"
    return script, seen


def _hook(name: str, eng, script: list[dict], seen: list[dict]) -> None:
    """Record every EngineCore step of ``eng``: what to replay and what we saw after it."""
    core = eng.engine_core
    core_step, kv_finish = core.step, core._kv_finish
    known: set[str] = set()
    report: dict[str, Any] = {}

    def kv_finish_and_keep(out):
        kv_out = kv_finish(out)
        report["kv"] = {
            "finished_sending": sorted(kv_out.finished_sending or ()),
            "finished_recving": sorted(kv_out.finished_recving or ()),
            "failed_recving": sorted(kv_out.failed_recving),
            "invalid_block_ids": sorted(kv_out.invalid_block_ids),
        }
        return kv_out

    def step():
        report.clear()
        params_out = eng.kv_connector.connector_scheduler.kv_transfer_params_out
        before = set(params_out)
        done = core_step()
        out = done.scheduler_output
        arrivals = [
            {"id": rid, "prompt": list(r.prompt_token_ids), "max_tokens": r.max_tokens}
            for rid, r in eng.requests.items()
            if rid not in known
        ]
        known.update(eng.requests)
        script.append(
            {
                "replica": name,
                "arrivals": arrivals,
                "new_tokens": {k: list(v) for k, v in done.new_tokens.items()},
                "kv": report.get("kv"),
            }
        )
        md = out.kv_connector_metadata
        seen.append(
            _observe(
                eng.scheduler,
                out.num_scheduled_tokens,
                {
                    rid: [list(m.local_block_ids), list(m.remote.block_ids)]
                    for rid, m in md.reqs_to_recv.items()
                },
                {
                    rid: [p["remote_block_ids"], p["remote_num_tokens"]]
                    for rid, p in params_out.items()
                    if rid not in before
                },
            )
        )
        seen[-1]["num_running"] = report["num_running"]
        return done

    sched = eng.scheduler
    schedule = sched.schedule

    def schedule_and_count():
        out = schedule()
        report["num_running"] = len(sched.running)  # the batch as scheduled, before it ends
        return out

    core.step, core._kv_finish = step, kv_finish_and_keep
    sched.schedule = schedule_and_count


def _observe(scheduler, scheduled, pulls, params) -> dict:
    """What both sides compare after a step (works on vLLM's Scheduler and on ours)."""
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    return {
        "scheduled": dict(scheduled),
        "pulls": pulls,
        "params": params,
        "tables": {rid: list(kvm.get_block_ids(rid)[0]) for rid in sorted(scheduler.requests)},
        "status": {rid: r.status.name for rid, r in sorted(scheduler.requests.items())},
        "computed": {rid: r.num_computed_tokens for rid, r in sorted(scheduler.requests.items())},
        "free_queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "cached": [b.block_id for b in pool.blocks if b.block_hash is not None],
    }


# -- vLLM's side (runs under vLLM's interpreter) ------------------------------------------------
def _vllm_scheduler(case: dict, num_blocks: int, role: str):
    """vLLM 0.34.0's Scheduler as its engine builds it, with vLLM's NixlConnector."""
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    from bench.vllm_tiny_model import one_layer_scheduler, tiny_model_folder

    bs = case["block_size"]
    # the folder is read while the config and the Scheduler are built
    with tiny_model_folder(1 << 16, prefix="vllm-pd-") as folder:
        config = VllmConfig(
            model_config=ModelConfig(
                model=folder, skip_tokenizer_init=True, max_model_len=1 << 16, dtype="float32"
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=case["max_num_seqs"],
                max_num_batched_tokens=256,
                max_model_len=1 << 16,
                enable_chunked_prefill=True,
                is_encoder_decoder=False,
                max_num_inflight_kv_loads=case.get("max_num_inflight_kv_loads"),
            ),
            cache_config=CacheConfig(
                block_size=bs, enable_prefix_caching=True, prefix_caching_hash_algo="sha256"
            ),
            device_config=DeviceConfig(device="cpu"),
            kv_transfer_config=KVTransferConfig(
                kv_connector="NixlConnector",
                kv_role=role,
                kv_load_failure_policy=case["kv_load_failure_policy"],
                engine_id=role,
            ),
        )
        return one_layer_scheduler(config, num_blocks, bs)


def vllm_replay(case: dict[str, Any], script: list[dict]) -> list[dict]:
    """The script replayed on vLLM's two Schedulers."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(case["block_size"], sha256)
    scheds = {
        "prefill": _vllm_scheduler(case, case["prefill_blocks"], "kv_producer"),
        "decode": _vllm_scheduler(case, case["decode_blocks"], "kv_consumer"),
    }
    handed: dict[str, dict] = {}  # what vLLM's prefill side returned, by request
    seen = []
    for step in script:
        name = step["replica"]
        sched = scheds[name]
        for a in step["arrivals"]:
            params = {"do_remote_decode": True} if name == "prefill" else handed.pop(a["id"])
            sp = SamplingParams(
                max_tokens=a["max_tokens"],
                ignore_eos=True,
                extra_args={"kv_transfer_params": params},
            )
            sched.add_request(Request(a["id"], a["prompt"], sp, None, block_hasher=hasher))
        out = sched.schedule()
        md = out.kv_connector_metadata
        pulls = {
            rid: [
                list(m.local_block_ids[0]) if m.local_block_ids else [],
                list(m.remote.block_ids[0]),
            ]
            for rid, m in md.reqs_to_recv.items()
        }
        ids = list(out.num_scheduled_tokens)
        kv = step["kv"]
        if kv is not None or ids:
            kv_out = None
            if kv is not None:
                # sorted lists for sets: vLLM walks them in their iteration order (it varies
                # with PYTHONHASHSEED); ours walks them sorted, one of the orders vLLM can take
                kv_out = KVConnectorOutput(
                    finished_sending=list(kv["finished_sending"]) or None,
                    finished_recving=list(kv["finished_recving"]) or None,
                    failed_recving=set(kv["failed_recving"]),
                    invalid_block_ids=set(kv["invalid_block_ids"]),
                )
            mro = ModelRunnerOutput(
                req_ids=ids,
                sampled_token_ids=[step["new_tokens"].get(r, []) for r in ids],
                kv_connector_output=kv_out,
            )
            outputs = sched.update_from_output(out, mro)
        else:
            outputs = {}
        params = {}
        for eco in outputs.values():
            for o in eco.outputs:
                if o.kv_transfer_params is not None and name == "prefill":
                    p = dict(o.kv_transfer_params)
                    handed[o.request_id] = p
                    ids_ = p["remote_block_ids"]
                    params[o.request_id] = [list(ids_[0]) if ids_ else [], p["remote_num_tokens"]]
        seen.append(_observe(sched, out.num_scheduled_tokens, pulls, params))
    return seen


def worker_main() -> None:
    jobs = json.load(sys.stdin)
    results = []
    for job in jobs:
        try:
            results.append({"seen": vllm_replay(job["case"], job["script"])})
        except AssertionError as e:
            results.append({"error": f"AssertionError: {e}"})
    json.dump(results, sys.stdout)


# -- comparing -----------------------------------------------------------------------------------
def compare(ours: list[dict], theirs: dict) -> dict[str, Any]:
    """Per aspect, steps checked and steps that differ (with the first difference)."""
    report: dict[str, Any] = {a: {"steps": 0, "differ": 0} for a in ASPECTS}
    if "error" in theirs:
        report["error"] = theirs["error"]
        return report
    for i, (a, b) in enumerate(zip(ours, theirs["seen"])):
        for aspect in ASPECTS:
            report[aspect]["steps"] += 1
            if a[aspect] != b[aspect]:
                report[aspect]["differ"] += 1
                report.setdefault(
                    "first", f"step {i + 1} {aspect}: ours {a[aspect]} vLLM {b[aspect]}"
                )
    if len(ours) != len(theirs["seen"]):
        report["error"] = f"{len(ours)} steps here, {len(theirs['seen'])} in vLLM"
    return report


def run_vllm(venv: str, jobs: list[dict]) -> list[dict]:
    proc = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-I", os.path.abspath(__file__), "--worker"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM's side failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def differential(venv: str, seeds: list[int]) -> dict[str, Any]:
    """Run the traces on both sides; totals per aspect, and what was exercised."""
    jobs, ours = [], []
    for seed in seeds:
        case = random_case(seed)
        script, seen = our_run(case)
        jobs.append({"case": case, "script": script})
        ours.append(seen)
    theirs = run_vllm(venv, jobs)
    totals: dict[str, Any] = {a: {"steps": 0, "differ": 0} for a in ASPECTS}
    failures = []
    exercised = dict.fromkeys(
        (
            "steps",
            "pulls",
            "blocks_pulled",
            "partial_pulls",
            "held_steps",
            "failed_pulls",
            "pulls_while_full",
        ),
        0,
    )
    for seed, mine, job, other in zip(seeds, ours, jobs, theirs):
        rep = compare(mine, other)
        for a in ASPECTS:
            totals[a]["steps"] += rep[a]["steps"]
            totals[a]["differ"] += rep[a]["differ"]
        if "error" in rep or "first" in rep:
            failures.append({"seed": seed, **{k: rep[k] for k in ("error", "first") if k in rep}})
        for s, sc in zip(mine, job["script"]):
            exercised["steps"] += 1
            exercised["pulls"] += len(s["pulls"])
            exercised["blocks_pulled"] += sum(len(local) for local, _ in s["pulls"].values())
            exercised["partial_pulls"] += sum(
                0 < len(local) < len(remote) for local, remote in s["pulls"].values()
            )
            exercised["held_steps"] += any(st.startswith("FINISHED") for st in s["status"].values())
            exercised["failed_pulls"] += len((sc["kv"] or {}).get("failed_recving", ()))
            # a pull started in a step whose running batch was full (needs the 0.34 cap)
            exercised["pulls_while_full"] += bool(s["pulls"]) and (
                s["num_running"] >= job["case"]["max_num_seqs"]
            )
    return {"traces": len(seeds), "aspects": totals, "exercised": exercised, "failures": failures}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="the first trace's seed")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main()
        return 0
    venv = os.environ.get("VLLM_VENV")
    if not venv or not os.path.exists(os.path.join(venv, "bin", "python")):
        print(
            f"skipped: no vLLM {VLLM_VERSION} environment (VLLM_VENV={venv or 'unset'}).\n"
            "make one with:  bash scripts/vllm_env.sh   then  VLLM_VENV=/tmp/vllm034-venv ..."
        )
        return 0
    res = differential(venv, list(range(args.seed, args.seed + args.traces)))
    print(f"{res['traces']} random traces, our P/D pair vs vLLM {VLLM_VERSION}'s Schedulers")
    for a, t in res["aspects"].items():
        print(f"  {a:12s} {t['steps'] - t['differ']:6d} / {t['steps']:6d} steps equal")
    ex = res["exercised"]
    print(
        f"  exercised: {ex['steps']} steps, {ex['pulls']} pulls ({ex['blocks_pulled']} blocks, "
        f"{ex['partial_pulls']} past a decode-side hit), {ex['held_steps']} steps with finished "
        f"requests' blocks held for the reader, {ex['failed_pulls']} failed pulls, "
        f"{ex['pulls_while_full']} steps starting a pull while the running batch was full "
        "(max_num_inflight_kv_loads)"
    )
    for f in res["failures"][:10]:
        print(f"  differs: {f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
