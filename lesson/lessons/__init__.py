"""The lessons, in order."""
from lesson.catalog import Lesson

from .home import LESSON as HOME
from .l1_blocks import LESSON as L1
from .l2_prefix import LESSON as L2
from .l3_eviction import LESSON as L3
from .l4_preemption import LESSON as L4
from .l5_sliding import LESSON as L5
from .l6_batching import LESSON as L6
from .l7_playground import LESSON as L7

LESSONS: tuple[Lesson, ...] = (L1, L2, L3, L4, L5, L6, L7)
BY_ID: dict[str, Lesson] = {l.id: l for l in LESSONS + (HOME,)}

# The page file of each lesson (relative to app.py); its url path is the lesson id.
PAGE_FILES: dict[str, str] = {
    "blocks": "pages/1_blocks.py", "prefix": "pages/2_prefix_caching.py", "eviction": "pages/3_eviction.py",
    "preemption": "pages/4_preemption.py", "sliding": "pages/5_sliding_window.py",
    "batching": "pages/6_batching.py", "playground": "pages/7_playground.py",
}

__all__ = ["LESSONS", "BY_ID", "HOME", "PAGE_FILES"]
