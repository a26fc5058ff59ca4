"""Lesson page 'fleet': replicas behind a router (the page itself: app/fleet_page.py)."""

from paged_kv_lab.ui.entry import run_page
from paged_kv_lab.ui.fleet_page import render_fleet_page

run_page(render_fleet_page)
