"""Lessons and casebook cases as data (content/lessons/<id>/, content/cases/<id>/): every
combination of their switches makes a scenario that loads, a broken file is refused naming the
file and the field, and a lesson is added by adding files only (the whole way, app and class pack
included: tests/app/test_add_a_lesson.py)."""

import itertools
import json
import re
import shutil

import pytest

from paged_kv_lab.content import BY_ID, HOME, LESSONS, TOPIC_LESSONS
from paged_kv_lab.content.casebook import CASES, cases_dir, load_cases
from paged_kv_lab.content.catalog import (
    OPTION_EFFECTS,
    LessonDataError,
    lessons_dir,
    load_lessons,
)
from paged_kv_lab.content.registry import pages
from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.text.i18n import catalogue, content_dir
from support.lesson_files import GOOD, good_texts, problems, write

CJK = re.compile(r"[\u3000-\u30ff\u3400-\u9fff\uff00-\uffef]")
EXAMPLES = content_dir() / "examples"


def played_lessons():
    out = list(LESSONS + TOPIC_LESSONS + (HOME,))
    for case in CASES:
        out += [case.lesson, case.fixed_lesson()]
    return out


def combinations(lesson):
    toggles = lesson.toggles
    for choice in itertools.product(*[[None, *t.options] for t in toggles]):
        yield {t.setting: v for t, v in zip(toggles, choice) if v is not None}


def test_every_combination_of_switches_makes_a_scenario_that_loads():
    """Every lesson's and case's scenario, for every combination of its switches' options at the
    layer counts the app uses (the tiny model's 4, SmolLM2's 30, none), passes the scenario's
    checks; a switch that is an engine setting sets exactly that setting, and no switch changes
    anything but the engine's settings. (Until the tests moved into layers, each of these
    scenarios was compared with a snapshot of the Python lessons the data files replaced,
    tests/fixtures/lesson_scenarios.json: that migration is done and the snapshot retired; each
    lesson's recorded run at its defaults is pinned by tests/lab/test_recorded_runs.py.)"""
    checked = 0
    for lesson in played_lessons():
        base = lesson.scenario_dict()
        for n in (None, 4, 30):
            for over in combinations(lesson):
                d = lesson.scenario_dict(n, over)
                assert load_scenario(d).requests, (lesson.id, n, over)
                assert {k: v for k, v in d.items() if k != "engine"} == {
                    k: v for k, v in base.items() if k != "engine"
                }, (lesson.id, over)
                for setting, value in over.items():
                    if setting not in OPTION_EFFECTS:
                        assert d["engine"][setting] == value, (lesson.id, setting)
                checked += 1
    assert checked > 100


def test_switches_that_are_no_engine_setting_change_only_what_their_option_says():
    sliding, tier, draft = BY_ID["sliding"], BY_ID["secondtier"], BY_ID["draftmodel"]
    eng = sliding.scenario_dict(4, {"layers": "hybrid"})["engine"]
    assert eng["layer_types"] == ["full_attention", "sliding_attention"] * 2
    assert "layer_types" not in sliding.scenario_dict(4, {"layers": "uniform"})["engine"]
    offload = tier.scenario_dict(None, {"failed_load": "D:fail"})["engine"]["cpu_offload"]
    assert offload["fail_loads"] == ["D"] and offload["kv_load_failure_policy"] == "fail"
    assert (
        "fail_loads"
        not in tier.scenario_dict(None, {"failed_load": "none"})["engine"]["cpu_offload"]
    )
    # a value no option has, or a switch the lesson does not offer, changes nothing
    assert tier.scenario_dict(None, {"failed_load": "E:fail"}) == tier.scenario_dict()
    assert sliding.scenario_dict(4, {"spec_method": "ngram"}) == sliding.scenario_dict(4)
    spec = draft.scenario_dict(None, {"spec_method": "ngram"})["engine"]["speculative"]
    assert spec["method"] == "ngram"


def test_every_text_is_a_catalogue_key_in_both_languages():
    texts = catalogue()
    keys = [(lesson.id, k) for lesson in played_lessons() for k in lesson.texts()]
    keys += [(case.id, k) for case in CASES for k in case.texts()]
    for owner, key in keys:
        assert all(texts[key].get(lang, "").strip() for lang in ("en", "zh")), (owner, key)
    for lesson in played_lessons():
        for t in lesson.toggles:
            assert len(t.option_labels) in (0, len(t.options)), (lesson.id, t.setting)
    # every key of a lesson's or case's text.json is shown by it, or by the page that plays it
    shown = {k for _, k in keys}
    shown |= {k for p in pages() if p.lesson for k in (p.title, p.summary)}
    for folder in (lessons_dir(), cases_dir()):
        for path in folder.glob("*/text.json"):
            assert set(json.loads(path.read_text(encoding="utf-8"))) <= shown, path


# what each content folder holds (docs/lessons.md: adding a lesson); besides: a scenario.json
FOLDER_FILES = {
    "lessons": {"lesson.yaml", "text.json", "golden.json"},
    "cases": {"case.yaml", "text.json", "golden.json"},
    "topics": {"text.json"},
}


def test_data_files_hold_no_prose_and_every_folder_has_its_files():
    for kind, files in FOLDER_FILES.items():
        for folder in (content_dir() / kind).iterdir():
            held = {p.name for p in folder.iterdir()}
            assert files <= held, (folder, sorted(files - held))
            assert held - files <= {"scenario.json", "sources.yaml", "questions.yaml"}, folder
            for path in folder.glob("*.yaml"):
                assert not CJK.search(path.read_text(encoding="utf-8")), path
    assert set(BY_ID) == {p.name for p in lessons_dir().iterdir()}
    assert {c.id for c in CASES} == {p.name for p in cases_dir().iterdir()}
    for path in list(EXAMPLES.rglob("*.json")) + list(content_dir().glob("*/*/scenario.json")):
        assert load_scenario(path).requests, path


