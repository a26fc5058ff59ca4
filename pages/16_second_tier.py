"""Lesson page 'secondtier' (the layout and controls are shared: ui/view.py)."""

from ui.entry import lesson_page

lesson_page("secondtier")
