"""Lesson page 'specdec' (the layout and controls are shared: lesson/view.py)."""
from lesson.entry import lesson_page

lesson_page("specdec")
