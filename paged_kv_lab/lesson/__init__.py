"""The lessons, in order: data files (lesson/lessons/*.yaml) read by lesson.catalog."""

from paged_kv_lab.lesson.catalog import Lesson, load_lessons

# Every lesson file (lesson/lessons/*.yaml), loaded and checked once, by id.
_LOADED: dict[str, Lesson] = load_lessons()
LESSONS: tuple[Lesson, ...] = tuple(
    sorted((x for x in _LOADED.values() if x.number > 0), key=lambda x: x.number)
)
# Lessons on one topic each, listed under "Topics" in the sidebar (TOPICS).
TOPIC_LESSONS: tuple[Lesson, ...] = (_LOADED["onehash"], _LOADED["designs"])
HOME: Lesson = _LOADED["home"]
BY_ID: dict[str, Lesson] = {lesson.id: lesson for lesson in LESSONS + TOPIC_LESSONS + (HOME,)}

# The page file of each lesson and topic (relative to app.py).
PAGE_FILES: dict[str, str] = {
    "blocks": "pages/1_blocks.py",
    "prefix": "pages/2_prefix_caching.py",
    "eviction": "pages/3_eviction.py",
    "preemption": "pages/4_preemption.py",
    "sliding": "pages/5_sliding_window.py",
    "batching": "pages/6_batching.py",
    "playground": "pages/7_playground.py",
    "parallel": "pages/10_parallel_sampling.py",
    "specdec": "pages/11_spec_decode.py",
    "secondtier": "pages/16_second_tier.py",
    "draftmodel": "pages/15_draft_model.py",
    # topics (TOPICS): a lesson, then pages measured live on the model (ui/topic_pages.py)
    "onehash": "pages/13_one_hash_two_blocks.py",
    "blocksize": "pages/14_block_size.py",
    "collisions": "pages/15_hash_collisions.py",
    "hitttft": "pages/16_what_a_hit_buys.py",
    "designs": "pages/18_designs.py",
}
# The "Topics" section of the sidebar, in order: the ids of TOPIC_LESSONS and of topic pages.
TOPICS: tuple[str, ...] = ("onehash", "blocksize", "collisions", "hitttft", "designs")


def page_url_path(page_file: str) -> str:
    """A page file's URL path: the name Streamlit derives from the file ("2_prefix_caching.py" ->
    "prefix_caching"). It must match: on a new session's first run the browser's path is checked
    against the pages/ folder before st.navigation has run, and any other name gets "Page not
    found"."""
    stem = page_file.rsplit("/", 1)[-1].removesuffix(".py")
    return stem.split("_", 1)[1]


def url_path(lesson_id: str) -> str:
    return page_url_path(PAGE_FILES[lesson_id])


__all__ = [
    "LESSONS",
    "TOPIC_LESSONS",
    "BY_ID",
    "HOME",
    "PAGE_FILES",
    "TOPICS",
    "page_url_path",
    "url_path",
]
