"""A real browser (Debian's chromium, driven by Playwright) and the step player: keys, buttons, the
timeline, hover, the quiz hold, the static export offline, and a hostile prompt shown as text."""

import os
import shutil
import time

import pytest

from support.browser import model_for_browser, open_player, shown_step, wait_idle, wait_step
from support.paths import ROOT


def drawn(page) -> dict:
    """What the player draws now: grid (id, ref_cnt, owners), free queue order, block tables."""
    grid = page.locator(".pkv-grid .pkv-block").evaluate_all(
        "els => els.map(e => [Number(e.dataset.block), Number(e.dataset.ref), e.dataset.owners])"
    )
    queue = page.locator(".pkv-queue [data-block]").evaluate_all(
        "els => els.map(e => Number(e.dataset.block))"
    )
    tables = page.locator(".pkv-tables table tr").evaluate_all(
        "rows => rows.map(r => [Number(r.closest('table').dataset.group), r.dataset.req,"
        " Array.from(r.querySelectorAll('.pkv-chip')).map(c => Number(c.dataset.block))])"
    )
    return {
        "grid": grid,
        "queue": queue,
        "tables": sorted(map(tuple, [(g, r, tuple(b)) for g, r, b in tables])),
    }


def expected(snap) -> dict:
    grid = [[b.block_id, b.ref_cnt, ",".join(b.owners)] for b in snap.blocks]
    tables = sorted(
        (g, r.request_id, tuple(t))
        for r in snap.requests
        for g, t in enumerate(r.block_tables)
        if t
    )
    return {"grid": grid, "queue": list(snap.free_queue), "tables": tables}


def engine_snapshots(lesson_id):
    """An independent engine's snapshots of a lesson, on the server's model."""
    from kvcore.model import load_model
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.store.timeline import lesson_scenario

    model = load_model(model_for_browser(), "cpu")
    engine = Engine(
        lesson_scenario(BY_ID[lesson_id], model.num_layers, model=model.name, device="cpu"),
        model=model,
    )
    snaps = [engine.snapshot()]
    records = []
    while engine.has_unfinished() and len(records) < 400:
        records.append(engine.step())
        snaps.append(records[-1].snapshot)
    return snaps, records


