"""A real browser and the Live vLLM page's demo server: one click, and the page shows a live
stream of KV events from our engine (a fleet of three replicas publishing in vLLM's wire format)
and the router's global index drawn from it. One Streamlit server for the module."""

import re

import pytest

from support.browser import model_for_browser, streamlit_server, wait_idle
from support.paths import ROOT

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server():
    """A server of its own, not the worker's shared one: the demo it starts goes on publishing
    (and its watchers reading) after the test, which would load the next modules' server."""
    with streamlit_server(model_for_browser()) as (url, _):
        yield url


def test_the_demo_server_streams_into_the_live_page(server, browser):  # noqa: F811
    from paged_kv_lab.text.i18n import tr

    page = browser.new_page(viewport={"width": 1400, "height": 2200})
    try:
        page.goto(f"{server}/live_vllm")
        page.wait_for_selector("[data-testid=stForm]", timeout=120_000)
        wait_idle(page)
        assert tr("live.not_connected", "en") in page.inner_text("body")
        page.get_by_role("button", name=tr("fleet.live.demo", "en")).click()
        title = tr("fleet.live.index_title", "en", n=3)
        page.wait_for_function(
            "(t) => document.body.innerText.includes(t)", arg=title, timeout=60_000
        )
        batches = re.compile(r"(\d+) batches \(")
        seen = []
        for _ in range(40):  # the stream goes on: the count the page shows grows
            m = batches.search(page.inner_text("body"))
            if m and int(m.group(1)) > 0:  # the counts from the first batch that arrived on
                seen.append(int(m.group(1)))
            if len(seen) >= 2 and seen[-1] > seen[0] > 0:
                break
            page.wait_for_timeout(500)
        assert len(seen) >= 2 and seen[-1] > seen[0] > 0, seen
        page.wait_for_function(
            "() => /Demo server: [1-9]\\d* batches published/.test(document.body.innerText)",
            timeout=120_000,
        )
        assert "distinct block hashes in the index" in page.inner_text("body")
    except Exception:
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "test-artifacts" / "live-demo.png"))
        raise
    finally:
        page.close()
