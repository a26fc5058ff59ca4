"""The paged ModelRunner against transformers on the same weights.

Greedy tokens must equal ``model.generate(do_sample=False)`` and the logits of every
sampled position must match a full transformers forward within a tolerance.

Measured max |logit difference| (float32, CPU, torch 2.13 / transformers 5.23):
  tiny-random : about 3.5e-6 (logits of order 1-10)    -> tolerance TOL_TINY = 5e-5
  SmolLM2-135M: about 1.3e-4 (logits of order 10-30)    -> tolerance TOL_SMOL = 1e-3
  (transformers' own drift, generate with its cache vs one full forward, is 1.5e-4 there)
The differences come only from float summation order (packed vs per-request forward, the
gathered blocks vs a contiguous cache, the runner's oneDNN-packed linear layers).

The runner is driven by tests/_mini_engine.py: MiniEngine: a trivial engine (fresh block
ids, block tables, chunked prefill, decode, prefix reuse, preemption by recompute, and
the sliding-window rule that swaps blocks wholly before ``start - W + 1`` for the null
block 0 and frees them).  Freed blocks are overwritten with large garbage, so reading
one would show.
"""

from __future__ import annotations

import pytest
import torch

from kvcore.model import ModelRunner, SeqBatchItem, reference_model
from _mini_engine import MiniEngine, reference_generate, reference_logits
from kvcore.model.cpu_packing import PackedLinear

TOL_TINY = 5e-5
TOL_SMOL = 1e-3
W = 8  # sliding window used by the window tests (prompts are longer than W)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_prompts(vocab: int, lengths, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def pad_id(lm) -> int:
    p = getattr(lm.tokenizer, "pad_token_id", None)
    return int(p) if p is not None else 0


def check(lm, ref, eng: MiniEngine, prompts: dict[str, list[int]], max_new: int, tol: float) -> float:
    """Tokens equal transformers' greedy generate; logits within ``tol``; returns the max diff."""
    outs = eng.outputs()
    worst = 0.0
    for rid, prompt in prompts.items():
        want = reference_generate(ref, prompt, max_new, pad_id(lm))
        assert outs[rid] == want, f"{rid}: paged {outs[rid]} != transformers {want}"
        got = eng.reqs[rid].logits
        if got:
            diff = (torch.stack(got) - reference_logits(ref, prompt, outs[rid])).abs().max().item()
            assert diff < tol, f"{rid}: max |logit diff| {diff} >= {tol}"
            worst = max(worst, diff)
    return worst


def engine(lm, block_size=4, windows=(None,), layer_group=None, chunk=None, num_blocks=256, seed=None,
           prefer_freed=True):
    """A MiniEngine that reuses freed (poisoned) blocks first, collecting logits."""
    n = lm.config.num_hidden_layers
    runner = ModelRunner(lm, num_blocks, block_size, layer_group or [0] * n, list(windows), seed=seed)
    return MiniEngine(runner, chunk_size=chunk, collect_logits=True, eos_ids=lm.eos_ids,
                      prefer_freed=prefer_freed)


def count_forwards(runner: ModelRunner) -> list[int]:
    calls = [0]

    def hook(*_):
        calls[0] += 1

    runner.model.register_forward_hook(hook)
    return calls


def hybrid_types(n_layers: int) -> list[str]:
    return ["full_attention" if i % 2 == 0 else "sliding_attention" for i in range(n_layers)]


# ----------------------------------------------------------------------------- tiny
@pytest.mark.parametrize("block_size", [1, 5, 16])
def test_single_request(tiny_model, block_size):
    lm = tiny_model
    (p,) = make_prompts(lm.config.vocab_size, [21])
    eng = engine(lm, block_size)
    eng.add("a", p, 12)
    eng.run()
    check(lm, lm.model, eng, {"a": p}, 12, TOL_TINY)
    assert eng.steps == 12  # one prefill step + 11 decode steps


def test_batched_prefill_then_decode_one_forward_per_step(tiny_model):
    lm = tiny_model
    prompts = dict(zip("abcde", make_prompts(lm.config.vocab_size, [7, 13, 21, 30, 3], seed=1)))
    eng = engine(lm, block_size=4)
    calls = count_forwards(eng.runner)
    for rid, p in prompts.items():
        eng.add(rid, p, 10)
    eng.run()
    first = eng.history[0]
    assert [len(it.token_ids) for it in first] == [7, 13, 21, 30, 3] and all(it.sample for it in first)
    assert all(len(it.token_ids) == 1 for step in eng.history[1:] for it in step)
    assert len(eng.history[1]) == 5
    assert calls[0] == eng.steps == 10  # all sequences of a step run in ONE forward
    check(lm, lm.model, eng, prompts, 10, TOL_TINY)


