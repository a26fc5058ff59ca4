"""Tool page 'live vLLM' (the page itself: ui/live_page.py)."""

from ui.entry import run_page
from ui.live_page import render_live_page

run_page(render_live_page)
