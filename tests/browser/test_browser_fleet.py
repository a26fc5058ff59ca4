"""The fleet lesson in a real browser (Debian's chromium, Playwright), on the tiny model's
server: stepped in the step player every lesson uses, the step that takes a newly routed
request narrates which replica made it and why the router chose it (Dynamo's cost, its numbers),
and the router's decision under the player follows the player's cursor, as the same lesson run
here on the same weights decides (the routing depends only on the tokens, SmolLM2's
tokenizer's)."""

import pytest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.text.i18n import tr
from support.browser import open_player, wait_idle

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def records():
    import paged_kv_lab.fleet.model_fleet as fleet
    from kvcore.model import load_model
    from paged_kv_lab.run.scenario import load_scenario
    from support.browser import model_for_browser

    name = model_for_browser()
    d = {**BY_ID["fleet"].scenario_dict(), "model": name, "device": "cpu"}
    return fleet.FleetRun(load_scenario(d), model=load_model(name, "cpu")).run()


def step_to(page, step: int) -> str:
    """Press → until the player shows ``step``; its narration once the page settled."""
    while int(page.locator(".pkv").get_attribute("data-step")) < step:
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(50)
    page.wait_for_selector(f'.pkv[data-step="{step}"]', timeout=60_000)
    wait_idle(page)
    return page.locator('[data-role="narration"]').inner_text()


def test_the_fleet_lesson_steps_in_the_player_and_says_why_replica_n(server, browser, records):  # noqa: F811
    routed = [(rec, r) for rec in records for r in rec.routed]
    page = browser.new_page(viewport={"width": 1500, "height": 2600})
    open_player(page, server + "/fleet")
    assert tr("lesson.fleet.title", "en") in page.inner_text("h1")
    assert int(page.locator(".pkv").get_attribute("data-total")) == len(records)
    page.locator(".pkv").click()
    for rec, r in (routed[0], routed[-1]):
        said = step_to(page, rec.step)
        assert tr("fleet.step.replica", "en", replica=rec.replica) in said
        assert f"{r.request_id} ({r.session}) has arrived" in said
        assert f"the router sent it to replica {r.replica}" in said
        assert "Dynamo's cost per replica" in said
        costs = ", ".join(f"{c:g}" for c in r.decision.score)
        assert costs in said  # its numbers, replica 0 first
        # under the player, the decision at the cursor (a rerun: read until it arrives)
        title = tr("fleet.panel.decision", "en", req=r.request_id, replica=r.replica)
        page.wait_for_function(
            "t => document.body.innerText.includes(t)", arg=title.replace("**", ""), timeout=60_000
        )
    page.close()
