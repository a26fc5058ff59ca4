"""The myths and the quiz as data (issue #30): ``lesson/myths.yaml`` and ``lesson/quiz.yaml`` load
validated, a broken file is refused with its name and the field, every myth has its sentences in
every language and a live check, every source it cites is where vLLM 0.34.0 has it, the outcomes
the pinned runs do not reach still read right, and the Python of the myths, the quiz and the
topics holds no Chinese."""

import dataclasses
import re
from pathlib import Path

import pytest

from paged_kv_lab.content import myths as M
from paged_kv_lab.content import quiz as Q
from paged_kv_lab.text.i18n import catalogue, languages, tr
from support.paths import ROOT
from support.words import FULL_RUN_S, new_run

MYTH_IDS = [
    "timestamp_lru",
    "defragmentation",
    "swap",
    "copy_on_write",
    "radix_tree",
    "evict_blocks",
    "delay_cache_blocks",
    "ext_comp",
    "token_ids_only",
]


def test_every_myth_has_its_sentences_in_every_language_and_a_live_check():
    myths = M.load_myths()
    assert [m.id for m in myths] == MYTH_IDS
    assert set(M.LIVE) == set(MYTH_IDS)
    keys = catalogue()
    for m in myths:
        for key in (m.claim.key, m.truth.key):
            assert set(keys[key]) >= {"en", "zh"}, key
        live = [k for k in keys if k.startswith(f"myth.{m.id}.live")]
        assert live, m.id
        assert all(set(keys[k]) >= {"en", "zh"} for k in live), m.id


def mirror(file: str) -> Path:
    """Our copy of a vLLM file: vllm/v1/X.py is kvcore/X.py, vllm/X.py kvcore/X.py."""
    rest = file.removeprefix("vllm/v1/") if file.startswith("vllm/v1/") else file[len("vllm/") :]
    return ROOT / "kvcore" / rest


def test_every_source_is_in_our_mirror_of_vllm_or_cited_by_the_truth():
    """A source kvcore mirrors must define the name there; one it does not mirror must be a name
    the truth cites (test_words_right checks those against vLLM 0.34.0's own source)."""
    for m in M.load_myths():
        truth = tr(m.truth, "en")
        for s in m.sources:
            path = mirror(s.file)
            defined = path.is_file() and re.search(
                rf"^\s*(def|class) {s.name}\b", path.read_text(encoding="utf-8"), re.M
            )
            assert defined or f"`{s.name}`" in truth, (m.id, s)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "text, said",
    [
        ("- id: timestamp_lru\n  seed: 2\n", "myths.yaml: [0].sources: Field required"),
        (
            "- id: timestamp_lru\n  seed: 2\n  sources: [{file: vllm/x.py, name: f}]\n  sede: 1\n",
            "myths.yaml: [0].sede: Extra inputs are not permitted",
        ),
        (
            "- id: timestamp_lru\n  seed: 2\n  sources: [{file: kvcore/x.py, name: f}]\n",
            "myths.yaml: [0].sources[0].file: String should match pattern",
        ),
        (
            "- id: nope\n  seed: 2\n  sources: [{file: vllm/x.py, name: f}]\n",
            "myths.yaml: [0].id: the catalogue has no 'myth.nope.claim'",
        ),
        (
            "- id: swap\n  seed: 2\n  sources: [{file: vllm/x.py, name: f}]\n" * 2,
            "myths.yaml: [1].id: 'swap' is repeated",
        ),
        (
            "- id: swap\n  seed: 2\n  sources: [{file: vllm/x.py, name: f}]\n",
            "myths.yaml: (top): live checks without a myth",
        ),
        ("- id: [unclosed\n", "myths.yaml: not a readable YAML file"),
    ],
)
def test_a_broken_myths_file_names_the_file_and_the_field(tmp_path, text, said):
    with pytest.raises(ValueError) as e:
        M.load_myths(write(tmp_path, "myths.yaml", text))
    assert str(e.value).startswith(f"{tmp_path}/{said}"), str(e.value)


GOOD_QUIZ = (Path(Q.__file__).with_name("quiz.yaml")).read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "old, new, said",
    [
        ("asked_on: [evicted]", "asked_on: [evictd]", "questions[2].asked_on[0]: 'evictd' is no"),
        (
            "asked_on: [evicted]",
            "asked_on: [allocated]",
            "questions[3].asked_on[0]: 'allocated' already raises 'evict'",
        ),
        ("fallback: free", "fallback: none", "fallback: 'none' is no question"),
        ("order: [preempted,", "order: [freed,", "order[0]: 'freed' raises no question"),
        ("  - id: free\n    asked_on: []\n", "", "fallback: 'free' is no question"),
        ("  - id: victim", "  - id: victim\n    ask: 1", "questions[0].ask: Extra inputs"),
    ],
)
def test_a_broken_quiz_file_names_the_file_and_the_field(tmp_path, old, new, said):
    assert old in GOOD_QUIZ
    path = write(tmp_path, "quiz.yaml", GOOD_QUIZ.replace(old, new, 1))
    with pytest.raises(ValueError) as e:
        Q.load_quiz(path)
    assert str(e.value).startswith(f"{tmp_path}/quiz.yaml: ") and said in str(e.value), str(e.value)


