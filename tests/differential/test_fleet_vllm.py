"""Each replica of a fleet against vLLM 0.34.0's own Scheduler on the requests routed to it.

Sequential arrival: every replica sees exactly the sequential replay of its sub-trace, in trace
order, so vLLM's Scheduler / KVCacheManager / BlockPool, driven model-free by
bench/bench_replay.py on that sub-trace, must give every request the same hit tokens and the same
PrefixCacheStats totals. Skipped, with the reason, without the vLLM environment (``VLLM_VENV``,
default /tmp/vllm034-venv; ``bash scripts/vllm_env.sh`` builds it). Slow: one worker process
imports vLLM once for every case.
"""

import json

import pytest

from bench.bench_replay import run_vllm, vllm_job, vllm_venv
from paged_kv_lab.fleet.trace_fleet import fleet_result, trace_fleet
from paged_kv_lab.workloads.replay import replay_settings
from paged_kv_lab.workloads.trace_formats import load_trace
from support.paths import FIXTURES

SLICE = FIXTURES / "traces" / "mooncake_slice.jsonl"
# (engine overrides, router, added to every hash id of the slice)
CASES = {
    "prefix, block 512, evicting": ({"block_size": 512, "num_gpu_blocks": 140}, "prefix", 0),
    "dynamo, block 16": ({"block_size": 16, "num_gpu_blocks": 4200}, "dynamo", 0),
    "round robin, block 16": ({"block_size": 16, "num_gpu_blocks": 4200}, "round_robin", 0),
    # ids past 65,536: the replay's tokens once overflowed vLLM 0.34's int32 token ids there
    "dynamo, block 16, large hash ids": (
        {"block_size": 16, "num_gpu_blocks": 4200},
        "dynamo",
        10**8,
    ),
}


def shifted_slice(folder, shift: int):
    """The slice with ``shift`` added to every hash id: the same sharing, larger ids."""
    path = folder / f"slice_plus_{shift}.jsonl"
    with open(SLICE, encoding="utf-8") as src, open(path, "w", encoding="utf-8") as dst:
        for line in src:
            if line.strip():
                row = json.loads(line)
                row["hash_ids"] = [h + shift for h in row["hash_ids"]]
                dst.write(json.dumps(row) + "\n")
    return path


# one worker runs every case, so the module fixture (one vLLM process) runs once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-fleet")]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    venv = vllm_venv()
    if venv is None:
        pytest.skip(
            "no vLLM 0.34.0 environment: `bash scripts/vllm_env.sh` builds /tmp/vllm034-venv "
            "(or set VLLM_VENV)"
        )
    folder = tmp_path_factory.mktemp("fleet-traces")
    fleets, jobs, where = {}, [], []
    for name, (overrides, policy, shift) in CASES.items():
        path = shifted_slice(folder, shift) if shift else SLICE
        trace = load_trace(path)
        settings = replay_settings(trace, overrides)
        fleet = trace_fleet(trace, settings, 3, policy)
        fleet.run()
        fleets[name] = fleet
        for j, routed in enumerate(fleet.routed):
            if not routed:
                continue
            job = vllm_job(str(path), settings, None, settings.engine.max_model_len)
            job["indices"] = list(routed)
            jobs.append(job)
            where.append((name, j))
    theirs = run_vllm({"jobs": jobs}, venv, timeout=900)
    return fleets, dict(zip(where, theirs))


@pytest.mark.parametrize("case", list(CASES))
def test_each_replica_hits_what_vllm_hits_on_its_sub_trace(both, case):
    fleets, theirs = both
    fleet = fleets[case]
    assert sum(1 for routed in fleet.routed if routed) > 1
    for j, (r, routed) in enumerate(zip(fleet.replicas, fleet.routed)):
        if not routed:
            continue
        v = theirs[(case, j)]
        assert v["vllm"] == "0.34.0"
        assert [r.hit_tokens[i] for i in routed] == v["hit_tokens"]
        totals = r.kv_cache_manager.prefix_cache_totals
        assert (totals.queries, totals.hits) == (v["totals"]["queries"], v["totals"]["hits"])
    assert fleet_result(fleet).hit_tokens > 0
