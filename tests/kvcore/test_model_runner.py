"""The paged GPUModelRunner, driven by the real engine, against transformers on the same weights.

Each test runs a scenario through ``record.engine.Engine`` (vLLM's scheduler and block manager
decide the batches, the block tables, prefix hits, preemption and the sliding window's null
blocks) with the runner watched (tests/support/runner_tap.py: TappedRun): greedy tokens must equal
``model.generate(do_sample=False)`` and the logits of every sampled position must match a full
transformers forward within a tolerance. Blocks that sit free without a hash are overwritten
with large garbage before every forward, so reading one would show.

Measured max |logit difference| (float32, CPU, torch 2.13 / transformers 5.23):
  tiny-random : about 3.5e-6 (logits of order 1-10)    -> tolerance TOL_TINY = 5e-5
  SmolLM2-135M: about 1.3e-4 (logits of order 10-30)    -> tolerance TOL_SMOL = 1e-3
  (transformers' own drift, generate with its cache vs one full forward, is 1.5e-4 there)
The differences come only from float summation order (packed vs per-request forward, the
gathered blocks vs a contiguous cache, the runner's oneDNN-packed linear layers).
"""

from __future__ import annotations

import os

import pytest
import torch

from kvcore.model import reference_model
from kvcore.model.cpu_packing import PackedLinear
from kvcore.model.reference import reference_logits
from kvcore.utils.math_utils import cdiv
from kvcore.worker.gpu.input_batch import SeqBatchItem
from kvcore.worker.gpu.model_runner import GPUModelRunner
from support.runner_tap import TappedRun, pad_id, reference_generate, req

# oneDNN-packed linear layers are the runner's CPU path (kvcore/model/cpu_packing.py); on a GPU
# (PAGED_KV_LAB_TEST_DEVICE=cuda) the runner leaves nn.Linear as it is.
cpu_only = pytest.mark.skipif(
    os.environ.get("PAGED_KV_LAB_TEST_DEVICE", "cpu") != "cpu",
    reason="oneDNN packing is the CPU path",
)

TOL_TINY = 5e-5
TOL_SMOL = 1e-3
W = 8  # sliding window used by the window tests (prompts are longer than W)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def check(lm, ref, run: TappedRun, tol: float) -> float:
    """Every request's tokens equal transformers' greedy generate and the logits of each sampled
    position are within ``tol`` of one full forward; returns the max difference."""
    outs = run.outputs()
    worst = 0.0
    for rid, spec in run.specs.items():
        prompt = list(spec.prompt_token_ids)
        want = reference_generate(ref, prompt, spec.max_tokens, pad_id(lm))
        assert outs[rid] == want, f"{rid}: paged {outs[rid]} != transformers {want}"
        got = run.logits[rid]
        if got:
            assert len(got) == len(outs[rid]), f"{rid}: one sampled position per output token"
            diff = (torch.stack(got) - reference_logits(ref, prompt, outs[rid])).abs().max().item()
            assert diff < tol, f"{rid}: max |logit diff| {diff} >= {tol}"
            worst = max(worst, diff)
    return worst


def count_forwards(runner: GPUModelRunner) -> list[int]:
    calls = [0]

    def hook(*_):
        calls[0] += 1

    runner.model.register_forward_hook(hook)
    return calls


def hybrid_types(n_layers: int) -> list[str]:
    return ["full_attention" if i % 2 == 0 else "sliding_attention" for i in range(n_layers)]


def tables_of(run: TappedRun, group: int) -> list[list[int]]:
    return [list(it.block_tables[group]) for step in run.batches.values() for it in step]


# ----------------------------------------------------------------------------- tiny
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_single_request(tiny_model, block_size):
    lm = tiny_model
    (p,) = make_prompts(lm.config.vocab_size, [21])
    run = TappedRun(lm, [req("a", p, 12)], block_size=block_size)
    run.run()
    check(lm, lm.model, run, TOL_TINY)
    assert len(run.records) == len(run.batches) == 12  # one prefill step + 11 decode steps