def test_the_shipped_quiz_asks_each_question_it_computes():
    quiz = Q.load_quiz()
    assert {q.id for q in quiz.questions} == set(Q.ASK)
    assert set(quiz.by_event.values()) | {quiz.fallback} == set(Q.ASK)


def live_of(snaps, records, myth_id: str, lang: str) -> str:
    return "".join(tr(t, lang) for t in M.LIVE[myth_id](snaps, records))


def test_a_hit_that_ends_inside_a_block_is_counted():
    """No run without a model ends a hit inside a block (vLLM only does with Mamba groups in
    align mode): the sentence for it, on a snapshot where one request's hit is 6 tokens."""
    run = new_run("evict")
    run.run_to_end(timeout=FULL_RUN_S)
    snaps = run.snapshots()
    last = snaps[-1]
    reqs = tuple(
        dataclasses.replace(r, num_cached_tokens=6) if i == 0 else r
        for i, r in enumerate(last.requests)
    )
    snaps = [*snaps[:-1], dataclasses.replace(last, requests=reqs)]
    assert last.block_size == 4
    en = live_of(snaps, None, "copy_on_write", "en")
    zh = live_of(snaps, None, "copy_on_write", "zh")
    assert "Hits so far: 6" in en and en.endswith("1 of them ending inside a block."), en
    assert zh.endswith("其中 1 个结束在块中间。"), zh


def test_more_hashed_blocks_than_tokens_fill_would_be_named():
    """The delay_cache_blocks check names where a table held more hashed blocks than its real
    tokens fill (vLLM never lets that happen: a snapshot made up to show the sentence)."""
    run = new_run("evict")
    run.goto(3)
    snaps = run.snapshots()
    now = snaps[-1]
    hashed = [r for r in now.requests if r.block_tables and r.block_tables[0]]
    assert hashed
    r0 = dataclasses.replace(hashed[0], num_prompt_tokens=0, num_output_tokens=0)
    fake = dataclasses.replace(
        now, requests=tuple(r0 if r is hashed[0] else r for r in now.requests)
    )
    full = sum(1 for b in hashed[0].block_tables[0] if now.blocks[b].block_hash is not None)
    assert full > 0
    en = live_of([*snaps[:-1], fake], None, "delay_cache_blocks", "en")
    assert f"outnumbered the full blocks of real tokens at: {r0.request_id}@{now.step}." in en


def test_every_language_renders_every_myth_and_question():
    run = new_run("cpu_tier")
    run.run_to_end(timeout=FULL_RUN_S)
    snaps, records = run.snapshots(), run.records
    for lang in languages():
        secs = M.myth_sections(snaps, lang, records)
        assert len(secs) == len(MYTH_IDS) and all(all(part for part in s) for s in secs)
        for i in range(len(records)):
            p = Q.make_prediction(snaps[i], records[i], lang)
            assert p is None or (p.prompt and p.explain and all(p.options))


CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def test_the_python_of_the_myths_the_quiz_and_the_topics_holds_no_chinese():
    files = [
        "paged_kv_lab/content/myths.py",
        "paged_kv_lab/content/quiz.py",
        "paged_kv_lab/content/topics.py",
        "paged_kv_lab/ui/topic_pages.py",
    ]
    found = [f for f in files if CJK.search((ROOT / f).read_text(encoding="utf-8"))]
    assert not found, found


def test_a_language_added_as_data_says_every_myth_and_question(tmp_path, monkeypatch):
    """A pseudo-language from data alone (each English text wrapped in ⟦ ⟧): the myths and the
    questions say nothing outside its texts but ids and numbers."""
    import json

    from paged_kv_lab.text.i18n import TEXT_DIRS_ENV

    def wrap(text):
        return [wrap(t) for t in text] if isinstance(text, (list, tuple)) else f"⟦{text}⟧"

    (tmp_path / "languages.json").write_text(json.dumps({"xx": "Pseudo"}), encoding="utf-8")
    pseudo = {k: {"xx": wrap(v["en"])} for k, v in catalogue().items() if "en" in v}
    (tmp_path / "pseudo.json").write_text(json.dumps(pseudo), encoding="utf-8")
    monkeypatch.setenv(TEXT_DIRS_ENV, str(tmp_path))
    assert "xx" in languages()

    def outside(text: str) -> str:
        while "⟦" in text:
            text = re.sub(r"⟦[^⟦⟧]*⟧", "", text)
        return text

    said = []
    for name in ("evict", "preempt", "cpu_tier", "hybrid"):
        run = new_run(name)
        run.run_to_end(timeout=FULL_RUN_S)
        snaps, records = run.snapshots(), run.records
        for i in range(1, len(snaps) + 1):
            for sec in M.myth_sections(snaps[:i], "xx", records[: i - 1]):
                said += sec
            if i < len(snaps):
                p = Q.make_prediction(snaps[i - 1], records[i - 1], "xx")
                if p is not None:
                    said += [p.prompt, p.explain, *p.options]
    left = {outside(s) for s in said} - {""}
    words = [s for s in left if re.search(r"[A-Za-z]{2,}", s) or CJK.search(s)]
    assert len(said) > 500 and not words, words[:5]
