"""The cache-aware admission lesson's claim, over its runs (tiny model, SmolLM2's tokenizer):
with cache_aware_admission_window 0 the cold request C goes first and its blocks evict A1's, so
A2 (the conversation's next turn) misses; with the window on A2 goes first and hits, and C
waits instead; with the roomy pool (usage below cache_aware_admission_threshold) the window
changes nothing. The "why was B admitted before A?" answer names what decided each order."""

import dataclasses

import pytest

from kvcore.model import smollm2_available
from paged_kv_lab.content import lesson
from paged_kv_lab.store.timeline import lesson_run
from paged_kv_lab.why.explain import RecordedSteps
from paged_kv_lab.why.explain_admission import admissions, explain_order, order_sentences
from support.kv import events_of


@pytest.fixture(scope="module")
def runs(tiny_model):
    if not smollm2_available():
        pytest.skip("the lesson's token ids come from SmolLM2's tokenizer")
    out = {}
    for window in (0, 4):
        for blocks in (20, 32):
            run = lesson_run(
                lesson("admission"),
                tiny_model,
                {"cache_aware_admission_window": window, "num_gpu_blocks": blocks},
            )
            run.run_to_end(timeout=300)
            assert run.finished
            out[window, blocks] = RecordedSteps(
                run.initial, tuple(run.records), run.scenario.engine
            )
    return out


def by_id(steps):
    return {a.request_id: a for a in admissions(steps)}


def test_window_off_the_cold_request_evicts_the_warm_turns_blocks(runs):
    steps = runs[0, 20]
    rows = by_id(steps)
    assert rows["C"].step < rows["A2"].step
    assert rows["A2"].hit_tokens == 0 and rows["C"].waiting_steps == 0
    assert rows["A2"].waiting_steps > 0
    evicted = events_of(steps.records, "evicted", "C")
    assert evicted and any(e.block_ids[0] in held_by_a1(steps) for e in evicted)
    x = explain_order(steps, "A2", "C")
    assert x.verdict == "arrived_first" and x.window == 0
    assert x.cached_first == 16  # A2's prefix was cached when C went first


def held_by_a1(steps) -> set:
    return {
        b
        for rec in steps.records
        for ev in rec.events
        if ev.kind == "freed" and ev.request_id == "A1"
        for b in ev.block_ids
    }


def test_window_on_the_warm_turn_goes_first_and_hits(runs):
    off, on = runs[0, 20], runs[4, 20]
    rows_off, rows_on = by_id(off), by_id(on)
    assert rows_on["A2"].step < rows_on["C"].step
    assert rows_on["A2"].hit_tokens == 16
    assert rows_on["A2"].waiting_steps == 0
    # the fairness cost: C waits the steps A2 waited without the window
    assert rows_on["C"].waiting_steps == rows_off["A2"].waiting_steps > 0
    hit = lambda s: s.last_snapshot().prefix_cache["hit_rate"]  # noqa: E731
    assert hit(on) > hit(off)
    x = explain_order(on, "C", "A2")
    assert x.verdict == "reordered"
    assert x.usage >= x.threshold == 0.5 and x.window == 4
    assert (x.cached_first, x.cached_second) == (0, 16)
    said = " ".join(order_sentences(x, "en"))
    assert "cache_aware_admission_window 4" in said and "0.50" in said
    assert "_reorder_waiting_by_cached_prefix" in said
    assert order_sentences(x, "zh") != order_sentences(x, "en")


def test_below_the_threshold_the_order_is_unchanged(runs):
    for window in (0, 4):
        rows = by_id(runs[window, 32])
        assert rows["C"].step < rows["A2"].step
        assert rows["A2"].hit_tokens == 16  # room for both: nothing of A1 was evicted
    order = lambda s: [a.request_id for a in sorted(admissions(s), key=lambda a: a.step)]  # noqa: E731
    assert order(runs[0, 32]) == order(runs[4, 32])
    x = explain_order(runs[4, 32], "A2", "C")
    assert x.verdict == "arrived_first" and x.usage < x.threshold


def test_the_answer_names_a_request_that_was_not_admitted_first(runs):
    x = explain_order(runs[4, 20], "A2", "C")
    assert x.verdict == "not_before"
    assert order_sentences(x, "en") == ["C was not admitted before A2."]


def test_the_answer_reads_the_reorder_kvcore_recorded(runs):
    """With the window on, the run records one reorder: A2 went ahead of C, with the usage the
    scheduler compared at that point of the step; the answer takes its numbers from it, and the
    same records without that event no longer say "reordered"."""
    on = runs[4, 20]
    told = [(r.step, e) for r in on.records for e in r.events if e.kind == "cache_aware_reorder"]
    ((step, ev),) = told
    assert "C" in ev.moved_ahead["A2"] and ev.order_before.index("C") < ev.order_before.index("A2")
    assert ev.window == 4 and ev.usage >= ev.threshold == 0.5
    x = explain_order(on, "C", "A2")
    assert (x.verdict, x.reorder_step, x.usage) == ("reordered", step, ev.usage)
    assert (x.cached_first, x.cached_second) == (
        ev.num_cached_tokens["C"],
        ev.num_cached_tokens["A2"],
    )
    assert f"at step {step}" in " ".join(order_sentences(x, "en"))
    stripped = RecordedSteps(
        on.initial,
        tuple(
            dataclasses.replace(
                r, events=tuple(e for e in r.events if e.kind != "cache_aware_reorder")
            )
            for r in on.records
        ),
        on.settings,
    )
    assert explain_order(stripped, "C", "A2").verdict == "other"
    assert not any(
        e.kind == "cache_aware_reorder"
        for r in runs[0, 20].records + runs[4, 32].records
        for e in r.events
    )  # the window off, or usage under the threshold: the order never changed
