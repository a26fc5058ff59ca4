"""Lesson 13 "Hybrid models" in a real browser (Debian's chromium, Playwright), on a server of its
own whose sidebar loads the tests' model: the page plays tiny-hybrid itself. Stepping through the
run, the partial entry, the hit inside a block and the copy-on-write show as their moments, each
at the step where the engine made it (the same lesson run, recorded apart: lesson_run), with the
events' sentences beside them; the block tables are drawn for four groups."""

import pytest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.content.catalog import moment_steps
from paged_kv_lab.store.timeline import lesson_model, lesson_run
from paged_kv_lab.text.i18n import tr
from support.browser import open_player

pytestmark = pytest.mark.browser
LESSON = BY_ID["hybrid"]


def engine_run():
    """The lesson's run, recorded outside the server."""
    run = lesson_run(LESSON, lesson_model("tiny-hybrid", "cpu"))
    run.run_to_end(timeout=300.0)
    return run


def test_the_partial_hit_and_the_copies_show_at_their_steps(server, browser):  # noqa: F811
    run = engine_run()
    found = moment_steps(LESSON, run.records)
    hit_tokens = next(e.num_tokens for r in run.records for e in r.events if e.kind == "cache_hit")
    assert len(found) == len(LESSON.moments), "every moment happens"
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    open_player(page, server + "/hybrid")
    assert tr(LESSON.title, "en") in page.inner_text("h1")
    n = int(page.locator(".pkv").get_attribute("data-total"))
    hit_step = found[2]  # moment 3: B's hit inside a block; moment 4: its copies
    assert found[3] == hit_step
    for step in range(1, n + 1):  # bounded: one press per recorded step
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f'.pkv[data-step="{step}"]', timeout=10_000)
        narration = page.inner_text('[data-role="narration"]')
        kinds = page.locator('[data-role="events"] li').evaluate_all(
            "els => els.map(e => e.dataset.kind)"
        )
        if step == found[0]:  # A's partial entry
            assert "cached_partial" in kinds and "partial entry" in narration
        if step == found[1]:  # A keeps writing: its cached states move to copies
            assert "copied" in kinds and "moves to a copy" in narration
        if step == hit_step:
            assert "cache_hit" in kinds and "copied" in kinds
            assert "every group agrees" in narration and "copy-on-write" in narration
            hit = page.locator('[data-role="events"] li[data-kind="cache_hit"]').first.inner_text()
            assert f"B hit {hit_tokens} cached tokens" in hit and "inside it" in hit
            copies = page.locator('[data-role="events"] li[data-kind="copied"]').all_inner_texts()
            assert sum("B's hit ends inside block" in c for c in copies) == 4
        elif step not in found.values():
            assert "copy-on-write" not in narration
    assert page.locator('[data-role="tables"]').count() == 1
    tables = page.inner_text('[data-role="tables"]')
    assert all(f"{tr('player.group', 'en')} {g}" in tables for g in range(4)), tables
    page.close()