def test_batched_prefill_then_decode_one_forward_per_step(tiny_model):
    lm = tiny_model
    prompts = dict(zip("abcde", make_prompts(lm.config.vocab_size, [7, 13, 21, 30, 3], seed=1)))
    run = TappedRun(lm, [req(rid, p, 10) for rid, p in prompts.items()], block_size=4)
    calls = count_forwards(run.runner)
    run.run()
    first, *rest = [run.batches[s] for s in sorted(run.batches)]
    assert [len(it.token_ids) for it in first] == [7, 13, 21, 30, 3] and all(
        it.sample for it in first
    )
    assert all(len(it.token_ids) == 1 for step in rest for it in step)
    assert len(rest[0]) == 5
    assert calls[0] == len(run.records) == 10  # all sequences of a step run in ONE forward
    check(lm, lm.model, run, TOL_TINY)


def test_prefill_mixed_with_decodes(tiny_model):
    lm = tiny_model
    ps = make_prompts(lm.config.vocab_size, [9, 14, 5, 26, 11], seed=2)
    prompts = dict(zip("abcde", ps))
    # d arrives at step 4 (26 tokens in chunks of 8 while a, b, c decode), e at step 6
    arrival = {"d": 3, "e": 5}
    run = TappedRun(
        lm,
        [req(rid, p, 10, arrival.get(rid, 0)) for rid, p in prompts.items()],
        block_size=5,
        long_prefill_token_threshold=8,
    )
    run.run()
    mixed = run.batches[4]
    assert sorted(len(it.token_ids) for it in mixed) == [1, 1, 1, 8]
    assert [it.sample for it in mixed if it.request_id == "d"] == [False]
    assert (
        run.items_of("e")[0].start_pos == 0
        and min(s for s in run.batches if any(it.request_id == "e" for it in run.batches[s])) == 6
    )
    check(lm, lm.model, run, TOL_TINY)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_chunked_prefill(tiny_model, chunk):
    lm = tiny_model
    prompts = dict(zip("ab", make_prompts(lm.config.vocab_size, [23, 10], seed=3)))
    # b decodes all along: a request alone would get the whole token budget (run/engine.py)
    run = TappedRun(
        lm,
        [req("a", prompts["a"], 8), req("b", prompts["b"], 30)],
        block_size=4,
        long_prefill_token_threshold=chunk,
    )
    run.run()
    starts = [it.start_pos for it in run.items_of("a")]
    assert starts[: -(8 - 1)] == list(range(0, 23, chunk))  # the prompt went in over several steps
    check(lm, lm.model, run, TOL_TINY)


@pytest.mark.parametrize(
    "shared_tokens", [16, 18], ids=["full-block-boundary", "diverges-mid-block"]
)
def test_prefix_reuse(tiny_model, shared_tokens):
    """B arrives once A's prompt is cached, hits A's first full blocks (their ids in its table)
    and feeds only its tail."""
    lm = tiny_model
    bs = 4
    a, tail = make_prompts(lm.config.vocab_size, [22, 9], seed=4)
    b = a[:shared_tokens] + tail
    run = TappedRun(lm, [req("a", a, 10), req("b", b, 10, arrival=1)], block_size=bs)
    run.run()  # A keeps decoding while B prefills its tail
    hit_blocks = shared_tokens // bs  # a hit covers only full blocks
    (hit,) = [e for e in run.events("cache_hit") if e.request_id == "b"]
    assert hit.num_blocks == hit_blocks
    b_items = run.items_of("b")
    assert b_items[0].start_pos == hit_blocks * bs == 16
    assert list(b_items[0].token_ids) == b[16:]
    assert list(b_items[0].block_tables[0][:hit_blocks]) == list(
        run.items_of("a")[0].block_tables[0][:hit_blocks]
    )
    check(lm, lm.model, run, TOL_TINY)


def test_recompute_after_preemption(tiny_model):
    """A pool too small for all three: one request is preempted, its freed (poisoned) blocks go
    to the others, and it later recomputes its prompt and its output so far, in chunks."""
    lm = tiny_model
    prompts = dict(zip("abc", make_prompts(lm.config.vocab_size, [13, 19, 6], seed=5)))
    run = TappedRun(
        lm,
        [req(rid, p, 12) for rid, p in prompts.items()],
        block_size=4,
        num_gpu_blocks=14,
        long_prefill_token_threshold=7,
        enable_prefix_caching=False,
    )
    run.run()
    (victim, *_) = run.events("preempted")
    rid, at = victim.request_id, next(r.step for r in run.records if victim in r.events)
    freed = set(
        next(
            it
            for s in sorted(run.batches, reverse=True)
            if s < at
            for it in run.batches[s]
            if it.request_id == rid
        ).block_tables[0]
    )
    reused = {
        b
        for s in run.batches
        if s >= at
        for it in run.batches[s]
        if it.request_id != rid
        for b in it.block_tables[0]
    } & freed
    assert reused, "the freed blocks should have been handed to other requests"
    again = [
        it for s in sorted(run.batches) if s > at for it in run.batches[s] if it.request_id == rid
    ]
    assert again[0].start_pos == 0 and len(again[0].token_ids) <= 7, (
        "recomputed from its first token"
    )
    check(lm, lm.model, run, TOL_TINY)


