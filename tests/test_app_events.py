"""Event sentences: every kind in both languages, reasons included, defensive about data."""
import pytest

from kvcore.events import EVENT_KINDS, Event
from lesson.events import changed_blocks, sentence, step_sentences

SAMPLES = [
    Event("allocated", "B", (7, 8), data={"queue_positions": [0, 1], "evicted_hashes": {"7": "3fa2" + "0" * 28}}),
    Event("evicted", "B", (7,), data={"hash": "3fa2" + "0" * 28, "reason": "reused from queue head"}),
    Event("cache_hit", "B", (1, 2), data={"num_tokens": 32, "num_blocks": 2, "block_ids_per_group": [[1, 2]]}),
    Event("cache_miss", "D", data={"num_tokens": 37}),
    Event("touched", "C", (1, 2), data={"from_queue": [2], "queue_positions": [5]}),
    Event("cached", "A", (1, 2), data={"hashes": ["ab" * 16, "cd" * 16], "num_tokens": 8}),
    Event("freed", "A", (3, 2, 1), data={"to_head": [3], "to_tail": [2], "still_used": [1], "reason": "finished"}),
    Event("window_skipped", "A", (4,), data={"slots": [0], "block_ids": [4]}),
    Event("scheduled", "A", data={"num_tokens": 14, "kind": "chunk"}),
    Event("admitted", "A", data={"num_cached_tokens": 16}),
    Event("resumed", "C", data={"num_cached_tokens": 12}),
    Event("blocked", "D", data={"reason": "token_budget"}),
    Event("preempted", "C", data={"policy": "fcfs", "reason": "B needed blocks", "victim_priority": 1}),
    Event("finished", "A", data={"reason": "eos"}),
    Event("sampled", None, data={"tokens": {"A": 5, "B": 6}}),
    Event("arrived", "A", data={"num_prompt_tokens": 5}),
    Event("reset", None, data={"ok": False}),
]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_kind_has_a_sentence(lang):
    kinds = {e.kind for e in SAMPLES}
    assert kinds == set(EVENT_KINDS)
    for e in SAMPLES:
        s = sentence(e, lang, decode=lambda ids: f"<{ids[0]}>")
        assert s and not s.startswith(e.kind + ":"), s


def test_reasons_are_in_the_sentences():
    en = {e.kind: sentence(e, "en") for e in SAMPLES}
    assert "lost hash #3fa20000" in en["evicted"]
    assert "7 ← #3fa20000" in en["allocated"]
    assert "32 tokens" in en["cache_hit"] and "[1, 2]" in en["cache_hit"]
    assert "go to the tail" in en["freed"] and "go to the head" in en["freed"] and "still used" in en["freed"]
    assert "null block" in en["window_skipped"]
    assert "FCFS" in en["preempted"] and "B needed blocks" in en["preempted"]
    assert "positions [5]" in en["touched"]
    assert "token budget" in en["blocked"]
    zh = {e.kind: sentence(e, "zh") for e in SAMPLES}
    assert "丢失了哈希" in zh["evicted"] and "队尾" in zh["freed"] and "B 需要新块" in zh["preempted"]


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_empty_data_never_breaks(kind):
    for lang in ("en", "zh"):
        assert sentence(Event(kind), lang)


def test_step_sentences_and_changed_blocks():
    out = step_sentences(SAMPLES[:3], "en")
    assert [k for k, _ in out] == ["allocated", "evicted", "cache_hit"]
    assert out[0][1].startswith("🧱")
    assert changed_blocks(SAMPLES) >= {7, 8, 1, 2, 3, 4}


def test_group_shown_only_for_hybrid():
    e = Event("allocated", "A", (5,), group=1)
    assert "(g1)" in sentence(e, "en", multi_group=True)
    assert "(g1)" not in sentence(e, "en", multi_group=False)
