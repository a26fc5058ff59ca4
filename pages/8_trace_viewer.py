"""Tool page 'trace viewer' (the page itself: lesson/trace_page.py)."""
from lesson.entry import run_page
from lesson.trace_page import render_trace_page

run_page(render_trace_page)
