"""The cache-aware admission lesson on SmolLM2 in a real browser (Debian's chromium, Playwright),
on the session's shared SmolLM2 server: opened with the window on, it steps to the end with A2's
hit narrated where the run makes it, and under the player the table sets both runs side by side
(the window off: C first, A2 misses; on: A2 first with its 16-token hit, C waiting instead)."""

import re

import pytest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.text.i18n import tr
from support.browser import open_player, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def words(i: int) -> str:
    """The longest stretch of moment i's sentence without a field, as the player shows it."""
    text = tr(BY_ID["admission"].moments[i].text, "en").replace("**", "").replace("`", "")
    return max(re.split(r"\{\w+\}", text), key=len).strip()


def test_the_lesson_steps_on_smollm2_with_both_runs_side_by_side(smollm2_server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1500, "height": 2600})
    open_player(
        page,
        smollm2_server + "/cache_aware_admission?lesson=admission&cache_aware_admission_window=4",
    )
    assert "Cache-aware admission" in page.inner_text("h1")
    total = int(page.locator(".pkv").get_attribute("data-total"))
    said = []
    for step in range(1, total + 1):
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f'.pkv[data-step="{step}"]', timeout=60_000)
        said.append(page.locator('[data-role="narration"]').inner_text())
    hit = [i for i, text in enumerate(said, 1) if words(3) in text]
    assert hit and hit[0] == 5, said  # A2 hits at step 5, before C is admitted
    wait_idle(page)
    table = page.locator(".st-key-admission-compare")
    # the second run is computed after the page draws its container: wait for both rows (a
    # loaded machine drew the table empty first)
    table.locator("tbody tr").nth(1).wait_for(timeout=180_000)
    rows = table.locator("tbody tr").all_inner_texts()
    assert len(rows) == 2, rows
    off, on = rows
    assert off.startswith("cache_aware_admission_window = 0")
    assert on.startswith("cache_aware_admission_window = 4 (shown)")
    assert "C → A2" in off.replace("\t", " ") and "A2 → C" in on.replace("\t", " ")
    page.close()
