"""The myths, the quiz and the topic pages say exactly what they said before their sentences
moved from Python into data files (issue #30): every myth section and quiz question at every step
of six runs without a model, and every topic sentence, in EN and 中文, against the fixture
recorded from the Python of the day (tests/support/words.py)."""

import json
import os

import pytest

from paged_kv_lab.text.i18n import tr
from support.words import FIXTURE, LANGS, SCENARIOS, _fields, everything, myths_and_quiz


def render_topic(key: str, lang: str) -> str:
    text = tr(key, lang)
    return tr(key, lang, **_fields(text))


@pytest.fixture(scope="module")
def pinned() -> dict:
    if os.environ.get("PAGED_KV_LAB_UPDATE_WORDS"):
        FIXTURE.write_text(
            json.dumps(everything(render_topic), ensure_ascii=False, indent=1) + "\n",
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


def test_topic_sentences_read_as_before(pinned):
    for key, want in pinned["topics"].items():
        for lang in LANGS:
            assert render_topic(key, lang) == want[lang], (key, lang)
