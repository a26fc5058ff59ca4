"""Tool page 'join a class' (the page itself: ui/class_panel.py)."""

from paged_kv_lab.ui.class_panel import render_join_page
from paged_kv_lab.ui.entry import run_page

run_page(render_join_page)
