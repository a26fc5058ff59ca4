"""Tool page 'real workloads' (the page itself: ui/workloads_page.py)."""

from ui.entry import run_page
from ui.workloads_page import render_workloads_page

run_page(render_workloads_page)
