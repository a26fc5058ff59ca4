"""Tool page 'trace viewer' (the page itself: app/trace_page.py)."""

from paged_kv_lab.ui.entry import run_page
from paged_kv_lab.ui.trace_page import render_trace_page

run_page(render_trace_page)
