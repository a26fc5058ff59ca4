"""Lesson 13, "Hybrid models", on tiny-hybrid: the page plays it on its own model whatever the
sidebar loaded, draws the page-size table computed from the configs, and its run is faithful (the
outputs equal transformers' generate; with prefix_match_unit off, B's hit inside a block is gone).
The page arithmetic itself is vLLM's _align_hybrid_block_size, checked on its defining rule."""

import types

import pytest

from kvcore.model.memory import hybrid_page_sizes
from paged_kv_lab.content import BY_ID
from paged_kv_lab.content.hybrid_pages import real_models
from paged_kv_lab.run.scenario import block_size_note
from paged_kv_lab.store.timeline import lesson_model, lesson_run
from paged_kv_lab.text.i18n import tr
from support.app import Browser, app
from support.models import greedy_no_eos

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LESSON = BY_ID["hybrid"]


@pytest.fixture(scope="module")
def hybrid():
    return lesson_model("tiny-hybrid", "cpu")


def finished(overrides=None):
    run = lesson_run(LESSON, lesson_model("tiny-hybrid", "cpu"), overrides)
    run.run_to_end(timeout=300.0)
    assert run.finished
    return run


def events(run, kind, rid):
    return [
        (r.step, e) for r in run.records for e in r.events if e.kind == kind and e.request_id == rid
    ]


def test_the_block_is_raised_until_an_attention_page_holds_a_state():
    """For every model of the table and a few made-up shapes: the block size is the smallest
    multiple of 64 tokens (vLLM 0.34's start, kept by kernels that align to 16) whose attention
    page (one layer) holds one layer's state."""
    shapes = [r.sizes for r in real_models()]
    for kv, hd, vh in ((1, 64, 2), (2, 128, 8), (8, 128, 64)):
        cfg = types.SimpleNamespace(
            num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=kv, head_dim=hd,
            linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_num_key_heads=4,
            linear_num_value_heads=vh, linear_value_head_dim=64,
        )  # fmt: skip
        shapes.append(hybrid_page_sizes(cfg, "bfloat16", "float32"))
    for z in shapes:
        assert z.block_size % 64 == 0 and z.page_bytes == z.block_size * z.attn_bytes_per_token
        assert z.page_bytes >= z.state_bytes > (z.block_size - 64) * z.attn_bytes_per_token
        assert z.padding_bytes == z.page_bytes - z.state_bytes >= 0
    assert all(r.sizes.block_size >= 256 for r in real_models()), "real models: hundreds"


def test_the_page_plays_on_tiny_hybrid_and_draws_the_page_table(tiny, hybrid):  # noqa: F811
    at = app("hybrid")
    assert not at.exception
    state = at.session_state["lesson:hybrid"]
    assert state.model_key[0] == "tiny-hybrid", "the sidebar's tiny-random is not used here"
    here = hybrid_page_sizes(hybrid.config, "float32")
    # played at a stated 32 (the lesson's file): a size vLLM keeps, below the 64 it resolves
    played = state.run.scenario.engine.block_size
    assert played == 32 < here.block_size == 64
    assert hybrid_page_sizes(hybrid.config, "float32", block_size=played).block_size == played
    tables = "\n".join(m.value for m in at.markdown)
    for r in (here, *(r.sizes for r in real_models())):
        assert f"| {r.block_size:,} |" in tables and f"{r.page_bytes:,}" in tables
    # the block size's note, with vLLM's source beside it
    note = tr(block_size_note(state.run.scenario), "en")
    assert note in [c.value for c in at.caption] and "_align_hybrid_block_size" in note
    kinds = [g["kind"] for g in Browser(at, "hybrid").head["groups"]]
    assert kinds == ["mamba"] * 3 + ["full"], "the player draws state groups and attention"


def test_b_hits_inside_a_block_and_gets_copies_and_the_outputs_are_transformers(hybrid):
    run = finished()
    bs = run.scenario.engine.block_size
    ((step, hit),) = events(run, "cache_hit", "B")
    assert 0 < hit.num_tokens < bs and hit.num_tokens % run.scenario.engine.prefix_match_unit == 0
    copies = [e for s, e in events(run, "copied", "B") if e.reason == "partial_hit" and s == step]
    assert len(copies) == 4, "one private copy in each of the four groups"
    assert events(run, "cache_miss", "C") and not events(run, "cache_hit", "C")
    outs = {r.request_id: r for r in run.records[-1].snapshot.requests}
    for spec in run.scenario.requests:
        ids = list(outs[spec.id].prompt_token_ids)
        want = greedy_no_eos(hybrid.model, ids, spec.max_tokens)
        assert list(outs[spec.id].output_token_ids) == want, spec.id


def test_without_prefix_match_unit_the_short_prefix_misses():
    run = finished({"prefix_match_unit": None})
    assert not events(run, "cache_hit", "B") and events(run, "cache_miss", "B")
    assert not any(e.kind in ("cached_partial", "copied") for r in run.records for e in r.events)


def test_why_explains_the_hit_inside_a_block_and_every_block_life_agrees():
    """Why? on the lesson's run: B's hit ends inside a block that A keyed there, with B's copies
    and the two vLLM functions cited; C's miss is told apart; the life of every block, replayed
    from the events (copies, partial entries, re-keying included), agrees with every snapshot."""
    from paged_kv_lab.why import explain as X
    from paged_kv_lab.why.explain_blocks import life_of_block
    from paged_kv_lab.why.explain_text import hit_sentences

    run = finished()
    steps = X.RecordedSteps(run.initial, tuple(run.records), run.scenario.engine)
    (b,) = X.explain_hit(steps, "B")
    copies = [e for s, e in events(run, "copied", "B") if e.reason == "partial_hit"]
    assert b.reason == X.PARTIAL_HIT and b.other_request == "A"
    assert b.copy_blocks == tuple(e.block_ids[0] for e in copies if e.group == b.group)
    said = "\n".join(hit_sentences(b))
    assert "cache_partial_block" in said and "take_kv_cache_block_copies" in said
    (c,) = X.explain_hit(steps, "C")
    assert c.hit_tokens == 0 and c.reason != X.PARTIAL_HIT
    for block in range(len(run.initial.blocks)):
        life = life_of_block(steps, block)
        for state in life.states[1:]:
            view = run.records[state.step - 1].snapshot.blocks[block]
            assert (state.ref_cnt, state.block_hash) == (view.ref_cnt, view.block_hash), (
                block,
                state,
            )