def test_prefill_mixed_with_decodes(tiny_model):
    lm = tiny_model
    ps = make_prompts(lm.config.vocab_size, [9, 14, 5, 26, 11], seed=2)
    prompts = dict(zip("abcde", ps))
    eng = engine(lm, block_size=5, chunk=8)
    for rid in "abc":
        eng.add(rid, prompts[rid], 10)
    for _ in range(3):
        eng.step()
    eng.add("d", prompts["d"], 10)  # 26 tokens in chunks of 8 while a, b, c decode
    eng.step()
    mixed = eng.history[-1]
    assert sorted(len(it.token_ids) for it in mixed) == [1, 1, 1, 8]
    assert [it.sample for it in mixed if it.request_id == "d"] == [False]
    eng.step()
    eng.add("e", prompts["e"], 10)
    eng.run()
    check(lm, lm.model, eng, prompts, 10, TOL_TINY)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_chunked_prefill(tiny_model, chunk):
    lm = tiny_model
    prompts = dict(zip("ab", make_prompts(lm.config.vocab_size, [23, 10], seed=3)))
    eng = engine(lm, block_size=4, chunk=chunk)
    for rid, p in prompts.items():
        eng.add(rid, p, 8)
    eng.run()
    starts = [it.start_pos for step in eng.history for it in step if it.request_id == "a"]
    assert starts[: -(8 - 1)] == list(range(0, 23, chunk))  # the prompt went in over several steps
    check(lm, lm.model, eng, prompts, 8, TOL_TINY)


@pytest.mark.parametrize("shared_tokens", [16, 18], ids=["full-block-boundary", "diverges-mid-block"])
def test_prefix_reuse(tiny_model, shared_tokens):
    """B reuses A's first full blocks (block ids in its table) and feeds only its tail."""
    lm = tiny_model
    bs = 4
    a, tail = make_prompts(lm.config.vocab_size, [22, 9], seed=4)
    b = a[:shared_tokens] + tail
    eng = engine(lm, block_size=bs)
    eng.add("a", a, 10)
    eng.step()  # A's prompt is in the pool
    hit_blocks = shared_tokens // bs  # a hit covers only full blocks
    eng.add("b", b, 10, prefix_of="a", prefix_blocks=hit_blocks)
    eng.run()  # A keeps decoding while B prefills its tail
    b_items = [it for step in eng.history for it in step if it.request_id == "b"]
    assert b_items[0].start_pos == hit_blocks * bs == 16
    assert b_items[0].token_ids == b[16:]
    assert b_items[0].block_tables[0][:hit_blocks] == eng.reqs["a"].tables[0][:hit_blocks]
    check(lm, lm.model, eng, {"a": a, "b": b}, 10, TOL_TINY)


def test_recompute_after_preemption(tiny_model):
    lm = tiny_model
    prompts = dict(zip("abc", make_prompts(lm.config.vocab_size, [13, 19, 6], seed=5)))
    eng = engine(lm, block_size=4, chunk=7)
    for rid, p in prompts.items():
        eng.add(rid, p, 12)
    for _ in range(6):
        eng.step()
    freed = [b for b in eng.reqs["b"].tables[0]]
    eng.preempt("b")  # free (blocks get poisoned) and redo later from scratch
    for _ in range(4):
        eng.step(["a", "c"])  # a and c go on, reusing b's freed blocks
    reused = set(eng.reqs["a"].tables[0] + eng.reqs["c"].tables[0]) & set(freed)
    assert reused, "the freed blocks should have been handed to other requests"
    eng.run()  # b recomputes prompt + its output so far, in chunks
    check(lm, lm.model, eng, prompts, 12, TOL_TINY)


