"""Tool page 'casebook' (the page itself: app/casebook_page.py)."""

from paged_kv_lab.app.casebook_page import render_casebook
from paged_kv_lab.app.entry import run_page

run_page(render_casebook)
