"""Speculative decoding with a draft model (self-speculative early exit): the draft is the target's
first L layers + final norm + LM head, with K/V pools of its own behind the target's block tables.

Checked here: the proposer's passes (what it feeds, where it writes, how many drafts near
max_model_len), ``num_lookahead_tokens = k`` reaching ``allocate_slots`` (blocks reserved ahead,
one allocated only for lookahead, never cached past ``request.num_tokens``), every draft equal to
the truncated model's own greedy continuation (so the draft's K/V is right, prefix hits and
preemption included), the draft pools holding the target's first-layer K/V at the same slots, and
greedy output equal to transformers' ``generate`` on the target — the tiny model always, SmolLM2 in
the slow set. The scenario setting and its refusals too.
"""

from __future__ import annotations

import pytest
import torch

from kvcore.model.reference import shared_clone
from kvcore.utils.math_utils import cdiv
from kvcore.worker.gpu.input_batch import SeqBatchItem
from kvcore.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator
from paged_kv_lab.recording import events
from paged_kv_lab.run.engine import Engine, NoModelRunner, num_lookahead_tokens
from paged_kv_lab.run.scenario import (
    EngineSettings,
    RequestSpec,
    Scenario,
    ScenarioError,
    SpeculativeConfig,
    load_scenario,
)
from support.models import eos_of, reference_tokens

K = 3
DRAFT = SpeculativeConfig(method="draft_model", num_speculative_tokens=K, num_draft_layers=2)
REP = [17, 254, 1033, 88, 4012, 7, 391]


# -- the proposer's passes, with a stand-in draft ---------------------------------------------
class EchoDraft:
    """Stands in for the draft model: proposes (last token + 1); records every pass."""

    num_layers = 1

    def __init__(self):
        self.passes: list[list[SeqBatchItem]] = []

    def execute(self, items):
        self.passes.append(list(items))
        return {it.request_id: it.token_ids[-1] + 1 for it in items if it.sample}


def item(rid, tokens, start, sample=True):
    return SeqBatchItem(rid, list(tokens), start, ([1, 2, 3],), sample)


def test_first_pass_then_one_token_per_pass_at_the_next_positions():
    draft = EchoDraft()
    p = StandaloneARSpeculator(draft, num_speculative_tokens=3, max_model_len=100)
    out = p.propose([item("A", [5, 6, 7], 4), item("B", [1, 2], 0, sample=False)], {"A": 7, "B": 9})
    assert out == {"A": [8, 9, 10]}  # B ran a prefill chunk: draft K/V written, nothing proposed
    assert len(draft.passes) == 3 and p.num_forwards == 3
    first, second, third = draft.passes
    assert [(it.request_id, it.start_pos, it.token_ids) for it in first] == [
        ("A", 4, [5, 6, 7]),
        ("B", 0, [1, 2]),
    ]
    # drafts 1 and 2 are fed at positions 7 and 8; draft 3 is proposed, never fed
    assert [(it.start_pos, it.token_ids) for it in second] == [(7, [8])]
    assert [(it.start_pos, it.token_ids) for it in third] == [(8, [9])]
    # the highest position written is num_tokens + k - 2: inside k lookahead slots
    assert max(it.start_pos for it in third) == 7 + 3 - 2
    assert p.num_lookahead_tokens == 3


def test_no_draft_reaches_past_max_model_len():
    draft = EchoDraft()
    p = StandaloneARSpeculator(draft, num_speculative_tokens=4, max_model_len=9)
    out = p.propose([item("A", [5], 6), item("B", [3], 7)], {"A": 7, "B": 8})
    assert out == {"A": [6, 7], "B": [4]}
    assert p.propose([item("C", [5], 8)], {"C": 9}) == {}
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        StandaloneARSpeculator(draft, 0, 10)


# -- settings --------------------------------------------------------------------------------
def test_scenario_file_accepts_the_draft_model_and_lookahead_follows_it(tmp_path):
    f = tmp_path / "s.json"
    f.write_text(
        '{"model": "tiny-random", "engine": {"speculative": {"method": "draft_model", '
        '"num_speculative_tokens": 2, "num_draft_layers": 1}}, '
        '"requests": [{"id": "a", "prompt_token_ids": [1, 2, 3]}]}'
    )
    sp = load_scenario(f).engine.speculative
    assert (sp.method, sp.num_speculative_tokens, sp.num_draft_layers) == ("draft_model", 2, 1)
    assert num_lookahead_tokens(sp) == 2
    assert num_lookahead_tokens(SpeculativeConfig(num_speculative_tokens=4)) == 0  # n-gram
    assert num_lookahead_tokens(None) == 0
    bad = tmp_path / "bad.json"
    bad.write_text('{"engine": {"speculative": {"method": "medusa", "num_draft_layers": 0}}}')
    with pytest.raises(ScenarioError) as e:
        load_scenario(bad)
    text = str(e.value)
    assert "engine.speculative.method" in text and "engine.speculative.num_draft_layers" in text


