"""Casebook case 14 ("Turning on MTP/EAGLE lowered my hit rate") in a real browser (Debian's
chromium, Playwright): the case plays with the EAGLE head's drafts narrated as the head's, the hit
rate vLLM logs is shown, and the switch disable_eagle_block_drop raises it."""

import pytest

from support.browser import open_player, wait_step

pytestmark = [pytest.mark.browser]


def metric_values(page) -> list[str]:
    return page.locator('[data-testid="stMetricValue"]').all_inner_texts()


def test_the_switch_gives_back_the_dropped_block(server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1500, "height": 2000})
    open_player(page, server + "/casebook?lesson=case-eagle-drop")
    page.wait_for_selector('[data-testid="stMetricValue"]', timeout=180_000)
    assert "24.2%" in metric_values(page)  # B loses one block, C's one-block hit is gone
    # the head's drafts are narrated as the head's
    drafted = page.locator('.pkv-events li[data-kind="draft_proposed"]')
    for step in range(1, 8):
        if drafted.count():
            break
        page.keyboard.press("ArrowRight")
        wait_step(page, step)
    assert drafted.count() and "EAGLE-style head drafts" in drafted.first.inner_text()
    page.get_by_text("Try the fix: disable_eagle_block_drop").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="stMetricValue"]')]
            .some(e => e.innerText.includes('48.5%'))""",
        timeout=180_000,
    )
    page.close()
