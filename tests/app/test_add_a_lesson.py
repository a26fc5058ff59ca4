"""Adding a lesson is one folder and one line of the page registry (docs/lessons.md: adding a
lesson): a copy of the content folder gets a new lesson, made from an existing lesson's folder
under a new id, and its line in the registry; the app plays it on its own page, titled and
narrated, and the class pack carries it. Nothing else changes: no Python, no page file, no other
catalogue file.

The copy is made where ``PAGED_KV_LAB_CONTENT_DIR`` points (paged_kv_lab/text/i18n.py:
``content_dir``, the one place that says where content lives), on the tiny model."""

import json
import shutil
from pathlib import Path

import pytest

from paged_kv_lab.cli.main import main
from paged_kv_lab.text.i18n import CONTENT_DIR_ENV, DEFAULT_CONTENT_DIR, tr
from support.app import Browser, app

NEW, FROM = "twins", "prefix"  # the new lesson's id, and the lesson whose folder it copies
TITLE = {"en": "Twins: one prompt, twice", "zh": "双胞胎：同一个提示词两次"}
LINE = {"id": NEW, "slug": "twins", "icon": "🧪", "lesson": NEW, "ready": [".pkv[data-total]"]}


def add_lesson(content: Path) -> None:
    """What docs/lessons.md tells an author to do: copy a lesson's folder under the new id, set
    its id and its sentences' keys, add the registry line (here: as lesson 3)."""
    folder = content / "lessons" / NEW
    shutil.copytree(content / "lessons" / FROM, folder)
    data = folder / "lesson.yaml"
    data.write_text(
        data.read_text(encoding="utf-8").replace(f"id: {FROM}\n", f"id: {NEW}\n"), encoding="utf-8"
    )
    text = (folder / "text.json").read_text(encoding="utf-8")
    for kind in ("lesson", "page"):
        text = text.replace(f'"{kind}.{FROM}.', f'"{kind}.{NEW}.')
    entries = json.loads(text)
    entries[f"lesson.{NEW}.title"] = TITLE
    (folder / "text.json").write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")
    registry = content / "pages.json"
    raw = json.loads(registry.read_text(encoding="utf-8"))
    (lessons,) = (s for s in raw["sections"] if s["id"] == "lessons")
    at = next(i for i, p in enumerate(lessons["pages"]) if p["id"] == FROM)
    lessons["pages"].insert(at + 1, LINE)
    registry.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")


@pytest.fixture
def content(tmp_path, monkeypatch):
    """A copy of the shipped content folder (its data only) with the new lesson, in use."""
    root = tmp_path / "content"
    shutil.copytree(DEFAULT_CONTENT_DIR, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    add_lesson(root)
    monkeypatch.setenv(CONTENT_DIR_ENV, str(root))
    return root


def test_a_lesson_is_one_folder_and_one_registry_line(content, tmp_path, capsys):
    from paged_kv_lab.content import lessons
    from paged_kv_lab.content.registry import lesson_page, nav_title

    lesson = lessons().by_id[NEW]
    assert (lesson.number, lesson.icon) == (3, "🧪"), "its place and icon: the registry line's"
    assert [x.id for x in lessons().numbered][:4] == ["blocks", FROM, NEW, "eviction"]
    assert nav_title(lesson_page(NEW), "zh") == f"3. {TITLE['zh']}"

    # the app: its own page at its slug, titled, played and narrated
    at = app(NEW)
    assert [t.value for t in at.title] == [f"🧪 3. {TITLE['en']}"]
    b = Browser(at, NEW).until_recorded(1 << 30)
    assert b.done and b.head["intro"] == tr(f"lesson.{NEW}.intro", "en")
    assert any(s["nar"] for s in b.steps), "the moments of the copied lesson narrate its run"

    # the class pack: in its index, with its player
    out = tmp_path / "pack"
    args = ["pack", "--model", "tiny-random", "--device", "cpu", "--lang", "en"]
    assert main([*args, "--out", str(out), "--lessons", f"{NEW},blocks"]) == 0, capsys.readouterr()
    index = (out / "index.html").read_text(encoding="utf-8")
    assert f"3. {TITLE['en']}" in index and f"{NEW}.html" in index
    players = [p for p in out.rglob(f"{NEW}.html")]
    assert players and TITLE["en"] in players[0].read_text(encoding="utf-8")
