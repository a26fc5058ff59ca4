"""Lesson 12 "Prefill here, decode there" on SmolLM2 in a real browser (Debian's chromium,
Playwright), on the session's shared SmolLM2 server: stepping it, the player narrates the prefill
replica keeping A's blocks, the transfer step (the decode replica's blocks, A waiting for remote
K/V), the prefill replica's delayed free and the delayed caching when the load lands, each at
the step where the run makes it."""

import re

import pytest
from test_browser import browser, open_player  # noqa: F401

from paged_kv_lab.lesson import BY_ID
from paged_kv_lab.text.i18n import tr

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def words(i: int) -> str:
    """The longest stretch of moment i's sentence without a field, as the player shows it."""
    text = tr(BY_ID["pd"].moments[i].text, "en").replace("**", "").replace("`", "")
    return max(re.split(r"\{\w+\}", text), key=len).strip()


MOMENTS = {i: words(i) for i in range(4)}


def test_the_transfer_the_wait_and_the_delayed_caching_are_narrated(smollm2_server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1500, "height": 2000})
    open_player(page, smollm2_server + "/prefill_decode", done=False)
    assert "Prefill here, decode there" in page.inner_text("h1")
    seen: dict[int, int] = {}
    for step in range(1, 7):  # bounded: A's journey takes the first four steps
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f'.pkv[data-step="{step}"]', timeout=180_000)
        said = page.locator('[data-role="narration"]').inner_text()
        for i, start in MOMENTS.items():
            if i not in seen and start in said:
                seen[i] = step
        if step == 2:  # the transfer step: A waits for the K/V the decode replica pulls
            assert "waiting_for_remote_kvs" in page.locator('[data-role="outputs"]').inner_text()
            assert page.locator('.pkv-events li[data-kind="allocated"]').count()
    assert list(seen) == [0, 1, 2, 3], seen
    assert list(seen.values()) == sorted(seen.values())
    page.close()
