"""The paged engine's greedy tokens equal transformers' own generate on the same weights.

Alone, batched, with prefix hits (full-block and mid-block boundaries), after
preemption, with chunked prefill, odd block sizes and sliding windows. The tiny
model always; the real SmolLM2 in the slow set for single requests and the block sizes (its
other scenarios are tests/kvcore/test_model_runner.py's, tokens and logits).
"""

import pytest

from kvcore.model import reference_model
from support.models import P, check_equal, greedy_no_eos, req, run_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# On SmolLM2, tests/kvcore/test_model_runner.py runs these scenarios with the paged runner watched
# and holds every sampled position's logits to a full transformers forward as well as the tokens
# to generate's: batched prefills with chunked ones joining decodes
# (test_smollm2_batched_mixed_chunked), a hit mid-block then a preemption and its recompute
# (test_smollm2_prefix_reuse_and_preemption), a sliding window on every layer and on every other
# (test_smollm2_sliding_window_and_hybrid). Here they run on the tiny model only.
TINY_ONLY = pytest.mark.parametrize("loaded", ["tiny"], indirect=True)


def test_single_requests(loaded):
    for n_prompt in (5, 13, 21):
        reqs = [req("A", P[:n_prompt], 10)]
        eng, _ = run_engine(loaded, reqs, block_size=4, num_gpu_blocks=16)
        check_equal(loaded, eng, reqs)


@TINY_ONLY
def test_batched_requests_of_different_lengths(loaded):
    reqs = [
        req("A", P[:3], 9),
        req("B", P[2:17], 7),
        req("C", P[5:21], 12),
        req("D", P[:11][::-1], 8),
    ]
    eng, kinds = run_engine(loaded, reqs, block_size=16, num_gpu_blocks=16)
    check_equal(loaded, eng, reqs)
    first = eng.history[0]
    assert len(first.scheduled) == 4  # all four prefills in one packed forward


@TINY_ONLY
def test_prefix_hits_full_block_and_mid_block(loaded):
    a = req("A", P[:21], 6)
    b = req("B", P[:16] + [3, 1, 4, 1, 5], 6, arrival_step=2)  # shares 4 full blocks
    c = req("C", P[:18] + [2, 7, 1, 8], 6, arrival_step=2)  # diverges mid-block: 4 blocks hit
    eng, kinds = run_engine(loaded, [a, b, c], block_size=4, num_gpu_blocks=40)
    hits = {
        e.request_id: e.num_tokens for r in eng.history for e in r.events if e.kind == "cache_hit"
    }
    assert hits == {"B": 16, "C": 16}
    check_equal(loaded, eng, [a, b, c])


@TINY_ONLY
def test_preemption_and_recompute(loaded):
    # ignore_eos so every request decodes long enough to run the pool dry
    reqs = [
        req("A", P[:9], 14, ignore_eos=True),
        req("B", P[3:12], 14, ignore_eos=True),
        req("C", P[6:15], 14, ignore_eos=True),
    ]
    eng, kinds = run_engine(loaded, reqs, block_size=4, num_gpu_blocks=13)
    assert "preempted" in kinds and "resumed" in kinds
    outs = eng.outputs()
    for spec in reqs:
        assert outs[spec.id]["token_ids"] == greedy_no_eos(
            loaded.model, spec.prompt_token_ids, spec.max_tokens
        )


@TINY_ONLY
def test_chunked_prefill(loaded):
    reqs = [req("A", P[:21], 8), req("B", P[:7], 8)]
    eng, kinds = run_engine(loaded, reqs, block_size=4, num_gpu_blocks=30, max_num_batched_tokens=8)
    chunks = [
        e for r in eng.history for e in r.events if e.kind == "scheduled" and e.phase == "chunk"
    ]
    assert chunks, "the long prompt should have been split over steps"
    check_equal(loaded, eng, reqs)


@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_block_sizes(loaded, block_size):
    reqs = [req("A", P[:13], 7), req("B", P[:13], 5, arrival_step=1)]
    eng, _ = run_engine(loaded, reqs, block_size=block_size, num_gpu_blocks=64)
    check_equal(loaded, eng, reqs)


@TINY_ONLY
def test_sliding_window_all_layers(loaded):
    reqs = [req("A", P[:21], 10), req("B", P[:21], 6, arrival_step=14)]
    eng, kinds = run_engine(loaded, reqs, block_size=4, num_gpu_blocks=24, sliding_window=8)
    assert "window_skipped" in kinds
    # every table slot before the window is the null block
    snap = eng.history[5].snapshot
    table = snap.request("A").block_tables[0]
    assert table[0] == 0
    check_equal(loaded, eng, reqs, ref=reference_model(loaded, 8, None))


@TINY_ONLY
def test_sliding_window_hybrid_layers(loaded):
    n = loaded.config.num_hidden_layers
    types = ["full_attention" if i % 2 == 0 else "sliding_attention" for i in range(n)]
    reqs = [req("A", P[:21], 10), req("B", P[:21], 6, arrival_step=14)]
    eng, kinds = run_engine(
        loaded, reqs, block_size=4, num_gpu_blocks=40, sliding_window=8, layer_types=types
    )
    assert "window_skipped" in kinds
    snap = eng.history[3].snapshot
    assert len(snap.request("A").block_tables) == 2  # one table per KV cache group
    check_equal(loaded, eng, reqs, ref=reference_model(loaded, 8, types))
