"""The lessons, in order."""

from paged_kv_lab.lesson.catalog import Lesson
from paged_kv_lab.lesson.home import LESSON as HOME
from paged_kv_lab.lesson.l1_blocks import LESSON as L1
from paged_kv_lab.lesson.l2_prefix import LESSON as L2
from paged_kv_lab.lesson.l3_eviction import LESSON as L3
from paged_kv_lab.lesson.l4_preemption import LESSON as L4
from paged_kv_lab.lesson.l5_sliding import LESSON as L5
from paged_kv_lab.lesson.l6_batching import LESSON as L6
from paged_kv_lab.lesson.l7_playground import LESSON as L7
from paged_kv_lab.lesson.l8_parallel_sampling import LESSON as L8
from paged_kv_lab.lesson.l9_spec_decode import LESSON as L9
from paged_kv_lab.lesson.l10_second_tier import LESSON as L10
from paged_kv_lab.lesson.l11_draft_model import LESSON as L11
from paged_kv_lab.lesson.t_designs import LESSON as T_DESIGNS
from paged_kv_lab.lesson.t_one_hash import LESSON as T_ONE_HASH

LESSONS: tuple[Lesson, ...] = (L1, L2, L3, L4, L5, L6, L7, L8, L9, L10, L11)
# Lessons on one topic each (the registry, app/pages.json, lists them under "Topics").
TOPIC_LESSONS: tuple[Lesson, ...] = (T_ONE_HASH, T_DESIGNS)
BY_ID: dict[str, Lesson] = {lesson.id: lesson for lesson in LESSONS + TOPIC_LESSONS + (HOME,)}

__all__ = [
    "LESSONS",
    "TOPIC_LESSONS",
    "BY_ID",
    "HOME",
]
