"""Tool page 'real workloads' (the page itself: app/workloads_page.py)."""

from paged_kv_lab.ui.entry import run_page
from paged_kv_lab.ui.workloads_page import render_workloads_page

run_page(render_workloads_page)
