"""One fresh server with its warm-up on (the tiny model; app/warm_up.py records the runs, the
replay and the studies the pages show), in a real browser (Debian's chromium), in this order:

1. No blank page while the server warms up (issue 45, point 3). The teacher's first visit loads
   the model (untimed); while the warm-up still records the lessons, the teacher starts a class;
   thirty students open the class link at once, each a new session over Streamlit's WebSocket
   (tests/support/wire.py: thirty chromium pages on the test's two cores would time the test's
   browser, not the server; a student's browser runs on the student's machine), each timed until
   the server has sent its player with the run's head, which is what the browser draws the player
   from; then lessons open in new tabs of chromium, each timed from the navigation until its frame
   and controls show (title, sidebar, the run's download button) and until its player shows
   (beside it, not asserted: when the server had sent the same page to a session without a
   browser, which tells the server's time from the browser's). A tab over the bound is opened
   once more and judged by that visit if the warm-up was in the same state: the first tab of the
   suite's run (a fresh chromium, the test's 2-core machine) took 3.2-4.8 s where the same test
   alone takes 1.5-2.5 s, while the server had sent it in 0.1 s; a tab that is slow every time
   fails. Every session says whether the warm-up was under way when it opened (its sidebar's
   line). The figures: test-artifacts/warm-up-visits.txt.
2. The sidebar then says when the warm-up is done (waited for, untimed; its length is reported).
3. Every page of the registry opens within OPEN_S seconds once the warm-up has ended (the lessons
   the new tabs opened during it among them): each page is a first visit, in a new tab (a new
   session), timed from the navigation until its own content shows (the registry's ``ready``
   selectors: the player's root with its steps, a page's table or figures), not by a timer in
   the app. The measured table is printed (pytest -s) and written to
   test-artifacts/pages-open.txt.
4. No Markdown mark shows as text on any page or in a lesson's export.

The timed tests (1 and 3) are marked alone; the server's start (a test of its own, before them)
and the warm-up's end are not waited for by the other workers."""

import os
import re
import time

import pytest

from paged_kv_lab.content.registry import pages
from paged_kv_lab.text.i18n import tr
from support.aio import run_async
from support.browser import (
    VISIBLE_TEXT,
    go,
    marks,
    model_for_browser,
    open_player,
    settle,
    streamlit_server,
    wait_step,
)
from support.paths import ROOT
from support.wire import visit, visit_all

pytestmark = pytest.mark.browser

# the bound; PAGED_KV_LAB_PAGE_OPEN_S sets another (e.g. on a machine known to be loaded)
OPEN_S = float(os.environ.get("PAGED_KV_LAB_PAGE_OPEN_S", "3.0"))
JOIN_S = float(os.environ.get("PAGED_KV_LAB_JOIN_S", "10.0"))  # another on a loaded machine
LOAD_S = 300  # the model's load on the first visit (not timed)
CONTENT_S = 60  # how long a page may take before the test stops waiting (then it fails)
JOINERS = 30
TEACHER = "eviction"  # the lesson the teacher teaches (its "Teach this")
TABS = ("blocks", "prefix_caching", "preemption")  # lessons opened in new tabs (URL paths)
FRAME = ("h1", "[data-testid=stSidebarNav]", "[data-testid=stDownloadButton]")
PLAYER = ".pkv[data-total]"
RUNNING = tr("page.warm_up.running", "en")
DONE = tr("page.warm_up.done", "en")


@pytest.fixture(scope="module")
def fresh_server():
    with streamlit_server(model_for_browser(), warm_up=True) as (url, _):
        yield url


def written(lines: list[str]) -> None:
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    text = "\n".join(lines) + "\n"
    (ROOT / "test-artifacts" / "warm-up-visits.txt").write_text(text, encoding="utf-8")


def warm_up_shown(tab) -> str:
    """'running' or 'done': the sidebar's warm-up line in ``tab`` (waited for, bounded)."""
    side = tab.locator("[data-testid=stSidebar]")
    side.get_by_text(re.compile(f"^({re.escape(RUNNING)}|{re.escape(DONE)})$")).wait_for(
        timeout=CONTENT_S * 1000
    )
    return "running" if side.get_by_text(RUNNING, exact=True).count() else "done"


def open_tab(context, url: str) -> tuple[float, float, str]:
    """A new tab (a new session) at ``url``: seconds from the navigation until its frame and
    controls show, until its player shows, and whether the warm-up was under way."""
    tab = context.new_page()
    try:
        t0 = time.monotonic()
        tab.goto(url, wait_until="commit")
        for sel in FRAME:
            tab.wait_for_selector(sel, state="visible", timeout=CONTENT_S * 1000)
        frame = time.monotonic() - t0
        tab.wait_for_selector(PLAYER, state="visible", timeout=CONTENT_S * 1000)
        player = time.monotonic() - t0
        return frame, player, warm_up_shown(tab)
    finally:
        tab.close()