def test_kv_lands_in_the_slots_of_the_block_table(tiny_model):
    """pool[layer][table[p // bs], 0|1, :, p % bs, :] is K|V of position p (transformers' own
    cache)."""
    lm = tiny_model
    (p,) = make_prompts(lm.config.vocab_size, [11], seed=6)
    bs = 4
    runner = GPUModelRunner(lm, 32, bs)
    table = [7, 3, 12]
    runner.execute([SeqBatchItem("a", p, 0, (table,), True)])
    with torch.inference_mode():
        cache = lm.model(torch.tensor([p], device=lm.device), use_cache=True).past_key_values
    for layer in range(lm.config.num_hidden_layers):
        k_ref, v_ref = cache.layers[layer].keys[0], cache.layers[layer].values[0]  # [Hkv, T, D]
        for pos in range(len(p)):
            blk, off = table[pos // bs], pos % bs
            torch.testing.assert_close(
                runner.kv_caches[layer][blk, 0, :, off], k_ref[:, pos], atol=1e-5, rtol=0
            )
            torch.testing.assert_close(
                runner.kv_caches[layer][blk, 1, :, off], v_ref[:, pos], atol=1e-5, rtol=0
            )
    untouched = [b for b in range(32) if b not in table]
    assert all(runner.kv_caches[0][b].abs().sum() == 0 for b in untouched)


@pytest.mark.parametrize("block_size,chunk", [(4, 0), (5, 3), (1, 11), (16, 6)])
def test_sliding_window_all_layers(tiny_model, block_size, chunk):
    """W=8 on every layer vs MistralForCausalLM(sliding_window=8); out-of-window blocks are null."""
    lm = tiny_model
    ref = reference_model(lm, sliding_window=W)
    prompts = dict(zip("abcd", make_prompts(lm.config.vocab_size, [21, 30, 5, 17], seed=7)))
    run = TappedRun(
        lm,
        [req(rid, p, 12) for rid, p in prompts.items()],
        block_size=block_size,
        num_gpu_blocks=128,
        sliding_window=W,
        long_prefill_token_threshold=chunk,
    )
    run.run()
    if block_size < 16:
        assert any(0 in t for t in tables_of(run, 0)), "the window should have nulled some blocks"
    check(lm, ref, run, TOL_TINY)


def test_sliding_window_really_changes_the_output(tiny_model):
    """Sanity: with prompts longer than W, the window model differs from full attention."""
    lm = tiny_model
    ref = reference_model(lm, sliding_window=W)
    (p,) = make_prompts(lm.config.vocab_size, [30], seed=7)
    out = reference_generate(lm.model, p, 4, pad_id(lm))
    assert (reference_logits(ref, p, out) - reference_logits(lm.model, p, out)).abs().max() > 1e-2


@pytest.mark.parametrize("chunk", [0, 5])
def test_hybrid_full_and_sliding_layers(tiny_model, chunk):
    """Alternating full / sliding layers vs MinistralForCausalLM(layer_types=...)."""
    lm = tiny_model
    types = hybrid_types(lm.config.num_hidden_layers)
    ref = reference_model(lm, sliding_window=W, layer_types=types)
    prompts = dict(zip("abc", make_prompts(lm.config.vocab_size, [25, 12, 19], seed=8)))
    run = TappedRun(
        lm,
        [req(rid, p, 12) for rid, p in prompts.items()],
        block_size=4,
        num_gpu_blocks=128,
        sliding_window=W,
        layer_types=types,
        long_prefill_token_threshold=chunk,
    )
    assert list(run.runner.layer_group) == [0 if t == "full_attention" else 1 for t in types]
    run.run()
    assert any(0 in t for t in tables_of(run, 1))  # sliding group: nulled blocks
    assert not any(0 in t for t in tables_of(run, 0))  # full group: never
    last_a = run.items_of("a")[-1].block_tables
    assert set(last_a[0]).isdisjoint(x for x in last_a[1] if x)
    check(lm, ref, run, TOL_TINY)


def test_null_block_is_never_read(tiny_model):
    """Fill block 0 with NaN in every layer: outputs stay exact (it is never gathered)."""
    lm = tiny_model
    ref = reference_model(lm, sliding_window=W)
    prompts = dict(zip("ab", make_prompts(lm.config.vocab_size, [27, 14], seed=9)))
    run = TappedRun(
        lm,
        [req(rid, p, 10) for rid, p in prompts.items()],
        block_size=4,
        sliding_window=W,
        long_prefill_token_threshold=6,
    )
    with torch.inference_mode():
        for t in run.runner.kv_caches:
            t[0].fill_(float("nan"))
    run.run()
    check(lm, ref, run, TOL_TINY)
    assert any(0 in t for t in tables_of(run, 0)), "the tables do hold the null block"
    assert run.gathered and len(run.gathered) == len(run.batches)
    for groups in run.gathered.values():
        assert all(0 not in ids for g in groups for ids in g)


def test_execute_is_argmax_of_execute_logits(tiny_model):
    lm = tiny_model
    prompts = make_prompts(lm.config.vocab_size, [12, 20, 7], seed=10)
    outs = []
    for collect in (False, True):
        run = TappedRun(
            lm, [req(str(i), p, 8) for i, p in enumerate(prompts)], logits=collect, block_size=4
        )
        outs.append(run.run())
    assert outs[0] == outs[1]


def test_seeded_sampling_is_reproducible(tiny_model):
    lm = tiny_model
    prompts = make_prompts(lm.config.vocab_size, [12, 20], seed=11)

    def sample(seed):
        run = TappedRun(
            lm,
            [req(str(i), p, 8) for i, p in enumerate(prompts)],
            logits=False,
            block_size=4,
            seed=seed,
        )
        assert run.runner._generator is not None  # the engine's seed reached the runner
        return run.run()

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def prefix_hit_then_preemption(lm, a: list[int], b: list[int], bs: int, new: int) -> TappedRun:
    """A, then B sharing A's start (diverging mid-block) arrives and hits A's full blocks; the
    pool holds what each needs alone but not both at their longest (their lengths taken from
    transformers' own outputs), so one is preempted and recomputed."""
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) // bs
    out = {
        k: len(reference_generate(lm.model, p, new, pad_id(lm))) for k, p in (("a", a), ("b", b))
    }
    alone = max(cdiv(len(a) + out["a"], bs), cdiv(len(b) + out["b"], bs))
    run = TappedRun(
        lm,
        [req("a", a, new), req("b", b, new, arrival=1)],
        block_size=bs,
        num_gpu_blocks=1 + alone + 1,
    )
    run.run()
    hit = next(e for e in run.events("cache_hit") if e.request_id == "b")
    assert hit.num_blocks == shared > 0
    assert run.events("preempted"), "the pool is too small for both: someone is preempted"
    return run


