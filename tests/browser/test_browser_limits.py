"""In a real browser (chromium via Playwright), the static export of a run: generated text with a
line break stays in its row of "Generated text", and a run stopped by the step cap says so, in EN
and 中文, naming PAGED_KV_LAB_MAX_RUN_STEPS (issue 26)."""

import pytest

from support.browser import wait_step

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def tiny():
    from kvcore.model import load_model

    return load_model("tiny-random", "cpu")


def capped_run(tiny, steps: int):
    """The prefix lesson's run on a store that computes at most ``steps`` steps."""
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.run.budget import Limits
    from paged_kv_lab.store.run_store import RunStore
    from paged_kv_lab.store.timeline import lesson_run

    store = RunStore(max_steps=steps, limits=Limits())
    run = lesson_run(BY_ID["prefix"], tiny, store=store)
    run.run_to_end(timeout=120)
    return run, store


def open_export(browser, tmp_path, html: str):  # noqa: F811
    path = tmp_path / "run.html"
    path.write_text(html)
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(path.as_uri())
    page.wait_for_selector('.pkv[data-done="true"]', timeout=30_000)
    return page


def test_generated_text_with_a_newline_stays_in_its_row(browser, tmp_path, tiny):  # noqa: F811
    from dataclasses import replace

    from paged_kv_lab.player import run_payload, static_html

    run, store = capped_run(tiny, 400)
    store.close()

    def two_lines(snap):
        reqs = tuple(
            replace(r, text=f"{r.text or 'x'}\nsecond line\r\nthird") for r in snap.requests
        )
        return replace(snap, requests=reqs)

    records = [replace(r, snapshot=two_lines(r.snapshot)) for r in run.records]
    html = static_html(run_payload(run.initial, records, done=True))
    page = open_export(browser, tmp_path, html)
    page.keyboard.press("End")
    wait_step(page, len(run.records))
    rows = page.locator(".pkv-outputs > div[data-req]")
    assert rows.count() >= 1
    for i in range(rows.count()):
        text = rows.nth(i).locator(".pkv-text")
        shown = text.inner_text()
        assert "\n" not in shown and "\u21b5" in shown, shown
        lines = text.evaluate("e => e.getClientRects().length")
        assert lines == 1, "the whole text is drawn on the row's one line"
    page.close()


@pytest.mark.parametrize("lang,words", [("en", "at most 3 steps"), ("zh", "最多计算 3 步")])
def test_a_run_stopped_by_the_step_cap_says_so(browser, tmp_path, tiny, lang, words):  # noqa: F811
    from paged_kv_lab.ui.player_component import export_html

    run, store = capped_run(tiny, 3)
    try:
        assert run.run.capped_at == 3 and len(run.records) == 3
        html = export_html(run, lang, "t")
    finally:
        store.close()
    page = open_export(browser, tmp_path, html)
    page.keyboard.press("End")
    wait_step(page, 3)
    page.keyboard.press("ArrowRight")  # Step at the end says why it is the end
    notice = page.locator('[data-role="notice"]').inner_text()
    assert words in notice and "PAGED_KV_LAB_MAX_RUN_STEPS" in notice, notice
    page.close()


# -- a link, opened first on a fresh server (issue 26) -------------------------------------------
LINKED = [
    # (setting, value, what the page must say): the three the issue found, and a refusal
    ("sliding_window", 200_000, None),
    ("max_cache_hit_length", 10**7, None),
    ("seed", 2**31 + 5, None),
    ("num_gpu_blocks", 2049, "PAGED_KV_LAB_MAX_BLOCKS"),
]


def linked_scenario(setting: str, value) -> dict:
    import copy

    from paged_kv_lab.content import BY_ID

    d = copy.deepcopy(BY_ID["playground"].scenario)
    d["name"] = f"linked-{setting}"
    d["engine"][setting] = value
    return d


def assert_no_exception(page) -> None:
    shown = page.locator("[data-testid=stException]")
    assert shown.count() == 0, shown.first.inner_text()[:500]
    assert "DuplicateElementKey" not in page.inner_text("body")


@pytest.fixture(scope="module")
def fresh_server():
    """A server of its own: the first link below is the first page it ever serves (a deep link
    opened first on a fresh server, routed by st.navigation like any other: docs/layout.md)."""
    from support.browser import model_for_browser, streamlit_server

    with streamlit_server(model_for_browser()) as (url, _):
        yield url


@pytest.mark.parametrize("setting,value,refusal", LINKED, ids=[c[0] for c in LINKED])
def test_a_linked_scenario_opens(browser, fresh_server, setting, value, refusal):  # noqa: F811
    """Each link in a new session: the run opens with the value in the form or the page says by
    name why not. With the window (where the issue once saw a duplicate element key and a Step
    hang) Step works and the page reruns cleanly; after it and after the refusal the scenario box
    under the player still loads a scenario."""
    import json

    from paged_kv_lab.ui.state import _encode_base
    from support.browser import open_player, wait_idle

    link = "/playground?lesson=playground&scn=" + _encode_base(linked_scenario(setting, value))
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    open_player(page, fresh_server + link, done=False)
    wait_idle(page)
    assert_no_exception(page)
    if refusal is None:
        shown = page.get_by_label(setting, exact=True).first  # the settings form comes first
        assert shown.input_value().replace(",", "") == str(value), "the form shows the value"
        if setting != "sliding_window":
            page.close()  # the rest is the same page as the first case's
            return
        for n in range(1, 4):  # Step, as the issue did when the Step hung
            page.keyboard.press("ArrowRight")
            wait_step(page, n)
        page.keyboard.press("r")  # Streamlit's rerun key
        wait_idle(page)
        page.keyboard.press("ArrowRight")
        wait_step(page, 4)
        assert_no_exception(page)
    else:
        error = page.locator("[data-testid=stAlertContentError]").first.inner_text()
        assert refusal in error and "engine.num_gpu_blocks" in error, error
    # the scenario box still takes a scenario
    page.get_by_text("Scenario file", exact=True).click()
    box = page.get_by_label("…or paste scenario JSON")
    box.fill(json.dumps(linked_scenario("max_num_seqs", 3)))
    box.press("Control+Enter")  # a text area's value reaches Streamlit on blur or this
    wait_idle(page)
    page.get_by_role("button", name="Load", exact=True).click()
    wait_idle(page)
    page.get_by_text("Loaded scenario “linked-max_num_seqs”.").wait_for(timeout=60_000)
    assert_no_exception(page)
    page.close()
