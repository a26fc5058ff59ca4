"""Topic page 'block size' (the page itself: ui/topic_pages.py)."""

from ui.entry import run_page
from ui.topic_pages import render_block_size

run_page(render_block_size)
