"""Tool page 'trace viewer' (the page itself: ui/trace_page.py)."""

from ui.entry import run_page
from ui.trace_page import render_trace_page

run_page(render_trace_page)