def test_refusals_name_what_is_wrong(tiny_model):
    too_deep = SpeculativeConfig(method="draft_model", num_draft_layers=9)
    sc = Scenario(model="tiny-random", device="cpu", engine=EngineSettings(speculative=too_deep))
    with pytest.raises(ValueError, match="num_draft_layers=9: the model has only 4 layers"):
        Engine(sc, model=tiny_model)
    with pytest.raises(ValueError, match="runs without a model"):
        Engine(
            Scenario(engine=EngineSettings(speculative=DRAFT)), runner=NoModelRunner(vocab_size=50)
        )


def run(loaded, requests, speculative=DRAFT, **engine):
    sc = Scenario(
        model=loaded.name,
        device=loaded.device.type,
        engine=EngineSettings(speculative=speculative, **engine),
        requests=tuple(requests),
    )
    eng = Engine(sc, model=loaded, debug=True)
    return eng, eng.run()


def req(rid, ids, n=16, **kw):
    kw.setdefault("ignore_eos", True)
    return RequestSpec(id=rid, prompt_token_ids=tuple(ids), max_tokens=n, **kw)


CASES = {
    "alone": ([req("A", REP * 2 + [5])], dict(block_size=4)),
    "batched": (
        [req("A", REP * 2), req("B", REP[:4] * 3 + [5, 6], n=12), req("C", [3, 1, 4, 1, 5, 9])],
        dict(block_size=4),
    ),
    "prefix_hits": (
        [req("A", REP * 2, n=10), req("B", REP * 2 + [9], n=10, arrival_step=4)],
        dict(block_size=4),
    ),
    "preemption": (
        [req("A", REP * 2, n=20), req("B", REP[::-1] * 2, n=20)],
        dict(block_size=4, num_gpu_blocks=14),
    ),
}


