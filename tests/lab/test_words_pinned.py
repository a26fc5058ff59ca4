"""What the myths and the quiz say, and at which step: every myth section and quiz question at
every step of six runs without a model (tests/support/words.py), in EN and 中文, against
tests/fixtures/words_pinned.json. The runs reach the myths' live lines and the quiz's outcomes
that no other test reads (tests/lab/test_myths_quiz_data.py checks the ones these runs do not
reach). ``PAGED_KV_LAB_UPDATE_WORDS=1`` rewrites the fixture, for a change of wording that is
meant. (The fixture was first written by the Python of the day before the sentences moved into
data files, issue #30; its topic-page part, a copy of catalogue entries, is retired.)"""

import json
import os

import pytest

from support.words import FIXTURE, LANGS, SCENARIOS, everything, myths_and_quiz


@pytest.fixture(scope="module")
def pinned() -> dict:
    if os.environ.get("PAGED_KV_LAB_UPDATE_WORDS"):
        FIXTURE.write_text(
            json.dumps(everything(), ensure_ascii=False, indent=1) + "\n",
            encoding="utf-8",
        )
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_myths_and_quiz_read_as_before(pinned, name):
    got = myths_and_quiz(name)
    for lang in LANGS:
        want = pinned["runs"][name][lang]
        missing = [t for t in want["texts"] if t not in got[lang]["texts"]]
        extra = [t for t in got[lang]["texts"] if t not in want["texts"]]
        assert not missing and not extra, (lang, missing[:3], extra[:3])
        assert got[lang]["digest"] == want["digest"], f"{name} {lang}: said at other steps"