def test_a_lesson_is_added_by_data_alone(tmp_path):
    """A folder with a YAML file, a scenario and catalogue entries, no Python: the lesson loads,
    its texts are keys of the catalogue, its scenario is the folder's and the engine's loader
    accepts it (its number and icon come with its registry line: tests/app/test_add_a_lesson.py)."""
    path = write(tmp_path, GOOD)
    (path.parent / "text.json").write_text(json.dumps(good_texts()), encoding="utf-8")
    texts = {**catalogue(), **json.loads((path.parent / "text.json").read_text(encoding="utf-8"))}
    lessons = load_lessons(tmp_path / "lessons", texts)
    lesson = lessons["extra"]
    assert (lesson.focus, lesson.panels) == (("evicted", "cache_hit"), ("myths",))
    assert texts[lesson.moments[0].text]["en"] == "[moment.1]" and lesson.summary is None
    assert lesson.questions[0].answer == 1 and len(lesson.questions[0].options) == 2
    eviction = json.loads((EXAMPLES / "eviction.json").read_text(encoding="utf-8"))
    assert lesson.scenario == eviction
    d = lesson.scenario_dict(None, {"num_gpu_blocks": 24})
    assert load_scenario(d).engine.num_gpu_blocks == 24
    assert lesson.toggles[1].option_labels == (
        "lesson.extra.toggle.spec_method.1",
        "lesson.extra.toggle.spec_method.2",
    )


@pytest.mark.parametrize(
    "change, field, message",
    [
        (("scenario:", "colour: red\nscenario:"), "colour", "Extra inputs are not permitted"),
        (("id: extra", "id: extra\nnumber: 12"), "number", "Extra inputs are not permitted"),
        (("answer: 1", "answer: one"), "questions[0].answer", "valid integer"),
        (("- kind: evicted", "- kind: exploded"), "moments[1].kind", "unknown event kind"),
        (("focus: [evicted", "focus: [boom"), "focus[0]", "unknown event kind"),
        (("    request: C", "    request: C\n    where: nowhere"), "moments[0]", "nowhere"),
        (("answer: 1", "answer: 2"), "questions[0]", "not one of the 2 options"),
        (("panels: [myths]", "panels: [charts]"), "panels[0]", "Input should be"),
        (("scenario: scenario.json", "scenario: nowhere.json"), "scenario.file", "nowhere"),
        (("scenario: scenario.json", "scenario: ../../../pyproject.toml"), "scenario.file", ""),
        (("setting: num_gpu_blocks", "setting: num_gpu_blokcs"), "toggles[0]", "blokcs"),
        (
            (
                "{value: ngram, spec_method: ngram}",
                "{value: x, fail_load: {request: A, policy: fail}}",
            ),
            "toggles[1]",
            "not an effect of 'spec_method'",
        ),
        (("options: [12, 24]", "options: [12, 1]"), "toggles[0].options[1]", "num_gpu_blocks"),
        (("id: extra", "id: other"), "id", "must equal its folder's name"),
    ],
)
def test_a_wrong_field_is_named(tmp_path, change, field, message):
    path = write(tmp_path, GOOD.replace(*change))
    text = problems(path, good_texts())
    assert f": {field}" in text and message in text, text


def test_a_missing_or_stray_catalogue_key_is_named(tmp_path):
    path = write(tmp_path, GOOD)
    text = problems(path, good_texts(**{"moment.2": True}))
    assert "moments[1]: catalogue key 'lesson.extra.moment.2' is missing" in text, text
    stray = {**good_texts(), "lesson.extra.moment.3": {"en": "x", "zh": "x"}}
    text = problems(path, stray)
    assert "'lesson.extra.moment.3' belongs to no field of this file" in text, text
    text = problems(path, good_texts(**{"toggle.spec_method.2": True}))
    assert "toggles[1].options[1]: catalogue key 'lesson.extra.toggle.spec_method.2'" in text, text


def test_yaml_that_does_not_parse_is_named(tmp_path):
    path = write(tmp_path, GOOD + "moments: [\n")
    assert "not a readable YAML file" in problems(path, good_texts())


def test_a_case_file_is_checked_the_same_way(tmp_path):
    """The case's folder, in a content folder with the lesson scenario it names."""
    source = (cases_dir() / "short-prefix" / "case.yaml").read_text(encoding="utf-8")
    hybrid = tmp_path / "lessons" / "hybrid"
    hybrid.mkdir(parents=True)
    shutil.copy(lessons_dir() / "hybrid" / "scenario.json", hybrid)
    texts = {k: v for k, v in catalogue().items()}
    path = tmp_path / "cases" / "short-prefix" / "case.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(source, encoding="utf-8")
    folder = tmp_path / "cases"
    assert [c.id for c in load_cases(folder, texts)] == ["short-prefix"]
    path.write_text(source.replace("only_requests: [A, B, C]", "only_requests: [A, Z]"))
    with pytest.raises(LessonDataError) as info:
        load_cases(folder, texts)
    assert f"{path}: scenario.only_requests: no request ['Z']" in str(info.value)
    path.write_text(source.replace("issue: vllm-project/vllm#47430", "issue: vllm#47430"))
    with pytest.raises(LessonDataError) as info:
        load_cases(folder, texts)
    assert f"{path}: issue: String should match pattern" in str(info.value)
    del texts["case.short-prefix.fix.label"]
    path.write_text(source)
    with pytest.raises(LessonDataError) as info:
        load_cases(folder, texts)
    assert "fix: catalogue key 'case.short-prefix.fix.label' is missing" in str(info.value)
