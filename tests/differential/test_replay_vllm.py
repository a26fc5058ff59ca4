"""The test slice replayed through vLLM 0.34.0's own Scheduler / KVCacheManager / BlockPool and
through ours: every request's hit tokens, preemptions, the PrefixCacheStats totals and the step
count must be identical.

vLLM runs in a worker process under the scratch environment ``scripts/vllm_env.sh`` builds
(``VLLM_VENV``, default /tmp/vllm034-venv), driven model-free by bench/bench_replay.py with the same
tokens and arrival rules. Skipped, with the reason, when that environment is absent. Slow: the
worker imports vLLM (about 30-60 s on the 2-core test machine), once for all the cases.
"""

import pytest

from bench.bench_replay import run_vllm, vllm_job, vllm_venv
from paged_kv_lab.workloads.replay import replay, replay_settings
from paged_kv_lab.workloads.trace_formats import load_trace
from support.paths import FIXTURES

SLICE = FIXTURES / "traces" / "mooncake_slice.jsonl"
TIGHT = {"max_num_seqs": 8, "admission": "first_chunk", "max_num_batched_tokens": 2048}
CASES = {
    "sequential, block 16": ({"block_size": 16, "num_gpu_blocks": 6000}, "sequential"),
    "sequential, block 512, evicting": ({"block_size": 512, "num_gpu_blocks": 140}, "sequential"),
    "timestamps, block 512, preempting": (
        {"block_size": 512, "num_gpu_blocks": 140, **TIGHT},
        "timestamps",
    ),
    "timestamps, block 16, preempting": (
        {"block_size": 16, "num_gpu_blocks": 4200, **TIGHT},
        "timestamps",
    ),
    "timestamps, block 16, full-sequence admission": (
        {"block_size": 16, "num_gpu_blocks": 4200, "max_num_seqs": 8},
        "timestamps",
    ),
}

# one worker runs every case, so the module fixture (one vLLM process) runs once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-replay")]


@pytest.fixture(scope="module")
def both():
    venv = vllm_venv()
    if venv is None:
        pytest.skip(
            "no vLLM 0.34.0 environment: `bash scripts/vllm_env.sh` builds /tmp/vllm034-venv "
            "(or set VLLM_VENV)"
        )
    trace = load_trace(SLICE)
    ours, jobs = {}, []
    for name, (overrides, arrival) in CASES.items():
        settings = replay_settings(trace, overrides, arrival=arrival)
        ours[name] = replay(trace, settings)
        jobs.append(vllm_job(str(SLICE), settings, None, settings.engine.max_model_len))
    theirs = run_vllm({"jobs": jobs}, venv, timeout=900)
    return ours, dict(zip(CASES, theirs))


@pytest.mark.parametrize("case", list(CASES))
def test_same_hits_preemptions_and_stats_as_vllm(both, case):
    ours, theirs = both
    mine, v = ours[case], theirs[case]
    assert v["vllm"] == "0.34.0"
    assert [r.hit_tokens for r in mine.per_request] == v["hit_tokens"]
    assert [r.num_preemptions for r in mine.per_request] == v["num_preemptions"]
    assert mine.steps == v["steps"]
    t = v["totals"]
    assert (mine.queries, mine.hit_tokens) == (t["queries"], t["hits"])
    assert (mine.preempted_requests, mine.preempted_queries, mine.preempted_hits) == (
        t["preempted_requests"],
        t["preempted_queries"],
        t["preempted_hits"],
    )


def test_the_cases_exercise_hits_evictions_and_preemptions(both):
    ours, _ = both
    assert all(r.hit_tokens > 0 for r in ours.values())
    assert ours["sequential, block 512, evicting"].evictions > 0
    assert ours["timestamps, block 512, preempting"].preemptions > 0
    assert ours["timestamps, block 16, preempting"].preempted_hits > 0
