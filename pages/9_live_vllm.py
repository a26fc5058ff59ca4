"""Tool page 'live vLLM' (the page itself: lesson/live_page.py)."""
from lesson.entry import run_page
from lesson.live_page import render_live_page

run_page(render_live_page)
