"""Topic page 'block size' (the page itself: app/topic_pages.py)."""

from paged_kv_lab.app.entry import run_page
from paged_kv_lab.app.topic_pages import render_block_size

run_page(render_block_size)
