"""Tool page 'join a class' (the page itself: app/classroom.py)."""

from paged_kv_lab.app.classroom import render_join_page
from paged_kv_lab.app.entry import run_page

run_page(render_join_page)
