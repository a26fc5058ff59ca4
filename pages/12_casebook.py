"""Tool page 'casebook' (the page itself: ui/casebook_page.py)."""

from ui.casebook_page import render_casebook
from ui.entry import run_page

run_page(render_casebook)