def test_kv_lands_in_the_slots_of_the_block_table(tiny_model):
    """pool[layer][table[p // bs], 0|1, :, p % bs, :] is K|V of position p (transformers' own cache)."""
    lm = tiny_model
    (p,) = make_prompts(lm.config.vocab_size, [11], seed=6)
    bs = 4
    runner = ModelRunner(lm, 32, bs)
    table = [7, 3, 12]
    runner.execute([SeqBatchItem("a", p, 0, (table,), True)])
    with torch.inference_mode():
        cache = lm.model(torch.tensor([p]), use_cache=True).past_key_values
    for layer in range(lm.config.num_hidden_layers):
        k_ref, v_ref = cache.layers[layer].keys[0], cache.layers[layer].values[0]  # [Hkv, T, D]
        for pos in range(len(p)):
            blk, off = table[pos // bs], pos % bs
            torch.testing.assert_close(runner.kv_caches[layer][blk, 0, :, off], k_ref[:, pos], atol=1e-5, rtol=0)
            torch.testing.assert_close(runner.kv_caches[layer][blk, 1, :, off], v_ref[:, pos], atol=1e-5, rtol=0)
    untouched = [b for b in range(32) if b not in table]
    assert all(runner.kv_caches[0][b].abs().sum() == 0 for b in untouched)


@pytest.mark.parametrize("block_size,chunk", [(4, None), (5, 3), (1, 11), (16, 6)])
def test_sliding_window_all_layers(tiny_model, block_size, chunk):
    """W=8 on every layer vs MistralForCausalLM(sliding_window=8); out-of-window blocks are null."""
    lm = tiny_model
    ref = reference_model(lm, sliding_window=W)
    prompts = dict(zip("abcd", make_prompts(lm.config.vocab_size, [21, 30, 5, 17], seed=7)))
    eng = engine(lm, block_size=block_size, windows=[W], chunk=chunk)
    for rid, p in prompts.items():
        eng.add(rid, p, 12)
    eng.run()
    tables = [it.block_tables[0] for step in eng.history for it in step]
    if block_size < 16:
        assert any(0 in t for t in tables), "the window should have nulled some blocks"
    check(lm, ref, eng, prompts, 12, TOL_TINY)


def test_sliding_window_really_changes_the_output(tiny_model):
    """Sanity: with prompts longer than W, the window model differs from full attention."""
    lm = tiny_model
    ref = reference_model(lm, sliding_window=W)
    (p,) = make_prompts(lm.config.vocab_size, [30], seed=7)
    out = reference_generate(lm.model, p, 4, pad_id(lm))
    assert (reference_logits(ref, p, out) - reference_logits(lm.model, p, out)).abs().max() > 1e-2


@pytest.mark.parametrize("chunk", [None, 5])
def test_hybrid_full_and_sliding_layers(tiny_model, chunk):
    """Alternating full / sliding layers vs MinistralForCausalLM(layer_types=...)."""
    lm = tiny_model
    n = lm.config.num_hidden_layers
    types = hybrid_types(n)
    ref = reference_model(lm, sliding_window=W, layer_types=types)
    layer_group = [0 if t == "full_attention" else 1 for t in types]
    prompts = dict(zip("abc", make_prompts(lm.config.vocab_size, [25, 12, 19], seed=8)))
    eng = engine(lm, block_size=4, windows=[None, W], layer_group=layer_group, chunk=chunk)
    for rid, p in prompts.items():
        eng.add(rid, p, 12)
    eng.run()
    items = [it for step in eng.history for it in step]
    assert any(0 in it.block_tables[1] for it in items)      # sliding group: nulled blocks
    assert not any(0 in it.block_tables[0] for it in items)  # full group: never
    assert set(eng.reqs["a"].tables[0]).isdisjoint(x for x in eng.reqs["a"].tables[1] if x)
    check(lm, ref, eng, prompts, 12, TOL_TINY)


def test_null_block_is_never_read(tiny_model):
    """Fill block 0 with NaN in every layer: outputs stay exact (it is never gathered)."""
    lm = tiny_model
    ref = reference_model(lm, sliding_window=W)
    prompts = dict(zip("ab", make_prompts(lm.config.vocab_size, [27, 14], seed=9)))
    eng = engine(lm, block_size=4, windows=[W], chunk=6)
    with torch.inference_mode():
        for t in eng.runner.kv_caches:
            t[0].fill_(float("nan"))
    for rid, p in prompts.items():
        eng.add(rid, p, 10)
    eng.run()
    check(lm, ref, eng, prompts, 10, TOL_TINY)
    assert eng.runner.last_step is not None
    for gs in eng.runner.last_step.groups:
        assert all(0 not in ids for ids in gs.gathered_block_ids)


def test_execute_is_argmax_of_execute_logits(tiny_model):
    lm = tiny_model
    prompts = make_prompts(lm.config.vocab_size, [12, 20, 7], seed=10)
    outs = []
    for collect in (False, True):
        runner = ModelRunner(lm, 64, 4)
        eng = MiniEngine(runner, collect_logits=collect, eos_ids=lm.eos_ids)
        for i, p in enumerate(prompts):
            eng.add(str(i), p, 8)
        outs.append(eng.run())
    assert outs[0] == outs[1]


def test_seeded_sampling_is_reproducible(tiny_model):
    lm = tiny_model
    prompts = make_prompts(lm.config.vocab_size, [12, 20], seed=11)

    def sample(seed):
        eng = MiniEngine(ModelRunner(lm, 64, 4, seed=seed), eos_ids=())
        for i, p in enumerate(prompts):
            eng.add(str(i), p, 8)
        return eng.run()

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


def test_step_without_sampling_returns_nothing(tiny_model):
    lm = tiny_model
    runner = ModelRunner(lm, 16, 4)
    item = SeqBatchItem("a", [5, 6, 7, 8, 9], 0, ([1, 2],), False)
    assert runner.execute([item]) == {}
    assert runner.execute([]) == {}
    assert runner.execute_logits([item]) == {}


def test_runner_leaves_the_loaded_model_alone(tiny_model):
    lm = tiny_model
    runner = ModelRunner(lm, 8, 4)
    assert lm.model.config._attn_implementation != runner.model.config._attn_implementation
    assert runner.model.lm_head.weight.data_ptr() == lm.model.lm_head.weight.data_ptr()
    assert runner.kv_cache_shape == (8, 2, lm.config.num_key_value_heads, 4, lm.config.head_dim)
    assert isinstance(lm.model.lm_head, torch.nn.Linear)  # packed layers live only in the runner
    assert not any(isinstance(m, PackedLinear) for m in lm.model.modules())
    again = ModelRunner(lm, 8, 4)
    assert type(again.model.lm_head) is type(runner.model.lm_head)  # every runner gets the same head


def test_runner_packs_every_linear_layer_once(tiny_model):
    lm = tiny_model
    runner = ModelRunner(lm, 8, 4)
    n_linear = sum(isinstance(m, torch.nn.Linear) for m in lm.model.modules())
    assert runner.num_packed_layers == n_linear == 7 * lm.config.num_hidden_layers + 1
    assert not any(isinstance(m, torch.nn.Linear) for m in runner.model.modules())
    again = ModelRunner(lm, 8, 4)
    a = runner.model.model.layers[0].mlp.down_proj
    b = again.model.model.layers[0].mlp.down_proj
    assert a.group.packed is b.group.packed  # one packed copy per weight, shared by every runner
    assert a.weight.data_ptr() == lm.model.model.layers[0].mlp.down_proj.weight.data_ptr()


def test_sibling_projections_share_one_stacked_weight(tiny_model):
    layer = ModelRunner(tiny_model, 8, 4).model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    assert attn.q_proj.group is attn.k_proj.group is attn.v_proj.group
    assert [attn.q_proj.member, attn.k_proj.member, attn.v_proj.member] == [0, 1, 2]
    assert mlp.gate_proj.group is mlp.up_proj.group is not mlp.down_proj.group
    assert len({id(attn.o_proj.group), id(attn.q_proj.group), id(mlp.gate_proj.group)}) == 3


def test_stacked_siblings_compute_what_each_linear_computes(tiny_model):
    """Whatever the call pattern -- siblings on one input, a member twice, another input in
    between -- every member returns its own F.linear of the input it was given."""
    plain = tiny_model.model.model.layers[1].self_attn
    packed = ModelRunner(tiny_model, 8, 4).model.model.layers[1].self_attn
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 5, plain.q_proj.in_features, generator=gen)
    y = torch.randn(1, 5, plain.q_proj.in_features, generator=gen)
    calls = [("q_proj", x), ("k_proj", x), ("v_proj", x),   # the decoder layer's pattern
             ("k_proj", x), ("k_proj", x),                   # a member twice on one input
             ("q_proj", y), ("v_proj", x), ("k_proj", y),    # inputs interleaved
             ("v_proj", y), ("q_proj", y)]
    with torch.inference_mode():
        for name, inp in calls:
            want = torch.nn.functional.linear(inp, getattr(plain, name).weight)
            torch.testing.assert_close(getattr(packed, name)(inp), want, rtol=1e-5, atol=1e-5)


