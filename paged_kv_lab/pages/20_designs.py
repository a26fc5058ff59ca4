"""Topic lesson 'hash chains vs radix tree' (the page: app/designs_page.py)."""

from paged_kv_lab.ui.designs_page import render_designs_page
from paged_kv_lab.ui.entry import run_page

run_page(render_designs_page)