@pytest.mark.browser
def test_keys_buttons_timeline_and_hover_agree_with_the_engine(server, browser):
    snaps, records = engine_snapshots("prefix")
    n = len(records)
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    open_player(page, server + "/prefix_caching")
    assert "Prefix caching and hash chains" in page.inner_text("h1")
    assert page.locator(".pkv-pos").inner_text() == f"Step 0 of {n}"
    assert drawn(page) == expected(snaps[0])
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    wait_step(page, 3)
    assert page.locator(".pkv-pos").inner_text() == f"Step 3 of {n}"
    assert drawn(page) == expected(snaps[3])
    page.locator('[data-act="back"]').click()
    wait_step(page, 2)
    assert drawn(page) == expected(snaps[2])
    page.keyboard.press("End")
    wait_step(page, n)
    assert drawn(page) == expected(snaps[n])
    page.keyboard.press("Home")
    wait_step(page, 0)
    page.locator(".pkv-timeline").evaluate(
        "(el) => { el.value = '4'; el.dispatchEvent(new Event('input')); }"
    )
    wait_step(page, 4)
    assert drawn(page) == expected(snaps[4])
    page.keyboard.press("ArrowLeft")
    wait_step(page, 3)
    # Run until the first cache hit after the cursor
    hit = next(r.step for r in records[3:] if any(e.kind == "cache_hit" for e in r.events))
    page.locator('[data-role="until"]').select_option("cache_hit")
    page.locator('[data-act="until"]').click()
    wait_step(page, hit)
    assert drawn(page) == expected(snaps[hit])
    from paged_kv_lab.why.sentences import sentence

    hit_event = next(e for e in records[hit - 1].events if e.kind == "cache_hit")
    assert page.locator(".pkv-events").get_by_text(sentence(hit_event, "en", None)[:30]).count()
    # hover: the whole story of every cached block
    for b in [b for b in snaps[hit].blocks if b.block_hash][:3]:
        page.locator(f'.pkv-grid [data-block="{b.block_id}"]').hover()
        tip = page.locator(".pkv-tip").inner_text()
        assert (
            f"block {b.block_id}" in tip and b.block_hash in tip and f"ref_cnt: {b.ref_cnt}" in tip
        )
        assert (b.parent_hash or "NONE_HASH") in tip and ", ".join(b.owners or ("—",)) in tip
        assert (
            "not in the free queue"
            if b.queue_pos is None
            else f"position: {b.queue_pos} (head = 0)"
        ) in tip
    # the page hears where the player is (debounced), without redrawing the player
    page.wait_for_function(f"() => location.search.includes('step={hit}')", timeout=15_000)
    assert "lesson=prefix" in page.url
    # click a request to follow it: its blocks stay lit, the others dim
    holder = next(b.owners[0] for b in snaps[hit].blocks if b.owners)
    page.locator(f'.pkv-outputs .pkv-badge[data-req="{holder}"]').click()
    lit = page.locator(".pkv-grid .pkv-block.pkv-sel").evaluate_all(
        "els => els.map(e => Number(e.dataset.block))"
    )
    assert lit == [b.block_id for b in snaps[hit].blocks if holder in b.owners]
    assert page.locator(".pkv-selected").inner_text().startswith(f"request {holder}")
    page.wait_for_timeout(500)
    out = ROOT / "test-artifacts"
    out.mkdir(exist_ok=True)
    page.locator(f'.pkv-outputs .pkv-badge[data-req="{holder}"]').click()
    page.screenshot(path=str(out / "prefix-caching-hit.png"))
    # refresh the README's picture on request only
    if os.environ.get("PAGED_KV_LAB_UPDATE_SCREENSHOT"):
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copy(out / "prefix-caching-hit.png", ROOT / "docs" / "screenshot.png")
    page.close()