def test_prefix_hit_then_preemption(tiny_model):
    lm = tiny_model
    a, tail = make_prompts(lm.config.vocab_size, [23, 8], seed=12)
    check(lm, lm.model, prefix_hit_then_preemption(lm, a, a[:17] + tail, 5, 10), TOL_TINY)


def test_step_without_sampling_returns_nothing(tiny_model):
    lm = tiny_model
    runner = GPUModelRunner(lm, 16, 4)
    item = SeqBatchItem("a", [5, 6, 7, 8, 9], 0, ([1, 2],), False)
    assert runner.execute([item]) == {}
    assert runner.execute([]) == {}
    assert runner.execute_logits([item]) == {}


def test_runner_leaves_the_loaded_model_alone(tiny_model):
    lm = tiny_model
    runner = GPUModelRunner(lm, 8, 4)
    assert lm.model.config._attn_implementation != runner.model.config._attn_implementation
    assert runner.model.lm_head.weight.data_ptr() == lm.model.lm_head.weight.data_ptr()
    assert runner.kv_cache_shape == (8, 2, lm.config.num_key_value_heads, 4, lm.config.head_dim)
    assert isinstance(lm.model.lm_head, torch.nn.Linear)  # packed layers live only in the runner
    assert not any(isinstance(m, PackedLinear) for m in lm.model.modules())
    again = GPUModelRunner(lm, 8, 4)
    # every runner gets the same head
    assert type(again.model.lm_head) is type(runner.model.lm_head)