def draft_reference(loaded, num_layers):
    """transformers' own model cut after ``num_layers`` layers (same weights): the draft's truth."""
    ref = shared_clone(loaded.model)
    ref.config.num_hidden_layers = num_layers
    return ref


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_output_equals_generate_and_every_draft_is_the_early_exit_models(loaded, case):
    requests, engine = CASES[case]
    layers = 2 if loaded.name == "tiny-random" else 8
    sp = SpeculativeConfig(method="draft_model", num_speculative_tokens=K, num_draft_layers=layers)
    eng, recs = run(loaded, requests, sp, **engine)
    kinds = {e.kind for r in recs for e in r.events}
    outs = eng.outputs()
    for r in requests:
        got = outs[r.id]["token_ids"]
        want = reference_tokens(loaded.model, list(r.prompt_token_ids), r.max_tokens, ())
        assert got == want, f"{r.id}: differs from transformers' generate on the target"
    # Each proposal is the truncated model's greedy continuation of the tokens it was made from:
    # the draft's K/V (written through the block tables, hits and recomputes included) is right.
    ref = draft_reference(loaded, layers)
    proposed = events_of(recs, events.DRAFT_PROPOSED)
    assert proposed
    full = {r.id: list(r.prompt_token_ids) + outs[r.id]["token_ids"] for r in requests}
    for e in proposed[:: max(1, len(proposed) // 12)]:  # a dozen spread over the run
        ctx = full[e.request_id][: e.num_tokens]
        assert list(e.draft_token_ids) == reference_tokens(ref, ctx, len(e.draft_token_ids), ())
    assert eng.spec_decoding_stats.num_draft_tokens > 0
    if case == "prefix_hits":
        assert events.CACHE_HIT in kinds
    if case == "preemption":
        assert events.PREEMPTED in kinds


def events_of(recs, kind):
    return [e for r in recs for e in r.events if e.kind == kind]


def test_lookahead_slots_are_reserved_ahead_and_never_cached(tiny_model, one_torch_thread):
    bs = 4
    eng, recs = run(tiny_model, [req("A", REP + [1], n=14)], block_size=bs)
    assert eng.scheduler.config.num_lookahead_tokens == K
    lookahead_only = 0
    for rec in recs:
        snap = rec.snapshot
        if "A" not in snap.running or "A" not in rec.scheduled:
            continue
        r = snap.request("A")
        table = r.block_tables[0]
        before = rec.model_inputs.positions_of("A")[0]
        # allocate_slots(num_new, num_lookahead_tokens=k): slots for scheduled + k more
        assert len(table) == cdiv(before + rec.scheduled["A"] + K, bs)
        num_tokens = r.num_prompt_tokens + r.num_output_tokens
        if len(table) > cdiv(num_tokens, bs) and len(table) * bs - num_tokens >= bs:
            lookahead_only += 1  # a whole block past every token: allocated for lookahead only
        cached = [snap.blocks[b] for b in table if snap.blocks[b].block_hash is not None]
        assert len(cached) <= num_tokens // bs  # lookahead never enters the prefix cache
    assert lookahead_only > 0


def test_draft_pools_hold_the_targets_first_layer_kv_at_the_same_slots(
    tiny_model, one_torch_thread
):
    eng, recs = run(tiny_model, [req("A", REP * 2, n=8)], block_size=4)
    draft = eng.drafter.runner
    assert draft.num_layers == 2 and len(draft.kv_caches) == 2
    # Layer 0's K/V depends only on the token and its position: same weights, same inputs.
    last = recs[-2].snapshot.request("A")
    n = last.num_computed_tokens
    for pos in range(0, n, 3):
        blk, off = last.block_tables[0][pos // 4], pos % 4
        tgt = eng.runner.kv_caches[0][blk, :, :, off]
        drf = draft.kv_caches[0][blk, :, :, off]
        assert torch.allclose(tgt, drf, atol=1e-5), f"position {pos}"
    assert eng.runner.model.config.num_hidden_layers == 4  # the target is untouched


def test_output_is_the_same_with_ngram_draft_model_and_none(tiny_model, one_torch_thread):
    requests = [req("A", REP * 2, n=12), req("B", [9, 8, 7, 6, 5], n=10)]
    base, _ = run(tiny_model, requests, None, block_size=4)
    ngram, _ = run(tiny_model, requests, SpeculativeConfig(num_speculative_tokens=K), block_size=4)
    draft, _ = run(tiny_model, requests, DRAFT, block_size=4)
    for r in requests:
        want = base.outputs()[r.id]["token_ids"]
        assert ngram.outputs()[r.id]["token_ids"] == want
        assert draft.outputs()[r.id]["token_ids"] == want
    assert eos_of(tiny_model) is not None


def test_the_budget_counts_the_draft_pools(tiny_model):
    from dataclasses import replace

    from paged_kv_lab.run.budget import BudgetError, app_limits, check_scenario, kv_pool_bytes

    cfg = tiny_model.config
    eng = EngineSettings(block_size=4, num_gpu_blocks=64, speculative=DRAFT)
    sc = Scenario(model="tiny-random", engine=eng, requests=(req("A", REP),))
    target = kv_pool_bytes(cfg, 4, 64)
    roomy = replace(app_limits(), max_run_bytes=target * 3 // 2)  # 2 of 4 layers: 1.5x fits
    check_scenario(sc, roomy, config=cfg)
    tight = replace(app_limits(), max_run_bytes=target * 3 // 2 - 1)
    with pytest.raises(BudgetError):
        check_scenario(sc, tight, config=cfg)
    check_scenario(replace(sc, engine=replace(eng, speculative=None)), tight, config=cfg)


def test_a_lone_request_short_of_lookahead_slots_preempts_itself_and_still_finishes(
    tiny_model, one_torch_thread
):
    # 6 usable blocks of 4 hold its 20 tokens, but not 1 + 3 drafts + 3 lookahead past them
    # (with 2 more tokens it comes back with one token left, padded to 1 + 3 rows that never
    # fit: vLLM would keep it waiting, the engine aborts it)
    r = req("A", REP + [1, 2, 3], n=10)
    eng, recs = run(tiny_model, [r], block_size=4, num_gpu_blocks=7)
    kinds = [e.kind for rec in recs for e in rec.events]
    assert events.PREEMPTED in kinds and events.FINISHED in kinds
    out = eng.outputs()["A"]
    assert out["finish_reason"] == "finished_length"
    assert out["token_ids"] == reference_tokens(tiny_model.model, list(r.prompt_token_ids), 10, ())
