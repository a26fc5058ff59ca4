"""Which script runs of the app hold back the work done ahead of visitors (ui/entry.py's
``main``; the policy itself: tests/lab/test_visitors.py): a new session's first run and a run that
draws another page, not a rerun of the same page (a widget, a poll), which would otherwise hold
back the very run a page polls for."""

from paged_kv_lab.store.server_cache import VISITORS
from support.app import app, open_page


def test_a_first_visit_and_a_new_page_are_drawn_first_and_a_rerun_is_not():
    before = VISITORS.last_drawn
    at = app()  # a new session's first run (the home page)
    first = VISITORS.last_drawn
    assert first > before, "a new session's first run counts as a page drawn"
    at.run()  # the same page again
    assert VISITORS.last_drawn == first, "a rerun of the same page is not a page drawn"
    open_page(at, "blocks").run()
    assert not at.exception, [e.value for e in at.exception]
    assert VISITORS.last_drawn > first, "another page of the same session counts"
