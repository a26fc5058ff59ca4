"""Topic page 'what else is in a block's hash' (the page itself: app/topic_pages.py)."""

from paged_kv_lab.ui.entry import run_page
from paged_kv_lab.ui.topic_pages import render_hash_keys

run_page(render_hash_keys)
