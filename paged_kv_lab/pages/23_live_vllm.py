"""Tool page 'live vLLM' (the page itself: app/live_page.py)."""

from paged_kv_lab.app.entry import run_page
from paged_kv_lab.app.live_page import render_live_page

run_page(render_live_page)
