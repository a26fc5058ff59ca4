"""The lessons, in order: data files (lesson/lessons/*.yaml) read by lesson.catalog."""

from paged_kv_lab.content.catalog import Lesson, Question, load_lessons, load_topic_questions

# Every lesson file (lesson/lessons/*.yaml), loaded and checked once, by id.
_LOADED: dict[str, Lesson] = load_lessons()
LESSONS: tuple[Lesson, ...] = tuple(
    sorted((x for x in _LOADED.values() if x.number > 0), key=lambda x: x.number)
)
# Lessons on one topic each (the registry, app/pages.json, lists them under "Topics").
TOPIC_LESSONS: tuple[Lesson, ...] = (_LOADED["onehash"], _LOADED["designs"])
HOME: Lesson = _LOADED["home"]
BY_ID: dict[str, Lesson] = {lesson.id: lesson for lesson in LESSONS + TOPIC_LESSONS + (HOME,)}
# 'Check yourself' of the topic pages that are not lessons (lesson/topic_questions.yaml), by id.
TOPIC_QUESTIONS: dict[str, tuple[Question, ...]] = load_topic_questions()

__all__ = [
    "LESSONS",
    "TOPIC_LESSONS",
    "BY_ID",
    "HOME",
    "TOPIC_QUESTIONS",
]
