"""The lessons the app plays, read from the content folder (``<content>/lessons/<id>/``: see
content/catalog.py) and placed by the page registry (content/registry.py: each lesson's number and
icon are its page's).

``lessons()`` reads them once per content folder (``paged_kv_lab.text.i18n.content_dir``), so a
test that points ``PAGED_KV_LAB_CONTENT_DIR`` at a copy plays the copy. The module's names
``LESSONS`` (the numbered ones, in order), ``TOPIC_LESSONS``, ``HOME``, ``BY_ID`` and
``TOPIC_QUESTIONS`` are read from the content folder in use when they are asked for.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from paged_kv_lab.content import registry
from paged_kv_lab.content.catalog import (
    Lesson,
    LessonDataError,
    Question,
    lessons_dir,
    load_lessons,
    load_topic_questions,
)
from paged_kv_lab.text.i18n import content_dir

HOME_LESSON = "home"  # the lesson the home page (the registry's default page) plays


@dataclass(frozen=True)
class Lessons:
    """Every lesson of one content folder. ``numbered``: the Lessons section's, in its order;
    ``topics``: those of the other pages (the Topics section's); ``home``: the home page's."""

    by_id: dict[str, Lesson]
    numbered: tuple[Lesson, ...]
    topics: tuple[Lesson, ...]
    home: Lesson


def _placed(lesson: Lesson, pages: tuple[registry.Page, ...]) -> Lesson:
    """The lesson with its page's number and icon: the page that plays it, or the page of its id
    (the home page plays lesson ``home``)."""
    page = next((p for p in pages if p.lesson == lesson.id), None)
    page = page or next((p for p in pages if p.id == lesson.id), None)
    if page is None:
        return lesson
    return dataclasses.replace(lesson, number=page.number or 0, icon=page.icon)


@lru_cache(maxsize=4)
def _lessons(root: Path) -> Lessons:
    pages = registry.pages()
    by_id = {k: _placed(v, pages) for k, v in load_lessons(lessons_dir(root)).items()}
    missing = [p for p in pages if p.lesson is not None and p.lesson not in by_id]
    if missing:
        raise LessonDataError(
            registry.registry_file(),
            [
                f"page {p.id!r}: no lesson folder {p.lesson!r} in {lessons_dir(root)}"
                for p in missing
            ],
        )
    if HOME_LESSON not in by_id:
        raise LessonDataError(lessons_dir(root), [f"no lesson folder {HOME_LESSON!r}"])
    played = [p for p in pages if p.lesson is not None]
    return Lessons(
        by_id=by_id,
        numbered=tuple(by_id[p.lesson] for p in played if p.number is not None),
        topics=tuple(by_id[p.lesson] for p in played if p.section != registry.LESSONS_SECTION),
        home=by_id[HOME_LESSON],
    )


def lessons() -> Lessons:
    """The lessons of the content folder in use (read and checked once per folder)."""
    return _lessons(content_dir())


def lesson(lesson_id: str) -> Lesson:
    """One lesson of the content folder in use, by id."""
    return lessons().by_id[lesson_id]


@lru_cache(maxsize=4)
def _topic_questions(root: Path) -> dict[str, tuple[Question, ...]]:
    return load_topic_questions(root / "topics")


def topic_questions() -> dict[str, tuple[Question, ...]]:
    """'Check yourself' of the topic pages that are not lessons (each topic folder's
    ``questions.yaml``), by page id."""
    return _topic_questions(content_dir())


def __getattr__(name: str):
    # the old module-level names, read from the content folder in use when asked for
    if name == "LESSONS":
        return lessons().numbered
    if name == "TOPIC_LESSONS":
        return lessons().topics
    if name == "HOME":
        return lessons().home
    if name == "BY_ID":
        return lessons().by_id
    if name == "TOPIC_QUESTIONS":
        return topic_questions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Lessons",
    "lessons",
    "lesson",
    "topic_questions",
    "LESSONS",
    "TOPIC_LESSONS",
    "BY_ID",
    "HOME",
    "TOPIC_QUESTIONS",
]
