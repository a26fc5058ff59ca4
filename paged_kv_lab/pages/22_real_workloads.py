"""Tool page 'real workloads' (the page itself: app/workloads_page.py)."""

from paged_kv_lab.app.entry import run_page
from paged_kv_lab.app.workloads_page import render_workloads_page

run_page(render_workloads_page)
