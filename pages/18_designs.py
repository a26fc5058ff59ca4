"""Topic lesson 'hash chains vs radix tree' (the page: ui/designs_page.py)."""

from ui.designs_page import render_designs_page
from ui.entry import run_page

run_page(render_designs_page)
