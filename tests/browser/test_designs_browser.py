"""The topic "Hash chains vs radix tree" on SmolLM2 in a real browser (Debian's chromium,
Playwright): vLLM's run plays, and under it, at the player's step, SGLang's tree is drawn, the
three designs' hits and the differences they show are named, and Why? answers on the tree."""

import pytest

from support.browser import open_player, wait_idle, wait_step

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_designs_side_by_side_on_smollm2(smollm2_server, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1500, "height": 2400})
    open_player(page, smollm2_server + "/designs")
    assert "Hash chains vs radix tree" in page.inner_text("h1")
    page.wait_for_selector("text=SGLang's radix tree and nano-vllm's block table", timeout=120_000)
    wait_idle(page)
    tree = page.locator("svg g.node")  # Graphviz draws each tree node as a g.node
    tree.first.wait_for(state="attached", timeout=30_000)
    assert tree.count() == 1, "step 0: the tree holds only its root"
    assert page.get_by_role("slider", name="Step").count() == 0, "the player's step is the one"
    total = int(page.locator(".pkv").get_attribute("data-total"))
    page.keyboard.press("End")  # the player's keys: the last step, D finished
    wait_step(page, total)
    for _ in range(total - 13):  # back to step 13: D's admission, an eviction in every design
        page.keyboard.press("ArrowLeft")
    wait_step(page, 13)
    page.wait_for_selector(
        "text=What SGLang and nano-vllm bb823b3 decided at step 13", timeout=60_000
    )
    wait_idle(page)
    page.wait_for_function("() => document.querySelectorAll('svg g.node').length >= 3")
    text = page.inner_text("body")
    assert "Hit granularity" in text and "Eviction order" in text, text[-3000:]
    assert tree.count() >= 3, "by step 13 the tree holds A's, B's and C's tokens"
    # Why?, on SGLang's tree: B's match, token by token, against vLLM's full blocks
    page.get_by_text("Why? — ask the recorded run").click()
    page.get_by_text("SGLang's tree: why?").click()
    wait_idle(page)
    page.wait_for_selector("text=visiting 0 node(s)", timeout=60_000)
    text = page.inner_text("body")  # the first request, A, met an empty tree
    assert "A's match_prefix at step 1 found 0 of the 11 tokens" in text, text[-3000:]
    page.close()
