"""Lesson 11 "Lookahead slots: a draft model" on SmolLM2 in a real browser (Debian's chromium,
Playwright): the grid draws each held block's slots, hollow where no token is computed yet, and a
step shows a block that holds only lookahead slots (all hollow) while the draft model's event
names the reserved slots."""

import pytest

from support.browser import open_player

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def slots_drawn(page) -> list[tuple[int, str, int, int]]:
    """Per held block: (id, owners, slots drawn, hollow slots drawn)."""
    return page.locator(".pkv-grid .pkv-block").evaluate_all(
        "els => els.filter(e => e.querySelector('.pkv-slots')).map(e => [Number(e.dataset.block),"
        " e.dataset.owners, e.querySelectorAll('.pkv-slots i').length,"
        " e.querySelectorAll('.pkv-slots i.empty').length])"
    )


def test_reserved_lookahead_slots_are_drawn_on_smollm2(smollm2_server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1500, "height": 2000})
    # the run streams in while it is played: SmolLM2 and its draft on a shared CPU take a while
    open_player(page, smollm2_server + "/draft_model", done=False)
    assert "Lookahead slots" in page.inner_text("h1")
    lookahead_only = None
    for step in range(1, 13):  # bounded: the first steps show it
        page.keyboard.press("ArrowRight")
        page.wait_for_selector(f'.pkv[data-step="{step}"]', timeout=180_000)
        blocks = slots_drawn(page)
        assert all(total == 4 and 0 <= empty <= 4 for _, _, total, empty in blocks)
        whole = [b for b in blocks if b[3] == 4 and b[1]]
        if whole and page.locator('.pkv-events li[data-kind="draft_proposed"]').count():
            lookahead_only = whole[0]
            break
    assert lookahead_only is not None, "a step with a block held only for lookahead slots"
    assert "lookahead slots" in page.inner_text(".pkv-events")
    # hovering that block says what its hollow slots are
    page.locator(f'.pkv-grid [data-block="{lookahead_only[0]}"]').hover()
    tip = page.locator('.pkv [data-role="tip"]')
    tip.wait_for(state="visible", timeout=5_000)
    assert "0 hold a computed token, 4 allocated with none yet" in tip.inner_text()
    page.close()
