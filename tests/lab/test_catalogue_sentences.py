"""The event sentences and the why answers read exactly as they did when they were written in
Python, before they moved to the catalogue (text/catalogue/events.json, why.json): the texts of
real runs, in English and 中文, against tests/fixtures/sentences_before_catalogue.json (written
by the Python sentences, once)."""

import json

import pytest

from paged_kv_lab.text.sentences import sentence
from paged_kv_lab.why.explain import RecordedSteps, admissions, explain_hit
from paged_kv_lab.why.explain_blocks import compare_requests, life_of_block
from paged_kv_lab.why.explain_text import comparison_sentences, hit_sentences, life_sentences
from support.event_runs import every_kind_runs
from support.kv import make_engine, spec
from support.paths import FIXTURES

GOLDEN = FIXTURES / "sentences_before_catalogue.json"
P = list(range(100, 108))  # two blocks of 4


def decode(ids) -> str:
    return f"<{ids[0]}>"


def event_texts(lang: str) -> list[str]:
    # the runs the golden file was written from (later runs add kinds it never had)
    return [
        sentence(e, lang, decode, multi_group=True)
        for name, recs in every_kind_runs()
        if name != "partial_hits"
        for r in recs
        for e in r.events
    ]


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


def texts() -> dict[str, list[str]]:
    return {
        f"{what}:{lang}": f(lang)
        for what, f in (("events", event_texts), ("why", why_texts))
        for lang in ("en", "zh")
    }


@pytest.mark.parametrize("part", ["events:en", "events:zh", "why:en", "why:zh"])
def test_sentences_read_as_before_the_catalogue(part):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))[part]
    now = texts()[part]
    assert len(now) == len(golden) > 20
    for i, (was, is_) in enumerate(zip(golden, now)):
        assert is_ == was, f"{part} #{i}"