@cpu_only
def test_runner_packs_every_linear_layer_once(tiny_model):
    lm = tiny_model
    runner = GPUModelRunner(lm, 8, 4)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in lm.model.modules())
    assert runner.num_packed_layers == n_linear == 7 * lm.config.num_hidden_layers + 1
    assert not any(isinstance(m, torch.nn.Linear) for m in runner.model.modules())
    again = GPUModelRunner(lm, 8, 4)
    a = runner.model.model.layers[0].mlp.down_proj
    b = again.model.model.layers[0].mlp.down_proj
    assert a.group.packed is b.group.packed  # one packed copy per weight, shared by every runner
    assert a.weight.data_ptr() == lm.model.model.layers[0].mlp.down_proj.weight.data_ptr()


@cpu_only
def test_sibling_projections_share_one_stacked_weight(tiny_model):
    layer = GPUModelRunner(tiny_model, 8, 4).model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    assert attn.q_proj.group is attn.k_proj.group is attn.v_proj.group
    assert [attn.q_proj.member, attn.k_proj.member, attn.v_proj.member] == [0, 1, 2]
    assert mlp.gate_proj.group is mlp.up_proj.group is not mlp.down_proj.group
    assert len({id(attn.o_proj.group), id(attn.q_proj.group), id(mlp.gate_proj.group)}) == 3


@cpu_only
def test_stacked_siblings_compute_what_each_linear_computes(tiny_model):
    """Whatever the call pattern -- siblings on one input, a member twice, another input in
    between -- every member returns its own F.linear of the input it was given."""
    plain = tiny_model.model.model.layers[1].self_attn
    packed = GPUModelRunner(tiny_model, 8, 4).model.model.layers[1].self_attn
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 5, plain.q_proj.in_features, generator=gen)
    y = torch.randn(1, 5, plain.q_proj.in_features, generator=gen)
    calls = [
        ("q_proj", x),
        ("k_proj", x),
        ("v_proj", x),  # the decoder layer's pattern
        ("k_proj", x),
        ("k_proj", x),  # a member twice on one input
        ("q_proj", y),
        ("v_proj", x),
        ("k_proj", y),  # inputs interleaved
        ("v_proj", y),
        ("q_proj", y),
    ]
    with torch.inference_mode():
        for name, inp in calls:
            want = torch.nn.functional.linear(inp, getattr(plain, name).weight)
            torch.testing.assert_close(getattr(packed, name)(inp), want, rtol=1e-5, atol=1e-5)


@cpu_only
def test_stacking_can_be_left_out(tiny_model):
    from kvcore.model.cpu_packing import pack_linear_layers
    from kvcore.model.reference import shared_clone

    model = shared_clone(tiny_model.model)
    assert (
        pack_linear_layers(model, stack_siblings=False)
        == 7 * tiny_model.config.num_hidden_layers + 1
    )
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.group is not attn.k_proj.group


