"""A small valid lesson folder and its catalogue entries, and how a broken one is refused: shared by
tests/lab/test_lesson_data.py (lessons as data) and tests/lab/test_rooms.py (a class's own
lessons)."""

import shutil
from pathlib import Path

import pytest

from paged_kv_lab.content.catalog import LessonDataError, load_lesson
from paged_kv_lab.text.i18n import catalogue, content_dir

EXAMPLES = content_dir() / "examples"

# -- a broken file names the file and the field ------------------------------------------
GOOD = """\
id: extra
scenario: scenario.json
moments:
  - kind: cache_hit
    request: C
  - kind: evicted
questions:
  - {options: 2, answer: 1}
toggles:
  - setting: num_gpu_blocks
    options: [12, 24]
  - setting: spec_method
    options:
      - {value: ngram, spec_method: ngram}
      - {value: draft_model, spec_method: draft_model}
focus: [evicted, cache_hit]
panels: [myths]
"""


def good_texts(**drop) -> dict:
    names = ["title", "intro", "moment.1", "moment.2", "question.1.prompt"]
    names += ["question.1.option.1", "question.1.option.2", "question.1.explain"]
    names += ["toggle.num_gpu_blocks", "toggle.spec_method", "toggle.spec_method.1"]
    names += ["toggle.spec_method.2"]
    return {f"lesson.extra.{n}": {"en": f"[{n}]", "zh": f"[{n}]"} for n in names if n not in drop}


def write(tmp_path: Path, text: str, name: str = "extra") -> Path:
    """A lesson folder in the content folder ``tmp_path`` (lessons/<name>/), with ``text`` as its
    lesson.yaml and the shared example eviction.json as its scenario.json."""
    folder = tmp_path / "lessons" / name
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(EXAMPLES / "eviction.json", folder / "scenario.json")
    path = folder / "lesson.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def problems(path: Path, texts: dict) -> str:
    with pytest.raises(LessonDataError) as info:
        load_lesson(path, {**catalogue(), **texts})
    assert all(line.startswith(f"{path}: ") for line in str(info.value).splitlines())
    return str(info.value)