@pytest.mark.browser
def test_quiz_holds_the_step_back(server, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    open_player(page, server + "/blocks")
    page.get_by_text("🎓").first.click()
    page.get_by_text("Predict before you look").first.wait_for(timeout=30_000)
    page.wait_for_selector('.pkv[data-step="0"] [data-act="step"]:disabled', timeout=10_000)
    # the page has focus
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.keyboard.press("ArrowRight")
    page.wait_for_timeout(300)
    assert shown_step(page) == 0, "the step is held back until the question is answered"
    assert "Answer the question" in page.locator('[data-role="notice"]').inner_text()
    page.get_by_role("button", name="Reveal the step").click()
    wait_step(page, 1)
    page.close()


HOSTILE = "<img src=x onerror=alert(1)> <script>alert(2)</script>"


def hostile_dict():
    return {
        "name": "hostile",
        "engine": {"block_size": 4, "num_gpu_blocks": 24},
        "requests": [{"id": "X", "prompt": HOSTILE, "max_tokens": 3}],
    }


def assert_literal(page):
    """The hostile prompt is text everywhere: visible literally, never a tag, never run."""
    page.locator(".pkv-grid .pkv-block.used, .pkv-grid .pkv-block.cached").first.hover()
    assert "«<img src=" in page.locator(".pkv-tip").inner_text()
    assert "«<img src=" in page.locator(".pkv-chains").inner_text()
    page.locator('.pkv-outputs .pkv-badge[data-req="X"]').click()
    assert HOSTILE in page.locator(".pkv-selected").inner_text(), "the whole prompt, literally"
    page.locator('.pkv-outputs .pkv-badge[data-req="X"]').click()
    assert page.locator(".pkv img, .pkv script").count() == 0


@pytest.mark.browser
def test_hostile_prompt_is_text_in_the_app_and_in_its_export(server, browser, tmp_path):
    from paged_kv_lab.ui.state import _encode_base

    page = browser.new_page(viewport={"width": 1500, "height": 1900}, accept_downloads=True)
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    open_player(page, server + "/playground?lesson=playground&scn=" + _encode_base(hostile_dict()))
    page.keyboard.press("End")
    assert_literal(page)
    with page.expect_download(timeout=60_000) as dl:
        page.get_by_role("button", name="Download this run").click()
    path = tmp_path / "run.html"
    dl.value.save_as(path)
    html = path.read_text()
    assert "<img" not in html
    page.close()
    # the export: opened from a file:// URL with the network off, it steps like the app
    ctx = browser.new_context(offline=True)
    page = ctx.new_page()
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    requests = []
    page.on("request", lambda r: requests.append(r.url))
    open_player(page, path.as_uri())
    n = int(page.locator(".pkv").get_attribute("data-total"))
    page.keyboard.press("ArrowRight")
    wait_step(page, 1)
    page.locator('[data-act="step"]').click()
    wait_step(page, 2)
    page.keyboard.press("End")
    wait_step(page, n)
    assert_literal(page)
    assert [u for u in requests if not u.startswith("file:")] == [], "the export loads nothing"
    assert not dialogs, f"no script from the prompt ran: {dialogs}"
    ctx.close()


@pytest.mark.browser
def test_step_at_the_frontier_shows_the_step_once_it_arrives(browser, tmp_path):
    """Step pressed where nothing is recorded yet asks the server for the step, and the player shows
    that step as soon as it streams in (it used to stay on the old step). No server: the player of
    an export that holds only the first steps, fed the rest the way the component feeds it."""
    from paged_kv_lab.player import run_payload, static_html

    snaps, records = engine_snapshots("prefix")
    k = 3
    whole = run_payload(snaps[0], records, done=True)
    part = {**whole, "steps": whole["steps"][:k], "done": False}
    path = tmp_path / "part.html"
    path.write_text(static_html(part))
    page = browser.new_page()
    page.goto(path.as_uri())
    page.wait_for_selector(".pkv[data-total]", timeout=30_000)
    page.keyboard.press("End")
    wait_step(page, k)
    page.locator('[data-act="step"]').click()
    assert "Computing the next step" in page.locator('[data-role="notice"]').inner_text()
    assert shown_step(page) == k
    page.evaluate(
        "(rest) => globalThis.__pkvActive.receive(rest)",
        {**whole, "head": None, "base": k, "steps": whole["steps"][k:], "done": True},
    )
    wait_step(page, k + 1)
    assert page.locator('[data-role="notice"]').is_hidden()
    page.close()


@pytest.mark.browser
def test_a_finished_page_is_quiet_and_loads_the_player_by_url(server, browser):
    """Once its run is recorded, an open lesson page stops talking to the server: the fragment that
    streamed the steps polled every half second for as long as the tab stayed open, rerunning every
    panel. The player's js and css come by URL (cached), not inline in every rerun."""
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    urls, frames = [], []
    page.on("request", lambda r: urls.append(r.url))
    page.on(
        "websocket", lambda ws: ws.on("framereceived", lambda f: frames.append(time.monotonic()))
    )
    open_player(page, server + "/eviction")
    wait_idle(page)
    page.wait_for_timeout(1500)
    quiet_from = time.monotonic()
    page.wait_for_timeout(3000)
    assert [t for t in frames if t > quiet_from] == [], "the page reran with nothing to say"
    assert any(u.endswith("/paged_kv_lab.player/player.js") for u in urls), urls
    page.close()


@pytest.mark.browser
def test_requests_table_and_over_time_chart_follow_the_cursor(server, browser):
    """The player's requests table at a step equals an independent engine's snapshot there, the
    over-time chart has one point per step up to the cursor, and a hostile request id is text."""
    from kvcore.model import load_model
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.run.scenario import load_scenario
    from paged_kv_lab.ui.state import _encode_base

    rid = "<img src=x onerror=alert(1)>"
    d = {
        "name": "table",
        "engine": {"block_size": 4, "num_gpu_blocks": 24},
        "requests": [
            {"id": rid, "prompt": "The quick brown fox jumps", "max_tokens": 4},
            {"id": "B", "prompt": "The quick brown fox sleeps", "max_tokens": 3, "arrival_step": 1},
        ],
    }
    engine = Engine(load_scenario(d), model=load_model(model_for_browser(), "cpu"))
    snaps = [engine.snapshot()] + [r.snapshot for r in engine.run(max_steps=100)]
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    dialogs = []
    page.on("dialog", lambda dl: (dialogs.append(dl.message), dl.dismiss()))
    open_player(page, server + "/playground?lesson=playground&scn=" + _encode_base(d))
    assert int(page.locator(".pkv").get_attribute("data-total")) == len(snaps) - 1
    page.locator('[data-role="metrics-panel"] summary').click()  # the chart starts closed

    def table():
        return page.locator(".pkv-reqs tbody tr").evaluate_all(
            "rows => rows.map(r => Array.from(r.cells).map(c => c.textContent))"
        )

    def points(series):
        return page.locator(f'[data-role="over"] circle[data-series="{series}"]').evaluate_all(
            "els => els.map(e => Number(e.getAttribute('data-step')))"
        )

    for key, step in (
        ("ArrowRight", 1),
        ("ArrowRight", 2),
        ("ArrowRight", 3),
        ("ArrowLeft", 2),
        ("End", len(snaps) - 1),
    ):
        page.keyboard.press(key)
        wait_step(page, step)
        assert table() == [
            [r.request_id, r.status]
            + [
                str(v)
                for v in (
                    r.num_prompt_tokens,
                    r.num_output_tokens,
                    r.num_computed_tokens,
                    r.num_cached_tokens,
                    r.num_preemptions,
                    r.priority,
                )
            ]
            for r in snaps[step].requests
        ], step
        assert points("usage") == points("hit") == list(range(step + 1)), step
    assert page.locator(f'.pkv-reqs .pkv-badge[data-req="{rid}"]').inner_text() == rid
    assert page.locator(".pkv img, .pkv script").count() == 0 and not dialogs
    page.close()


@pytest.mark.browser
@pytest.mark.alone  # an ask must be answered within the 1.2 s it waits
def test_a_recording_run_streams_in_by_the_players_own_asks(server, browser):
    """While the server records a run, the player asks for new steps (a fragment rerun each) every
    half second; a hidden tab stops asking and starts again when shown; and a click on another page
    in the sidebar while the run records lands on that page (the page used to poll itself and then
    rerun the whole app when the run ended, which could pull the browser back to the old page)."""
    from paged_kv_lab.ui.state import _encode_base

    long = {
        "name": "streams",
        "engine": {"block_size": 4, "num_gpu_blocks": 512, "max_num_seqs": 4},
        "requests": [
            {
                "id": c,
                "prompt": f"{c} {time.time()} tells a long story",
                "max_tokens": 380,
                "ignore_eos": True,
            }
            for c in "ABCD"
        ],
    }
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    sent = []
    page.on("websocket", lambda ws: ws.on("framesent", lambda f: sent.append(time.monotonic())))
    box = open_player(
        page, f"{server}/playground?lesson=playground&scn={_encode_base(long)}", done=False
    )
    hide = """(hidden) => { Object.defineProperty(document, 'visibilityState',
               {value: hidden ? 'hidden' : 'visible', configurable: true});
               document.dispatchEvent(new Event('visibilitychange')); }"""
    page.evaluate(hide, True)
    assert box.get_attribute("data-done") == "false", (
        "the run must still be recording for this test"
    )
    page.wait_for_timeout(1200)  # an ask already sent may still be answered
    quiet_from, shown_total = time.monotonic(), int(box.get_attribute("data-total"))
    page.wait_for_timeout(1500)
    assert [t for t in sent if t > quiet_from] == [], "a hidden tab does not ask"
    assert int(box.get_attribute("data-total")) == shown_total
    page.evaluate(hide, False)
    deadline = time.monotonic() + 10
    while int(box.get_attribute("data-total")) == shown_total and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert int(box.get_attribute("data-total")) > shown_total, (
        "shown again, the tab asks again: steps stream in"
    )
    assert sent[-1] > quiet_from
    page.locator('[data-testid=stSidebarNav] a[href$="/eviction"]').first.click()
    page.wait_for_function("() => location.pathname.endsWith('/eviction')", timeout=10_000)
    page.get_by_text("Pool size (blocks)").first.wait_for(timeout=30_000)
    page.wait_for_timeout(2500)  # the playground run keeps recording meanwhile
    assert page.evaluate("() => location.pathname").endswith("/eviction")
    assert page.get_by_text("Pool size (blocks)").first.is_visible(), (
        "still on the page the learner chose"
    )
    page.close()


@pytest.mark.browser
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_waiting_rows_name_vllms_queues(browser, tmp_path, lang):  # noqa: F811
    """A CPU-tier run where C waits in kv_holding_waiting while its K/V loads, exported: at that
    step C's row names the queue with vLLM's name, its words from the catalogue in the run's
    language and a link to vLLM's scheduler.py; the step after, with C running, no row carries
    one."""
    from paged_kv_lab.player import run_payload, static_html
    from paged_kv_lab.player.payload import WAITING_QUEUES_SOURCE
    from paged_kv_lab.text.i18n import tr
    from support.kv import cpu_tier_holding_run

    _, initial, recs = cpu_tier_holding_run()
    held = next(r.step for r in recs if r.snapshot.waiting_queues)
    plain = held + 1  # C's K/V has landed: it runs, and no row is labelled
    assert not recs[plain - 1].snapshot.waiting_queues and "C" in recs[plain - 1].snapshot.running
    path = tmp_path / "queues.html"
    path.write_text(static_html(run_payload(initial, recs, lang=lang)))
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    page.goto(path.as_uri())
    page.wait_for_selector(".pkv[data-total]", timeout=30_000)
    labels = '[data-role="outputs"] .pkv-queue'
    for step in range(1, max(held, plain) + 1):
        page.keyboard.press("ArrowRight")
        wait_step(page, step)
        if step == plain:
            assert page.locator(labels).count() == 0
        if step == held:
            label = page.locator('[data-role="outputs"] [data-req="C"] .pkv-queue')
            assert label.inner_text() == "kv_holding_waiting"
            assert label.get_attribute("href") == WAITING_QUEUES_SOURCE
            title = label.get_attribute("title")
            assert tr("player.queue_kv_holding_waiting", lang) in title
            assert tr("player.queue_source", lang) in title
            assert page.locator(labels).count() == 1  # only C waits outside plain waiting
    page.close()


@pytest.mark.browser
def test_a_pd_decode_replicas_rows_name_all_three_queues(browser, tmp_path):  # noqa: F811
    """The decode replica of a P/D trace with max_num_inflight_kv_loads: at the first step where
    requests wait in all three queues, each waiting row names its own, as the snapshot says;
    each label's words are the catalogue's for that queue."""
    from paged_kv_lab.player import run_payload, static_html
    from paged_kv_lab.text.i18n import tr
    from support.kv import pd_async_waiting_run

    _, initial, recs = pd_async_waiting_run()
    rec = next(r for r in recs if len(set(r.snapshot.waiting_queues)) == 3)
    want = dict(zip(rec.snapshot.waiting, rec.snapshot.waiting_queues))
    path = tmp_path / "pd.html"
    path.write_text(static_html(run_payload(initial, recs)))
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    page.goto(path.as_uri())
    page.wait_for_selector(".pkv[data-total]", timeout=30_000)
    for step in range(1, rec.step + 1):
        page.keyboard.press("ArrowRight")
        wait_step(page, step)
    shown = page.locator('[data-role="outputs"] [data-req]').evaluate_all(
        "rows => rows.map(r => [r.dataset.req,"
        " (r.querySelector('.pkv-queue') || {}).textContent || null,"
        " (r.querySelector('.pkv-queue') || {}).title || null])"
    )
    got = {rid: q for rid, q, _ in shown if q is not None}
    assert got == want
    for rid, q, title in shown:
        if q is not None:
            assert title.startswith(tr(f"player.queue_{q}", "en")), (rid, q, title)
    page.close()