def test_stacking_can_be_left_out(tiny_model):
    from kvcore.model.reference import shared_clone
    from kvcore.model.cpu_packing import pack_linear_layers

    model = shared_clone(tiny_model.model)
    assert pack_linear_layers(model, stack_siblings=False) == 7 * tiny_model.config.num_hidden_layers + 1
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.group is not attn.k_proj.group


@pytest.mark.parametrize("rows", [1, 2, 8, 37])
def test_packed_linear_computes_what_linear_computes(tiny_model, rows):
    lin = tiny_model.model.model.layers[1].mlp.up_proj
    packed = PackedLinear.try_build(lin)
    assert packed is not None
    x = torch.randn(1, rows, lin.in_features, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), torch.nn.functional.linear(x, lin.weight), rtol=1e-5, atol=1e-5)


def test_packing_can_be_turned_off(tiny_model, monkeypatch):
    monkeypatch.setenv("PAGED_KV_LAB_PACKED_WEIGHTS", "0")
    runner = ModelRunner(tiny_model, 8, 4)
    assert runner.num_packed_layers == 0
    assert isinstance(runner.model.lm_head, torch.nn.Linear)


def test_bad_block_tables_are_refused(tiny_model):
    lm = tiny_model
    n = lm.config.num_hidden_layers
    runner = ModelRunner(lm, 16, 4)
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
    sliding = ModelRunner(lm, 16, 4, [0] * n, [W])
    # next token at position 12 sees 5..12: logical block 1 (positions 4-7) may not be null
    with pytest.raises(ValueError, match="inside the sliding window"):
        sliding.execute([SeqBatchItem("a", [3], 12, ([0, 0, 2, 3],), True)])
    assert sliding.execute([SeqBatchItem("a", [3], 12, ([0, 1, 2, 3],), True)])
    with pytest.raises(ValueError, match="layer_group"):
        ModelRunner(lm, 16, 4, [0], [None])
    with pytest.raises(ValueError, match="group"):
        ModelRunner(lm, 16, 4, [0, 1] * (n // 2), [None])


# ----------------------------------------------------------------------------- SmolLM2
QUESTIONS = ["What is the capital of France?", "Name three primes.",
             "Write a haiku about the sea.", "Why is the sky blue?"]


@pytest.mark.slow
def test_smollm2_batched_mixed_chunked(smollm2):
    """4 chat prompts: two prefill together, one joins (chunked) while they decode."""
    lm = smollm2
    prompts = {f"q{i}": lm.encode_prompt(q) for i, q in enumerate(QUESTIONS)}
    eng = engine(lm, block_size=16, chunk=16)
    eng.add("q0", prompts["q0"], 12)
    eng.add("q1", prompts["q1"], 12)
    for _ in range(4):
        eng.step()
    eng.add("q2", prompts["q2"], 12)
    eng.add("q3", prompts["q3"], 12)
    eng.run()
    worst = check(lm, lm.model, eng, prompts, 12, TOL_SMOL)
    print(f"SmolLM2 max |logit diff| {worst:.2e}")


@pytest.mark.slow
def test_smollm2_prefix_reuse_and_preemption(smollm2):
    lm = smollm2
    a = lm.encode_prompt("What is the capital of France?")
    b = lm.encode_prompt("What is the capital of Italy?")
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    bs = 5  # does not divide the prompts; B diverges mid-block
    eng = engine(lm, block_size=bs)
    eng.add("a", a, 10)
    eng.step()
    eng.add("b", b, 10, prefix_of="a", prefix_blocks=shared // bs)
    for _ in range(4):
        eng.step()
    eng.preempt("a")
    eng.step(["b"])
    eng.run()
    check(lm, lm.model, eng, {"a": a, "b": b}, 10, TOL_SMOL)


@pytest.mark.slow
def test_smollm2_sliding_window_and_hybrid(smollm2):
    lm = smollm2
    prompts = {f"q{i}": lm.encode_prompt(q) for i, q in enumerate(QUESTIONS[:2])}
    n = lm.config.num_hidden_layers
    eng = engine(lm, block_size=4, windows=[W], chunk=12)
    for rid, p in prompts.items():
        eng.add(rid, p, 8)
    eng.run()
    check(lm, reference_model(lm, sliding_window=W), eng, prompts, 8, TOL_SMOL)

    types = hybrid_types(n)
    groups = [0 if t == "full_attention" else 1 for t in types]
    eng = engine(lm, block_size=4, windows=[None, W], layer_group=groups, chunk=12)
    for rid, p in prompts.items():
        eng.add(rid, p, 8)
    eng.run()
    check(lm, reference_model(lm, sliding_window=W, layer_types=types), eng, prompts, 8, TOL_SMOL)


def test_siblings_that_cannot_stack_are_packed_one_by_one(tiny_model):
    from kvcore.model.reference import shared_clone
    from kvcore.model.cpu_packing import pack_linear_layers

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
