"""Tool page 'live vLLM' (the page itself: app/live_page.py)."""

from paged_kv_lab.ui.entry import run_page
from paged_kv_lab.ui.live_page import render_live_page

run_page(render_live_page)
