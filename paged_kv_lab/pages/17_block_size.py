"""Topic page 'block size' (the page itself: app/topic_pages.py)."""

from paged_kv_lab.ui.entry import run_page
from paged_kv_lab.ui.topic_pages import render_block_size

run_page(render_block_size)
