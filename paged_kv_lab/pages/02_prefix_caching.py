"""Lesson page 'prefix' (the layout and controls are shared: app/lesson_page.py)."""

from paged_kv_lab.ui.entry import lesson_page

lesson_page("prefix")
