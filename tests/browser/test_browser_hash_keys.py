"""The topic page 'What else is in a block's hash' in a real browser (Debian's chromium,
Playwright) on the tiny model: the extra-keys table marks the blocks the image's placeholder range
touches, and moving the slider with its own keys moves them, to the blocks kvcore's study gives
for the new offset (computed here on the same prompt)."""

import pytest

from paged_kv_lab.content.topics import HASH_KEYS_PROMPT, HASH_VARIANTS, hash_keys_study
from paged_kv_lab.text.i18n import tr
from support.browser import wait_idle

pytestmark = pytest.mark.browser

KEYS_TABLE = 1  # the page's tables: the hashes, the extra keys, the hits
IMAGE_ROW = HASH_VARIANTS.index("image")


@pytest.fixture(scope="module")
def token_ids(tiny_model):
    """The page's prompt as the server's model (the tiny one) tokenizes it."""
    return tuple(tiny_model.encode_prompt(HASH_KEYS_PROMPT, True))


def touched_shown(page) -> list[int]:
    """The blocks whose cell in the image's row of the extra-keys table holds an 'mm' key."""
    table = page.locator("[data-testid=stDataFrame]").nth(KEYS_TABLE)
    row = table.locator("tbody tr").nth(IMAGE_ROW).locator("td").all_inner_texts()
    cells = row[-(len(row) - 1) :] if len(row) > 1 else []
    return [i for i, cell in enumerate(cells) if "'mm'" in cell]


SLIDER = "[data-testid=stSlider] input[type=range]"


def slider_value(page) -> int:
    return int(page.locator(SLIDER).input_value())


def test_the_slider_moves_the_touched_blocks(server, browser, token_ids):  # noqa: F811
    page = browser.new_page(viewport={"width": 1600, "height": 2400})
    page.goto(server + "/what_else_is_in_a_hash")
    page.wait_for_selector("[data-testid=stDataFrame]", timeout=300_000)
    wait_idle(page)
    assert tr("page.hashkeys.title", "en") in page.inner_text("h1")
    offset = slider_value(page)
    before = touched_shown(page)
    assert before == list(hash_keys_study(token_ids, offset).touched)
    # the slider's own key: Home moves the image to the prompt's start
    page.locator(SLIDER).focus()
    page.keyboard.press("Home")
    page.wait_for_function(
        "s => document.querySelector(s).value == '0'", arg=SLIDER, timeout=30_000
    )
    wait_idle(page)
    expected = list(hash_keys_study(token_ids, 0).touched)
    page.wait_for_function(
        """([n, row, want]) => {
            const t = document.querySelectorAll('[data-testid=stDataFrame]')[n];
            const tr = t && t.querySelectorAll('tbody tr')[row];
            if (!tr) return false;
            const cells = [...tr.querySelectorAll('td')].slice(-%d).map(c => c.innerText);
            const got = cells.flatMap((c, i) => c.includes("'mm'") ? [i] : []);
            return JSON.stringify(got) == JSON.stringify(want);
        }"""
        % (len(token_ids) // 16),
        arg=[KEYS_TABLE, IMAGE_ROW, expected],
        timeout=30_000,
    )
    after = touched_shown(page)
    assert after == expected != before
    text = page.inner_text("body")
    assert "touch blocks " + " / ".join(str(i) for i in expected) in text
    page.close()
