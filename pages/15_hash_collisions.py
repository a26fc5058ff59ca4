"""Topic page 'hash collisions' (the page itself: ui/topic_pages.py)."""

from ui.entry import run_page
from ui.topic_pages import render_collisions

run_page(render_collisions)
