"""tiny-hybrid (Qwen3.5's 3 gated delta-net layers + 1 full-attention layer) through the paged
engine equals transformers' own greedy generate on the same checkpoint: alone, batched, with a
prefix hit resumed from a state block, across chunked prefill, after preemption. Also: the
checkpoint ``python -m paged_kv_lab model save`` writes loads in transformers with the same weights,
and the worker's block copy moves a block's states and K/V together."""

import pytest
import torch

from kvcore.model import load_model
from support.models import P, check_equal, greedy_no_eos, req, run_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def hybrid():
    return load_model("tiny-hybrid", device="cpu")


def test_groups_are_three_state_groups_and_one_attention_group(hybrid):
    eng, _ = run_engine(hybrid, [req("A", P[:13], 10)], block_size=4, num_gpu_blocks=40)
    kinds = [g.kv_cache_spec.kind for g in eng.groups]
    assert kinds.count("mamba") == 3 and len(kinds) == 4
    assert eng.runner.state_groups == frozenset(g for g, k in enumerate(kinds) if k == "mamba")
    check_equal(hybrid, eng, [req("A", P[:13], 10)])


def test_batched_and_prefix_hit_resumes_from_a_state_block(hybrid):
    reqs = [
        req("A", P[:21], 6),
        req("B", P[:16] + [3, 1, 4, 1, 5], 6, arrival_step=2),
        req("C", P[:18] + [2, 7, 1, 8], 6, arrival_step=2),
        req("D", P[5:12], 6),
    ]
    eng, _ = run_engine(hybrid, reqs, block_size=4, num_gpu_blocks=60)
    hits = {
        e.request_id: e.num_tokens for r in eng.history for e in r.events if e.kind == "cache_hit"
    }
    assert hits and all(n % 4 == 0 for n in hits.values())
    check_equal(hybrid, eng, reqs)


def test_chunked_prefill(hybrid):
    reqs = [req("A", P[:21], 8), req("B", P[:7], 8)]
    eng, kinds = run_engine(hybrid, reqs, block_size=4, num_gpu_blocks=60, max_num_batched_tokens=8)
    assert any(e.kind == "scheduled" and e.phase == "chunk" for r in eng.history for e in r.events)
    check_equal(hybrid, eng, reqs)


def test_preemption_and_resume(hybrid):
    reqs = [
        req("A", P[:9], 14, ignore_eos=True),
        req("B", P[3:12], 14, ignore_eos=True),
        req("C", P[6:15], 14, ignore_eos=True),
    ]
    eng, kinds = run_engine(hybrid, reqs, block_size=4, num_gpu_blocks=13)
    assert "preempted" in kinds and "resumed" in kinds
    outs = eng.outputs()
    for spec in reqs:
        want = greedy_no_eos(hybrid.model, spec.prompt_token_ids, spec.max_tokens)
        assert outs[spec.id]["token_ids"] == want


def test_saved_checkpoint_loads_in_transformers_with_the_same_weights(hybrid, tmp_path):
    from transformers import AutoModelForCausalLM

    from kvcore.model.loader import save_model

    save_model("tiny-hybrid", str(tmp_path))
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path))
    assert type(ref).__name__ == "Qwen3_5ForCausalLM"
    ours, theirs = hybrid.model.state_dict(), ref.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_block_copy_moves_states_and_kv(hybrid):
    eng, _ = run_engine(hybrid, [req("A", P[:9], 2)], block_size=4, num_gpu_blocks=20)
    runner = eng.runner
    layer = next(iter(runner.state_pools.recurrent))
    src = max(range(20), key=lambda b: float(runner.state_pools.recurrent[layer][b].abs().sum()))
    dst = 19
    runner.copy_blocks([(src, dst)])
    for pools in (runner.state_pools.conv, runner.state_pools.recurrent):
        assert all(torch.equal(t[dst], t[src]) for t in pools.values())
    assert all(torch.equal(t[dst], t[src]) for t in runner.kv_caches)


def test_partial_hits_inside_a_block_with_copy_on_write(hybrid):
    """prefix_match_unit 2 with 8-token blocks, on kvcore's own Scheduler + EngineCore (the
    recorded Engine reads one hash per block): B and C hit 12 tokens of A's 13, inside A's
    second block; the scheduler hands the worker tail-block copies, and the output still
    equals transformers (without the copies it does not: checked by hand)."""
    from kvcore.core.sched.scheduler import Scheduler
    from kvcore.engine.core import EngineCore
    from kvcore.request import Request
    from kvcore.worker.gpu.model_runner import GPUModelRunner
    from paged_kv_lab.run.engine import (
        block_hasher_for,
        kv_cache_groups,
        kv_cache_manager_for,
        scheduler_config_for,
    )
    from paged_kv_lab.run.scenario import EngineSettings
    from support.models import reference_tokens

    types = tuple(hybrid.config.layer_types)
    s = EngineSettings(block_size=8, num_gpu_blocks=40, prefix_match_unit=2, layer_types=types)
    groups, layer_group = kv_cache_groups(s, len(types))
    kvm = kv_cache_manager_for(s, groups, 8192, enable_kv_cache_events=False)
    sched = Scheduler(scheduler_config_for(s, 8192), kvm)
    runner = GPUModelRunner(hybrid, 40, 8, layer_group, [g.sliding_window for g in groups])
    core = EngineCore(sched, runner)
    hasher = block_hasher_for(s)
    plan = {0: [("A", P[:13])], 3: [("B", P[:13] + [5, 6, 7]), ("C", P[:12] + [99, 98])]}
    reqs, copies, step = {}, [], 0
    while step <= max(plan) or sched.has_requests():
        for rid, ids in plan.get(step, []):
            reqs[rid] = Request(rid, list(ids), 6, eos_token_ids=(2,), block_hasher=hasher)
            sched.add_request(reqs[rid])
        copies += core.step().scheduler_output.kv_cache_block_copies or []
        step += 1
    assert copies
    assert kvm.prefix_cache_stats.hits == 24  # 12 tokens each for B and C
    for r in reqs.values():
        assert r.output_token_ids == reference_tokens(hybrid.model, r.prompt_token_ids, 6, {2})


def test_speculative_decoding_and_offload_are_refused(hybrid):
    from paged_kv_lab.run.scenario import CPUOffloadConfig, SpeculativeConfig

    with pytest.raises(ValueError, match="linear-attention"):
        run_engine(
            hybrid,
            [req("A", P[:9], 4)],
            block_size=4,
            num_gpu_blocks=20,
            cpu_offload=CPUOffloadConfig(num_cpu_blocks=8),
        )
    with pytest.raises(ValueError, match="linear-attention"):
        run_engine(
            hybrid,
            [req("A", P[:9], 4)],
            block_size=4,
            num_gpu_blocks=20,
            speculative=SpeculativeConfig(),
        )
