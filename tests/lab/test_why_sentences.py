"""Every branch of the why answers (hit, comparison and block-life sentences) reads whole in
English and 中文: small runs whose answers take every branch the why-sentences have between them
(an evicted prefix, a salted one, the hit rules, a preemption and resumption, a hybrid model),
each sentence rendered from the catalogue (text/catalogue/why.json) with its fields filled.

The event sentences of the same kind of runs are tests/lab/test_event_sentences.py's. (Until the
layout of the tests changed, this file compared both with a golden file written by the Python
sentences before they moved into the catalogue: that migration is done and the file retired.)"""

import re

import pytest

from paged_kv_lab.why.explain import RecordedSteps, admissions, explain_hit
from paged_kv_lab.why.explain_blocks import compare_requests, life_of_block
from paged_kv_lab.why.explain_text import comparison_sentences, hit_sentences, life_sentences
from support.kv import make_engine, spec

P = list(range(100, 108))  # two blocks of 4
CJK = re.compile(r"[\u4e00-\u9fff]")


def decode(ids) -> str:
    return f"<{ids[0]}>"


def runs() -> dict[str, RecordedSteps]:
    """Small runs whose answers take every branch the why-sentences have between them."""
    cases = {
        # a tight pool: C's prefix was cached by A, then evicted for B; D shares A's prefix
        "evicted": (
            [
                spec("A", P + [1, 2, 3], max_tokens=2),
                spec("B", list(range(200, 212)), max_tokens=2, arrival_step=3),
                spec("C", P + [1, 2, 3], max_tokens=2, arrival_step=6),
                spec("D", P + [7, 8, 9, 10, 11], max_tokens=2, arrival_step=6, cache_salt="s"),
            ],
            dict(num_gpu_blocks=6),
        ),
        # the rules: a whole-block prompt (capped), a partial last block, a prompt under a block
        "rules": (
            [
                spec("A", P, max_tokens=2),
                spec("B", P, max_tokens=2, arrival_step=3),
                spec("C", P + [5], max_tokens=2, arrival_step=3),
                spec("D", [1, 2], max_tokens=2, arrival_step=3),
            ],
            {},
        ),
        # a pool too small for two: preemption, then a resumption
        "preemption": (
            [spec("A", range(8), max_tokens=6), spec("B", range(20, 28), max_tokens=6)],
            dict(num_gpu_blocks=6),
        ),
        "hybrid": (
            [
                spec("A", range(8), max_tokens=6),
                spec("B", list(range(8)) + [99], max_tokens=2, arrival_step=3),
            ],
            dict(
                block_size=2,
                num_gpu_blocks=16,
                sliding_window=4,
                layer_types=("full_attention", "sliding_attention"),
            ),
        ),
    }
    out = {}
    for name, (reqs, kw) in cases.items():
        eng = make_engine(reqs, **kw)
        initial = eng.snapshot()
        out[name] = RecordedSteps(initial, tuple(eng.run()), eng.settings, decode)
    return out


def why_texts(lang: str) -> list[str]:
    out: list[str] = []
    for run in runs().values():
        ids = list(run.request_views())
        for rid in ids:
            for step, _, _ in admissions(run, rid):
                for x in explain_hit(run, rid, step):
                    out += hit_sentences(x, lang)
        for a, b in zip(ids, ids[1:]):
            out += comparison_sentences(compare_requests(run, a, b), lang)
        for block in range(len(run.initial.blocks)):
            out += life_sentences(life_of_block(run, block), lang)
    return out


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_why_sentence_is_whole(lang):
    """No field left unfilled, no ``None`` where a value belongs, and the language's own script
    (a sentence missing from the catalogue in 中文 would fall back to English)."""
    texts = why_texts(lang)
    assert len(texts) > 20
    for t in texts:
        assert t.strip() and "{" not in t and "None" not in t, t
        if lang == "zh":
            assert CJK.search(t), t
        else:
            assert not CJK.search(t), t


def test_both_languages_say_the_same_number_of_things():
    en, zh = why_texts("en"), why_texts("zh")
    assert len(en) == len(zh) and all(a != b for a, b in zip(en, zh))


def test_every_branch_is_taken():
    """The runs reach each kind of answer: a hit's sentences, a comparison and a block's life, and
    the hit answers differ across the runs (evicted, salted, capped, partial, preempted, hybrid)."""
    seen = {"hit": set(), "comparison": 0, "life": 0}
    for run in runs().values():
        ids = list(run.request_views())
        for rid in ids:
            for step, _, _ in admissions(run, rid):
                for x in explain_hit(run, rid, step):
                    seen["hit"].add(tuple(hit_sentences(x, "en"))[:1])
        seen["comparison"] += sum(
            bool(comparison_sentences(compare_requests(run, a, b), "en"))
            for a, b in zip(ids, ids[1:])
        )
        seen["life"] += sum(
            bool(life_sentences(life_of_block(run, b), "en"))
            for b in range(len(run.initial.blocks))
        )
    assert len(seen["hit"]) >= 6 and seen["comparison"] and seen["life"], seen