def open_page(context, url: str, ready: tuple[str, ...]) -> float:
    """Seconds from a new tab's navigation to ``url`` until every ``ready`` selector shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    tab = context.new_page()
    try:
        t0 = time.monotonic()
        tab.goto(url)
        for sel in ready:
            try:
                tab.wait_for_selector(sel, state="visible", timeout=CONTENT_S * 1000)
            except PlaywrightTimeout:
                return float("inf")  # reported in the table with the others
        return time.monotonic() - t0
    finally:
        tab.close()


@pytest.fixture(scope="module")
def warm(fresh_server, browser):  # noqa: F811
    """A browser window on the fresh server once the model is loaded and the warm-up has ended
    (untimed: the first visit loads the model); yields (window, seconds the warm-up took after
    the home page showed)."""
    home = pages()[0]
    # one browser window: each page opens in a new tab of it (a new session; the browser's cache
    # of the app's static files is the window's, as a visitor's is)
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    tab = context.new_page()
    tab.goto(fresh_server)
    for sel in home.ready:
        tab.wait_for_selector(sel, timeout=LOAD_S * 1000)
    t0 = time.monotonic()
    done = tr("page.warm_up.done", "en")
    tab.locator("[data-testid=stSidebar]").get_by_text(done).wait_for(timeout=LOAD_S * 1000)
    warm_s = time.monotonic() - t0
    tab.close()
    yield context, warm_s
    context.close()


def test_the_fresh_server_answers_before_any_visit(fresh_server):
    """The server is up (its health check answers) before anyone visits: the model loads, and the
    warm-up starts, on the first visit, in the timed test below. Its start is waited for here,
    while the other workers run."""
    import urllib.request

    with urllib.request.urlopen(fresh_server + "/_stcore/health", timeout=10) as r:
        assert r.read().decode().strip() == "ok"


@pytest.mark.alone  # the times are this server's, not those of another worker's test beside it
def test_pages_paint_during_the_warm_up_and_thirty_students_join(fresh_server, browser):  # noqa: F811
    url = fresh_server
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    teacher = context.new_page()
    teacher.goto(f"{url}/{TEACHER}?step=0")
    teacher.wait_for_selector(PLAYER, timeout=LOAD_S * 1000)  # the model is ready
    assert warm_up_shown(teacher) == "running", "the warm-up starts once the model is ready"

    # the teacher starts a class (a busy machine's rerun can drop a click: once more)
    teacher.get_by_text("Teach this").click()
    start = teacher.get_by_role("button", name="Start a class")
    start.click()
    try:
        teacher.wait_for_selector('.pkv[data-room="teacher"]', timeout=20_000)
    except Exception:
        if not start.is_visible():
            raise
        start.click()
        teacher.wait_for_selector('.pkv[data-room="teacher"]', timeout=CONTENT_S * 1000)
    link = teacher.locator("[data-testid=stCode]").filter(has_text="join_a_class")
    code = re.search(r"room=([A-Z2-9]{6})", link.inner_text()).group(1)

    # thirty students open the link at once
    joins = run_async(visit_all(url, "join_a_class", f"room={code}", JOINERS, CONTENT_S))
    players = sorted(j.player_s if j.player_s is not None else float("inf") for j in joins)
    lines = [
        f"({model_for_browser()}) {JOINERS} students at once, until the server sent each its "
        "player (s): " + ", ".join(f"{s:.2f}" for s in players),
        "new tab                  frame     player   warm-up   (its server: frame, player)",
    ]
    written(lines)
    # lessons in new tabs while the warm-up runs (once it has ended: every page, below)
    during = {}
    for slug in TABS:  # a tab that finds the warm-up ended says so
        frame, player, state = during[slug] = open_tab(context, f"{url}/{slug}")
        if max(frame, player) > OPEN_S:  # once more, as the pages' test below does
            again = open_tab(context, f"{url}/{slug}")
            lines.append(f"{slug:<24} {frame:6.2f} s  {player:6.2f} s  {state:<9} (again:)")
            if again[2] == state:  # judged by a visit at the same moment (warm-up or not)
                frame, player, state = during[slug] = again
        # the same page as a session without a browser: when the server had sent it (not
        # asserted; where the tab is slow and this is not, the time is the browser's)
        sent = run_async(visit(url, slug, "", CONTENT_S))
        lines.append(
            f"{slug:<24} {frame:6.2f} s  {player:6.2f} s  {state:<9} "
            f"({sent.first_element_s or float('inf'):.2f} s, "
            f"{sent.player_s or float('inf'):.2f} s)"
        )
        written(lines)  # each figure as it comes: a later wait may fail
    context.close()
    table = "\n".join(lines)
    print(f"\n{table}")

    errors = [j.error for j in joins if j.error]
    assert not errors, f"students whose session failed: {errors}\n{table}"
    late = [i for i, j in enumerate(joins) if RUNNING not in j.texts]
    assert not late, f"students who joined after the warm-up: {late}\n{table}"
    assert players[-1] <= JOIN_S, f"a student waited over {JOIN_S} s for the player\n{table}"
    assert during[TABS[0]][2] == "running", f"the first new tab opened during the warm-up\n{table}"
    slow = {slug: times[:2] for slug, times in during.items() if not max(times[:2]) <= OPEN_S}
    assert not slow, f"tabs whose frame or player took over {OPEN_S} s: {slow}\n{table}"


def test_the_warm_up_ends_and_says_so(warm):
    """The sidebar's warm-up line turns to its done text (the server start, the model's load and
    the warm-up happen here, sharing the machine with the other tests)."""
    _, warm_s = warm
    assert warm_s < LOAD_S


@pytest.mark.alone  # the times are the pages', not those of another worker's test beside them
def test_every_page_opens_within_three_seconds(fresh_server, warm):
    """A page over the bound is opened once more, in a new tab (a first visit again), and judged
    by that: the other workers' servers may still be recording in the background while this
    test runs alone, and a moment's load should not fail a page that opens in time, while a page
    that is slow (the fleet page's charts: 3.2-3.8 s every time) is slow on both visits. The
    table shows both times."""
    context, warm_s = warm
    took = {p.id: [open_page(context, f"{fresh_server}/{p.url_path}", p.ready)] for p in pages()}
    for p in pages():
        if not took[p.id][0] <= OPEN_S:
            took[p.id].append(open_page(context, f"{fresh_server}/{p.url_path}", p.ready))
    table = "\n".join(
        f"{pid:<12} " + ", then ".join(f"{s:6.2f} s" for s in times) for pid, times in took.items()
    )
    table += f"\n(the warm-up ended {warm_s:.1f} s after the home page showed)"
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    (ROOT / "test-artifacts" / "pages-open.txt").write_text(table + "\n", encoding="utf-8")
    print(f"\nfirst visit until the page's content shows ({model_for_browser()}):\n{table}")
    slow = {pid: [round(s, 2) for s in t] for pid, t in took.items() if not t[-1] <= OPEN_S}
    assert not slow, f"pages that took over {OPEN_S} s to open, twice: {slow}\n{table}"


def test_no_markdown_mark_shows_on_any_page_or_in_an_export(fresh_server, warm, browser, tmp_path):  # noqa: F811
    """Each page as it opens (a lesson's player at step 0: the intro), then lesson 1's export at
    every step (its moments and outro); the other lessons' moments: test_every_lesson_text_..."""
    server = fresh_server
    page = browser.new_page(viewport={"width": 1400, "height": 1800}, accept_downloads=True)
    page.goto(server)
    page.wait_for_selector("[data-testid=stSidebarNav] a", timeout=90_000)
    links = page.locator("[data-testid=stSidebarNav] a").evaluate_all("els => els.map(a => a.href)")
    # the sidebar lists the page registry's pages, in its order
    assert [link.rstrip("/") for link in links] == [
        f"{server}/{p.url_path}".rstrip("/") for p in pages()
    ]
    shown = {}
    for url in dict.fromkeys(links):
        go(page, url)
        settle(page)
        # a player shown (Real workloads mounts its pool player hidden before any moment)
        if page.locator(".pkv:visible").count():
            page.wait_for_selector(".pkv[data-total]", timeout=60_000)
        shown[url] = marks(page)
        if url.rstrip("/").endswith("/eviction"):  # its myths are open: seed 003's three there too
            text = page.evaluate(VISIBLE_TEXT)
            for claim in ("evict_blocks(block_ids)", "delay_cache_blocks means", "ext_comp:"):
                assert claim in text, f"the {claim} myth is on the eviction page"
        if url.rstrip("/").endswith("/trace_viewer"):  # its player: the example trace
            page.get_by_role("button", name="Load an example trace").click()
            page.wait_for_selector(".pkv[data-total]", timeout=90_000)
            settle(page)
            shown[url] += marks(page)
    bad = {u: m for u, m in shown.items() if m}
    assert not bad, f"Markdown marks shown as text: {bad}"

    # the export of lesson 1 (its intro and moments are the most marked up), every step of it
    open_player(page, server + "/blocks")
    with page.expect_download(timeout=60_000) as dl:
        page.get_by_role("button", name="Download this run").click()
    path = tmp_path / "lesson1.html"
    dl.value.save_as(path)
    page.close()
    page = browser.new_context(offline=True).new_page()
    open_player(page, path.as_uri())
    n = int(page.locator(".pkv").get_attribute("data-total"))
    narration = page.locator('[data-role="narration"]')
    assert narration.locator("strong").count() >= 1, "the intro's bold is drawn as bold"
    bad = {}
    for k in range(n + 1):
        wait_step(page, k)
        found = marks(page)
        if found:
            bad[k] = found
        page.keyboard.press("ArrowRight")
    assert not bad, f"Markdown marks shown as text in the export, by step: {bad}"
    page.context.close()
