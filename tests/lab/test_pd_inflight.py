"""Lesson "pd"'s in-flight switch (vLLM 0.34's max_num_inflight_kv_loads), over its two runs on
the tiny model: with one running slot per replica, B's pull meets a full decode batch (A runs).
Without the setting the pull starts only once A has finished; with it the pull starts while A
runs, and B runs at the first decode step after A's last."""

import pytest

from kvcore.model import smollm2_available
from paged_kv_lab.content import lesson
from paged_kv_lab.store.timeline import lesson_run
from support.kv import events_of


@pytest.fixture(scope="module")
def runs(tiny_model):
    if not smollm2_available():
        pytest.skip("the lesson's token ids come from SmolLM2's tokenizer")
    out = {}
    for value in (None, 1):
        run = lesson_run(lesson("pd"), tiny_model, {"max_num_inflight_kv_loads": value})
        run.run_to_end(timeout=300)
        assert run.finished
        out[value] = [r for r in run.records if r.replica == "decode"]
    return out


def pull_step(records, rid):
    (rec,) = [r for r in records if rid in r.pulls]
    return rec


def a_finished(records) -> int:
    (step,) = [r.step for r in records if events_of([r], "finished", "A")]
    return step


def b_admitted(records) -> int:
    return min(r.step for r in records if events_of([r], "admitted", "B"))


def test_without_the_setting_the_pull_waits_for_a_free_slot(runs):
    records = runs[None]
    pull = pull_step(records, "B")
    assert pull.step > a_finished(records)
    assert any(e.reason == "max_num_seqs" for e in events_of(records, "blocked", "B"))
    # B runs only after its load has landed: at least one decode step after the pull
    assert b_admitted(records) > pull.step


def test_with_the_setting_the_pull_starts_while_the_batch_is_full(runs):
    records = runs[1]
    pull = pull_step(records, "B")
    assert pull.step < a_finished(records)
    assert pull.snapshot.running == ("A",)  # the one running slot is A's
    # B runs at the first decode step after A's last
    after = [r.step for r in records if r.step > a_finished(records)]
    assert b_admitted(records) == after[0]
    assert b_admitted(records) - a_finished(records) < b_admitted(runs[None]) - a_finished(
        runs[None]
    )
