"""In a real browser (chromium via Playwright), the static export of a run: generated text with a
line break stays in its row of "Generated text", and a run stopped by the step cap says so, in EN
and 中文, naming PAGED_KV_LAB_MAX_RUN_STEPS (issue 26)."""

import pytest
from test_browser import browser, wait_step  # noqa: F401  (fixtures)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def tiny():
    from kvcore.model import load_model

    return load_model("tiny-random", "cpu")


def capped_run(tiny, steps: int):
    """The prefix lesson's run on a store that computes at most ``steps`` steps."""
    from lessons import BY_ID
    from record.budget import Limits
    from runstore.runtime import lesson_run
    from runstore.store import RunStore

    store = RunStore(max_steps=steps, limits=Limits())
    run = lesson_run(BY_ID["prefix"], tiny, store=store)
    run.run_to_end(timeout=120)
    return run, store


def open_export(browser, tmp_path, html: str):  # noqa: F811
    path = tmp_path / "run.html"
    path.write_text(html)
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(path.as_uri())
    page.wait_for_selector('.pkv[data-done="true"]', timeout=30_000)
    return page


def test_generated_text_with_a_newline_stays_in_its_row(browser, tmp_path, tiny):  # noqa: F811
    from dataclasses import replace

    from player import run_payload, static_html

    run, store = capped_run(tiny, 400)
    store.close()

    def two_lines(snap):
        reqs = tuple(
            replace(r, text=f"{r.text or 'x'}\nsecond line\r\nthird") for r in snap.requests
        )
        return replace(snap, requests=reqs)

    records = [replace(r, snapshot=two_lines(r.snapshot)) for r in run.records]
    html = static_html(run_payload(run.initial, records, done=True))
    page = open_export(browser, tmp_path, html)
    page.keyboard.press("End")
    wait_step(page, len(run.records))
    rows = page.locator(".pkv-outputs > div[data-req]")
    assert rows.count() >= 1
    for i in range(rows.count()):
        text = rows.nth(i).locator(".pkv-text")
        shown = text.inner_text()
        assert "\n" not in shown and "\u21b5" in shown, shown
        lines = text.evaluate("e => e.getClientRects().length")
        assert lines == 1, "the whole text is drawn on the row's one line"
    page.close()


@pytest.mark.parametrize("lang,words", [("en", "at most 3 steps"), ("zh", "最多计算 3 步")])
def test_a_run_stopped_by_the_step_cap_says_so(browser, tmp_path, tiny, lang, words):  # noqa: F811
    from ui.player_component import export_html

    run, store = capped_run(tiny, 3)
    try:
        assert run.run.capped_at == 3 and len(run.records) == 3
        html = export_html(run, lang, "t")
    finally:
        store.close()
    page = open_export(browser, tmp_path, html)
    page.keyboard.press("End")
    wait_step(page, 3)
    page.keyboard.press("ArrowRight")  # Step at the end says why it is the end
    notice = page.locator('[data-role="notice"]').inner_text()
    assert words in notice and "PAGED_KV_LAB_MAX_RUN_STEPS" in notice, notice
    page.close()