@cpu_only
@pytest.mark.parametrize("rows", [1, 2, 8, 37])
def test_packed_linear_computes_what_linear_computes(tiny_model, rows):
    lin = tiny_model.model.model.layers[1].mlp.up_proj
    packed = PackedLinear.try_build(lin)
    assert packed is not None
    x = torch.randn(1, rows, lin.in_features, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        torch.testing.assert_close(
            packed(x), torch.nn.functional.linear(x, lin.weight), rtol=1e-5, atol=1e-5
        )


def test_packing_can_be_turned_off(tiny_model, monkeypatch):
    monkeypatch.setenv("PAGED_KV_LAB_PACKED_WEIGHTS", "0")
    runner = GPUModelRunner(tiny_model, 8, 4)
    assert runner.num_packed_layers == 0
    assert isinstance(runner.model.lm_head, torch.nn.Linear)


def test_bad_block_tables_are_refused(tiny_model):
    lm = tiny_model
    n = lm.config.num_hidden_layers
    runner = GPUModelRunner(lm, 16, 4)
    toks = list(range(10, 20))
    with pytest.raises(ValueError, match="block table"):
        runner.execute([SeqBatchItem("a", toks, 0, ([1, 2],), True)])  # needs 3 blocks
    with pytest.raises(ValueError, match="null block"):
        runner.execute([SeqBatchItem("a", toks, 0, ([1, 0, 2],), True)])
    with pytest.raises(ValueError, match="outside the pool"):
        runner.execute([SeqBatchItem("a", toks, 0, ([1, 2, 99],), True)])
    with pytest.raises(ValueError, match="twice"):
        runner.execute([SeqBatchItem("a", toks, 0, ([1, 2, 3],), True)] * 2)
    with pytest.raises(ValueError, match="KV cache groups"):
        runner.execute([SeqBatchItem("a", toks, 0, ([1, 2, 3], [4, 5, 6]), True)])
    sliding = GPUModelRunner(lm, 16, 4, [0] * n, [W])
    # next token at position 12 sees 5..12: logical block 1 (positions 4-7) may not be null
    with pytest.raises(ValueError, match="inside the sliding window"):
        sliding.execute([SeqBatchItem("a", [3], 12, ([0, 0, 2, 3],), True)])
    assert sliding.execute([SeqBatchItem("a", [3], 12, ([0, 1, 2, 3],), True)])
    with pytest.raises(ValueError, match="layer_group"):
        GPUModelRunner(lm, 16, 4, [0], [None])
    with pytest.raises(ValueError, match="group"):
        GPUModelRunner(lm, 16, 4, [0, 1] * (n // 2), [None])


# ----------------------------------------------------------------------------- SmolLM2
QUESTIONS = [
    "What is the capital of France?",
    "Name three primes.",
    "Write a haiku about the sea.",
    "Why is the sky blue?",
]


@pytest.mark.slow
def test_smollm2_batched_mixed_chunked(smollm2):
    """4 chat prompts: two prefill together, two join (chunked) at step 5 while they decode."""
    lm = smollm2
    prompts = {f"q{i}": lm.encode_prompt(q) for i, q in enumerate(QUESTIONS)}
    run = TappedRun(
        lm,
        [req(rid, p, 12, 0 if rid in ("q0", "q1") else 4) for rid, p in prompts.items()],
        block_size=16,
        long_prefill_token_threshold=16,
    )
    run.run()
    assert any(
        len(run.batches[s]) == 4 and any(not it.sample for it in run.batches[s])
        for s in run.batches
    ), "a step mixes decodes with a prefill chunk"
    worst = check(lm, lm.model, run, TOL_SMOL)
    print(f"SmolLM2 max |logit diff| {worst:.2e}")


@pytest.mark.slow
def test_smollm2_prefix_reuse_and_preemption(smollm2):
    lm = smollm2
    a = lm.encode_prompt("What is the capital of France?")
    b = lm.encode_prompt("What is the capital of Italy?")
    # block size 5 does not divide the prompts; B diverges mid-block
    check(lm, lm.model, prefix_hit_then_preemption(lm, a, b, 5, 10), TOL_SMOL)


@pytest.mark.slow
def test_smollm2_sliding_window_and_hybrid(smollm2):
    lm = smollm2
    prompts = {f"q{i}": lm.encode_prompt(q) for i, q in enumerate(QUESTIONS[:2])}
    reqs = [req(rid, p, 8) for rid, p in prompts.items()]
    run = TappedRun(
        lm,
        reqs,
        block_size=4,
        num_gpu_blocks=128,
        sliding_window=W,
        long_prefill_token_threshold=12,
    )
    run.run()
    check(lm, reference_model(lm, sliding_window=W), run, TOL_SMOL)

    types = hybrid_types(lm.config.num_hidden_layers)
    run = TappedRun(
        lm,
        reqs,
        block_size=4,
        num_gpu_blocks=128,
        sliding_window=W,
        layer_types=types,
        long_prefill_token_threshold=12,
    )
    run.run()
    check(lm, reference_model(lm, sliding_window=W, layer_types=types), run, TOL_SMOL)


@cpu_only
def test_siblings_that_cannot_stack_are_packed_one_by_one(tiny_model):
    from kvcore.model.cpu_packing import pack_linear_layers
    from kvcore.model.reference import shared_clone

    model = shared_clone(tiny_model.model)
    mlp = model.model.layers[0].mlp
    # an up_proj with a bias next to a gate_proj without one: one stacked weight cannot hold both
    up = torch.nn.Linear(mlp.up_proj.in_features, mlp.up_proj.out_features, bias=True)
    mlp.up_proj = up
    pack_linear_layers(model)
    assert isinstance(mlp.gate_proj, PackedLinear) and isinstance(mlp.up_proj, PackedLinear)
    assert mlp.gate_proj.group is not mlp.up_proj.group
    x = torch.randn(1, 4, up.in_features, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        torch.testing.assert_close(mlp.up_proj(x), up(x), rtol=1e-5, atol=1e-5)
