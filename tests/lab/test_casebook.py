"""The casebook (lesson/casebook.py, the cases in lesson/cases/*.yaml): every case's claim
(tests/support/casebook_claims.py) really happens in the engine, before and after its fix, on the
tiny model (SmolLM2's tokenizer, so the same token ids and block decisions) and on SmolLM2 (slow);
and the page renders every case and its switch changes the hit rate shown.
"""

import re

import pytest

from paged_kv_lab.content.casebook import CASES, NUMBERS, issue_url, numbers, run_numbers
from paged_kv_lab.content.catalog import moment_steps
from paged_kv_lab.store.timeline import lesson_run
from paged_kv_lab.text.i18n import catalogue
from paged_kv_lab.ui.panels import narration
from support.casebook_claims import CLAIMS

RUN_WAIT = 300.0


@pytest.fixture(
    scope="module", params=["tiny-random", pytest.param("smollm2", marks=pytest.mark.slow)]
)
def model(request):
    """The tiny model (the suite's shared one) or SmolLM2, run on one torch thread."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    if request.param == "tiny-random":
        yield request.getfixturevalue("tiny_model")
    else:
        yield request.getfixturevalue("smollm2")
    torch.set_num_threads(n)


def finished(lesson, model):
    run = lesson_run(lesson, model)
    run.run_to_end(timeout=RUN_WAIT)
    assert run.finished, lesson.id
    return run


def missing_moments(lesson, records) -> list[str]:
    found = moment_steps(lesson, records)
    return [
        m.kind + (f"/{m.request}" if m.request else "") + (f"/{m.where}" if m.where else "")
        for i, m in enumerate(lesson.moments)
        if m.key and i not in found
    ]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_case_claim_and_moments(case, model):
    before = finished(case.lesson, model)
    after = finished(case.fixed_lesson(), model)
    for lesson, run in ((case.lesson, before), (case.fixed_lesson(), after)):
        assert not missing_moments(lesson, run.records), (
            lesson.id,
            missing_moments(lesson, run.records),
        )
        for step in range(len(run.records) + 1):
            run.goto(step)
            for lang in ("en", "zh"):
                for text in narration(lesson, run, lang):
                    assert not re.search(r"\{[a-z_]+\}", text), (lesson.id, step, text)
    assert CLAIMS[case.id](before.records, after.records) == []
    # the figure's number changes with the switch (a fleet's: over every replica, run_numbers)
    key = case.figure
    shown_before, shown_after = run_numbers(before.records), run_numbers(after.records)
    assert set(NUMBERS) <= set(shown_before) and key in shown_before  # what `figure` may name
    if case.where != "fleet":
        assert shown_before == numbers(before.records[-1].snapshot)
    assert shown_before[key] != shown_after[key]


def test_claims_fail_when_the_runs_are_swapped(tiny_model):
    """A claim is a real check: given the fixed run as "before" (and the other way round), it
    reports what does not hold."""
    for case in CASES:
        before = finished(case.lesson, tiny_model)
        after = finished(case.fixed_lesson(), tiny_model)
        assert CLAIMS[case.id](after.records, before.records), case.id


def test_cases_are_complete_data():
    assert len(CASES) >= 6 and len({c.id for c in CASES}) == len(CASES)
    assert set(CLAIMS) == {c.id for c in CASES}
    numbers_ = [c.number for c in CASES]
    assert numbers_ == sorted(set(numbers_))  # each case its own number, in the casebook's order
    vllm = [c for c in CASES if c.issue.startswith("vllm-project/vllm#")]
    assert {int(c.issue.split("#")[1]) for c in vllm} >= {47430, 48435, 25780, 16016, 5176}
    for case in CASES:
        assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/issues/\d+", case.url)
        assert all(issue_url(r).startswith("https://github.com/") for r in case.related)
        assert case.fix is not None and case.fixed_lesson().id == case.lesson.id + "-fixed"
        texts = [case.title, case.asked, case.answer, case.fix.label, case.fix.explain]
        texts += [case.lesson.intro] + [m.text for m in case.lesson.moments + case.fix.moments]
        for key in texts:  # catalogue keys, each written in both languages
            entry = catalogue()[key]
            assert all(entry.get(lang, "").strip() for lang in ("en", "zh")), (case.id, key)
