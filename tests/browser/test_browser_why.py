"""A real browser (Debian's chromium) and the "Why?" panel under the step player: select a request
and see why its cache hit stopped where it did; select a block and see its story; both languages.
The sentences shown must equal why.explain on an independent engine run to the same step."""

import re

import pytest

from support.browser import open_player, wait_idle, wait_step

pytestmark = pytest.mark.browser


def recorded_until_hit():
    """The prefix lesson on the tiny model, stepped by an independent engine to B's first hit."""
    from kvcore.model import load_model
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.store.timeline import lesson_scenario
    from paged_kv_lab.why.explain import RecordedSteps

    model = load_model("tiny-random", "cpu")
    scenario = lesson_scenario(BY_ID["prefix"], model.num_layers, model=model.name, device="cpu")
    engine = Engine(scenario, model=model)
    initial, records = engine.snapshot(), []
    while engine.has_unfinished():
        records.append(engine.step())
        if any(e.kind == "cache_hit" for e in records[-1].events):
            break
    hit = next(e for e in records[-1].events if e.kind == "cache_hit")
    return RecordedSteps(initial, tuple(records), scenario.engine, model.decode), hit.request_id


def choose(page, label, option):
    exact = page.locator("label", has_text=re.compile(f"^{re.escape(label)}$"))
    # the panel's, below the others
    box = page.locator("[data-testid=stSelectbox]").filter(has=exact).last
    box.locator("input").first.click()  # open it, type to filter as a user does, pick
    page.keyboard.press("Control+A")
    page.keyboard.type(option)
    page.get_by_role("option", name=option, exact=True).first.click()
    wait_idle(page)
    assert box.locator("input").first.input_value() == option


def shows(page, line: str) -> None:
    """Wait (bounded) until the page's text holds the start of ``line`` (markdown marks aside)."""
    frag = line.replace("`", "").replace("*", "")[:40]
    page.wait_for_function(
        "(f) => document.body.innerText.replace(/[`*]/g, '').includes(f)", arg=frag, timeout=15_000
    )


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_select_a_request_and_a_block_and_the_page_says_why(server, browser, lang):  # noqa: F811
    from paged_kv_lab.text.i18n import tr
    from paged_kv_lab.why.explain import explain_hit
    from paged_kv_lab.why.explain_blocks import life_of_block
    from paged_kv_lab.why.explain_text import hit_sentences, life_sentences

    steps, rid = recorded_until_hit()
    n = len(steps.records)
    page = browser.new_page(viewport={"width": 1500, "height": 2400})
    open_player(page, f"{server}/prefix_caching?lang={lang}")
    for _ in range(n):
        page.keyboard.press("ArrowRight")
    wait_step(page, n)
    # the page hears the player's cursor (debounced); the panel explains only the steps shown so far
    page.wait_for_function(f"() => location.search.includes('step={n}')", timeout=15_000)
    wait_idle(page)
    word = {k: tr(f"why.{k}", lang) for k in ("title", "pick_request", "block", "pick_block")}
    page.get_by_text(word["title"]).first.click()  # the "Why?" toggle
    wait_idle(page)
    choose(page, word["pick_request"], rid)
    explained = explain_hit(steps, rid)
    assert explained and rid in hit_sentences(explained[0], lang)[0]
    for x in explained:
        for line in hit_sentences(x, lang)[:-1]:
            shows(page, line)
    # the life of a block that B hit
    hit_block = next(e for e in steps.records[-1].events if e.kind == "cache_hit").block_ids[0]
    page.get_by_text(word["block"], exact=True).first.click()
    wait_idle(page)
    choose(page, word["pick_block"], str(hit_block))
    story = life_sentences(life_of_block(steps, hit_block), lang)
    assert story and any(f"{hit_block}" in s for s in story)
    for line in story[:3]:
        shows(page, line)
    page.close()
