"""Topic page 'what a hit buys' (the page itself: ui/topic_pages.py)."""

from ui.entry import run_page
from ui.topic_pages import render_ttft

run_page(render_ttft)
