"""Tool page 'casebook' (the page itself: app/casebook_page.py)."""

from paged_kv_lab.ui.casebook_page import render_casebook
from paged_kv_lab.ui.entry import run_page

run_page(render_casebook)
