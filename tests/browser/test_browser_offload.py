"""Lesson 10 "A second tier" on SmolLM2 in a real browser (Debian's chromium, Playwright): the
player draws the CPU pool and its own free queue beside the GPU's, step by step, and the page
shows the hit split by tier with the time to first token."""

import pytest

from support.browser import open_player, wait_idle
from support.paths import ROOT

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def cpu_drawn(page) -> dict:
    """What the player's CPU panel shows: each CPU block's classes, and the CPU free queue."""
    cells = page.locator(".pkv-cpu-grid .pkv-block").evaluate_all(
        "els => els.map(e => [Number(e.dataset.cpuBlock), e.className])"
    )
    queue = page.locator(".pkv-cpu-queue [data-cpu-block]").evaluate_all(
        "els => els.map(e => Number(e.dataset.cpuBlock))"
    )
    return {"cells": cells, "queue": queue}


def test_the_second_tier_lesson_draws_both_pools_on_smollm2(smollm2_server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1500, "height": 2200})
    open_player(page, smollm2_server + "/second_tier")
    assert "A second tier" in page.inner_text("h1")
    assert page.locator('[data-role="cpu-panel"]').is_hidden()  # step 0: no step drawn yet
    n = int(page.locator(".pkv").get_attribute("data-total"))
    seen_load = False
    for step in range(1, n + 1):  # bounded: one press per recorded step
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f'.pkv[data-step="{step}"]', timeout=10_000)
        cpu = cpu_drawn(page)
        assert [c[0] for c in cpu["cells"]] == list(range(1, 24)), "23 usable CPU blocks"
        cached = {i for i, cls in cpu["cells"] if "cached" in cls.split()}
        # the CPU free queue holds every CPU block that is not pinned, cached ones included
        pinned = {i for i, cls in cpu["cells"] if "pkv-pinned" in cls.split()}
        assert set(cpu["queue"]) == set(range(1, 24)) - pinned
        if page.locator('.pkv-events li[data-kind="cpu_load"]').count():
            seen_load = True
            # the copies loaded this step came from cached CPU blocks, which keep their hashes
            loaded = page.locator('.pkv-events li[data-kind="cpu_load"]').inner_text()
            assert cached and "CPU→GPU" in loaded
            assert "WAITING_FOR_REMOTE_KVS" in page.inner_text(".pkv-events")
    assert seen_load, "D's prefix was loaded back from the CPU"
    # the page's table follows the cursor the player reports (a fragment rerun)
    try:
        page.wait_for_function(
            "() => document.body.innerText.includes('TTFT (ms)')"
            " && document.body.innerText.includes('CPU hit')",
            timeout=120_000,
        )
    except Exception:
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "test-artifacts" / "second-tier.png"), full_page=True)
        raise
    wait_idle(page)
    text = page.inner_text("body")
    assert "GPU hit" in text and "miss" in text
    page.close()
