"""Tool page 'trace viewer' (the page itself: app/trace_page.py)."""

from paged_kv_lab.app.entry import run_page
from paged_kv_lab.app.trace_page import render_trace_page

run_page(render_trace_page)
