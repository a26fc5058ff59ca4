"""The fleet lesson on SmolLM2 in a real browser (Debian's chromium, Playwright): the page shows,
at the first request and after the last, the decisions and the replicas' pools that the same
lesson routed over three engines on the same model gives in this process, and each cached
block's cell carries its hash as the router's index holds it."""

import json
import time

import pytest

from paged_kv_lab.text.i18n import tr
from support.browser import wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]

POOL_TABLES = (1, 2, 3)  # the page's tables: the decision, one per replica's pool, index, compare


@pytest.fixture(scope="module")
def expected(smollm2):
    """The lesson's fleet under the page's default policy, run here on the same weights."""
    from paged_kv_lab.fleet.model_fleet import run_model_fleet
    from paged_kv_lab.run.scenario import load_scenario
    from paged_kv_lab.ui.fleet_page import DEFAULT_POLICY, LESSON_FILE, wire

    d = json.loads(LESSON_FILE.read_text(encoding="utf-8"))
    scenario = load_scenario({**d["scenario"], "model": "smollm2", "device": "cpu"})
    fleet = run_model_fleet(scenario, d["replicas"], DEFAULT_POLICY, smollm2, d["sessions"])
    moments = []
    for m in fleet.moments:
        heading = tr(
            "fleet.lesson.decision",
            "en",
            request=m.request_id,
            session=m.session,
            replica=m.decision.replica,
        )
        pools = [
            sorted(
                f"{b.block_id} · {wire(b.block_hash)[:6]}"
                for b in snap.blocks
                if b.block_hash and not b.is_null
            )
            for snap in m.snapshots
        ]
        moments.append((heading, pools))
    return moments


def shown(page) -> tuple[str, list[list[str]]]:
    """The decision's heading and, per replica, the cells of its pool that carry a hash."""
    heading = page.locator("h3").first.inner_text().strip()
    tables = page.locator("[data-testid=stDataFrame]")
    pools = [
        sorted(t for t in tables.nth(i).locator("td").all_inner_texts() if " · " in t)
        for i in POOL_TABLES
    ]
    return heading, pools


def test_the_fleet_lesson_routes_and_draws_what_smollm2_gives(smollm2_server, browser, expected):  # noqa: F811
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    page.goto(smollm2_server + "/fleet")
    page.wait_for_selector("[data-testid=stDataFrame]", timeout=300_000)
    wait_idle(page)
    assert tr("page.fleet.title", "en") in page.inner_text("h1")
    assert shown(page) == expected[0]
    assert "Why replica" in page.inner_text("body")
    # after the last request (the slider's own keys): every replica's pool as the engines left it
    slider = page.locator("[data-testid=stSlider] input[type=range]")
    assert int(slider.get_attribute("max")) == len(expected)
    slider.focus()
    page.keyboard.press("End")
    last_heading = expected[-1][0]
    page.wait_for_function(
        "h => document.querySelector('h3') && document.querySelector('h3').innerText.trim() == h",
        arg=last_heading,
        timeout=60_000,
    )
    wait_idle(page)
    # the heading can arrive before the rerun's tables do: read until they settle (bounded)
    deadline = time.monotonic() + 30
    while shown(page) != expected[-1] and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    heading, pools = shown(page)
    assert (heading, pools) == expected[-1]
    assert sum(map(len, pools)) > 0, "the lesson's requests leave cached blocks"
    # the router's index lists the hashes the pools carry (its first rows, sorted by holders)
    index = page.locator("[data-testid=stDataFrame]").nth(4).locator("td").all_inner_texts()
    listed = {t[:6] for t in index if len(t) == 16}
    assert listed and listed <= {cell.split(" · ")[1] for pool in pools for cell in pool}
    page.close()
