"""Lesson page 'prefix': layout and controls come from lesson.view."""
from lesson.view import render_lesson

render_lesson("prefix")
