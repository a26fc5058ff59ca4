"""Event sentences: one table (text.sentences) for the CLI and the app, every kind in both
languages, reasons included; the events come from real engine runs."""

import re

import pytest

from paged_kv_lab.recording import events
from paged_kv_lab.recording.events import EVENT_TYPES, EventKind
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.why.sentences import (
    ICONS,
    SENTENCES,
    Style,
    changed_blocks,
    sentence,
    step_sentences,
)
from support.event_runs import every_kind_events, every_kind_runs

CJK = re.compile(r"[\u4e00-\u9fff]")


def first(kind, pred=lambda e: True):
    return next(e for e in every_kind_events() if e.kind == kind and pred(e))


def test_every_kind_has_a_class_a_renderer_in_both_languages_and_an_icon():
    assert set(SENTENCES) == set(EventKind) == set(EVENT_TYPES) == set(ICONS)
    for kind in EventKind:
        e = first(kind)
        en, zh = (tr(SENTENCES[kind](e, Style()), lang) for lang in ("en", "zh"))
        assert en and zh and en != zh, kind
        assert CJK.search(zh) and not CJK.search(en), (en, zh)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_event_of_real_runs_has_a_sentence_naming_its_request(lang):
    for e in every_kind_events():
        s = sentence(e, lang, decode=lambda ids: f"<{ids[0]}>")
        assert s and "{" not in s and "None" not in s, s
        if e.request_id is not None:
            assert e.request_id in s, s


def test_reasons_are_in_the_sentences():
    alloc = first(events.ALLOCATED, lambda e: e.evicted_hashes)
    bid, h = next(iter(alloc.evicted_hashes.items()))
    assert f"{bid} ← #{h[:8]}" in sentence(alloc) and "丢失了哈希" in sentence(alloc, "zh")
    ev = first(events.EVICTED, lambda e: e.reason == "reused from queue head")
    assert f"lost hash #{ev.block_hash[:8]}" in sentence(
        ev
    ) and "reused from the queue head" in sentence(ev)
    assert "evict_blocks was called" in sentence(
        first(events.EVICTED, lambda e: e.reason == "evict_blocks")
    )
    hit = first(events.CACHE_HIT)
    assert f"{hit.num_tokens} tokens" in sentence(hit) and str(
        list(hit.block_ids_per_group[0])
    ) in sentence(hit)
    freed = first(events.FREED, lambda e: e.to_tail and e.to_head)
    assert "go to the tail" in sentence(freed) and "go to the head" in sentence(freed)
    assert "队尾" in sentence(freed, "zh") and "队头" in sentence(freed, "zh")
    assert "null block" in sentence(first(events.WINDOW_SKIPPED))
    pre = first(events.PREEMPTED)
    assert "FCFS" in sentence(pre) and f"{pre.needed_by} needed blocks" in sentence(pre)
    assert f"{pre.needed_by} 需要新块" in sentence(pre, "zh")
    touch = first(events.TOUCHED, lambda e: e.from_queue)
    assert f"positions {list(touch.queue_positions)}" in sentence(touch)
    assert "no admissions in a step that preempted" in sentence(
        first(events.BLOCKED, lambda e: e.reason == "preempted_this_step")
    )
    refused = first(events.RESET, lambda e: not e.ok)
    assert "refused" in sentence(refused) and str(refused.blocks_in_use) in sentence(refused)
    assert "dropped" in sentence(first(events.RESET, lambda e: e.ok))


def test_sampled_tokens_are_decoded_by_the_function_passed_in():
    e = first(events.SAMPLED)
    rid, tok = next(iter(e.tokens.items()))
    assert f"{rid} → “<{tok}>”" in sentence(e, "en", decode=lambda ids: f"<{ids[0]}>")
    assert f"{rid} → “{tok}”" in sentence(e, "en")

    class EmptyCache:  # a decoder with an empty cache is falsy, and still used
        def __len__(self):
            return 0

        def __call__(self, ids):
            return f"<{ids[0]}>"

    assert f"{rid} → “<{tok}>”" in sentence(e, "en", decode=EmptyCache())


def test_step_sentences_and_changed_blocks():
    rec = next(
        r
        for _, recs in every_kind_runs()
        for r in recs
        if any(e.kind == events.EVICTED for e in r.events)
    )
    out = step_sentences(rec.events, "en")
    assert [k for k, _ in out] == [e.kind.value for e in rec.events]
    assert all(s.startswith(ICONS[EventKind(k)] + " ") for k, s in out)
    pool_events = [
        e
        for e in rec.events
        if e.kind in (events.ALLOCATED, events.FREED, events.EVICTED, events.TOUCHED, events.CACHED)
    ]
    assert changed_blocks(rec.events) == {b for e in pool_events for b in e.block_ids}
    assert changed_blocks([e for e in rec.events if e.kind == events.SCHEDULED]) == set()


def test_group_shown_only_for_hybrid():
    e = first(events.ALLOCATED, lambda e: e.group == 1)
    assert "(g1)" in sentence(e, "en", multi_group=True) and "(g1)" in sentence(
        e, "zh", multi_group=True
    )
    assert "(g1)" not in sentence(e, "en", multi_group=False)


def test_the_cli_log_uses_the_same_sentences():
    import io

    from paged_kv_lab.cli.main import _log_step

    rec = every_kind_runs()[1][1][2]
    out = io.StringIO()
    _log_step(rec, out, "zh")
    text = out.getvalue()
    for e in rec.events:
        assert sentence(e, "zh", multi_group=True) in text
