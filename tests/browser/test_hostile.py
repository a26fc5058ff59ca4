"""Hostile input against a real ``streamlit run`` server on 127.0.0.1 (tiny model, chromium).

Each case is what a careless or mischievous visitor can send -- a link, a pasted or uploaded
file, a long action -- and must end with a clear message in that session while the server
stays healthy, its memory stays under RSS_BOUND and a victim session keeps stepping.
"""

import base64
import json
import re
import statistics
import time
import urllib.request
import zlib

import pytest

from paged_kv_lab.content.registry import lesson_page
from support.browser import streamlit_server, wait_idle

# the lesson pages the cases open, by their registry URL paths
PLAYGROUND = lesson_page("playground").url_path
EVICTION = lesson_page("eviction").url_path

RSS_BOUND = 1_500 * 10**6  # the server with the tiny model loaded uses ~0.5 GB
CASE_SECONDS = 60  # no case may take longer than this

# the victim's latency is timed in the tests marked alone; the server's start and the victim's
# first, untimed switches happen before them (test_the_victim_switches_its_pool_size), while the
# other workers still run, so the other workers idle only for what is timed
pytestmark = pytest.mark.browser


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/_stcore/health", timeout=5) as r:
        return r.read().decode().strip() == "ok"


@pytest.fixture(scope="module")
def server():
    with streamlit_server("tiny-random") as (url, proc):
        yield url, proc


def pack(d) -> str:
    raw = d if isinstance(d, bytes) else json.dumps(d).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def playground(*requests, **engine) -> dict:
    return {
        "name": "hostile",
        "engine": {"block_size": 4, "num_gpu_blocks": 16, **engine},
        "requests": list(requests) or [{"id": "A", "prompt": "hello", "max_tokens": 4}],
    }


def errors(page) -> str:
    return "\n".join(page.locator("[data-testid=stAlert]").all_inner_texts())


@pytest.fixture(scope="module")
def victim(server, browser):  # noqa: F811
    """A second session on the eviction lesson; ``step()`` switches its pool size (a new run and a
    rerun of the page on the server) and returns the seconds until the page is idle again."""
    url, _ = server
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(f"{url}/{EVICTION}")
    page.get_by_text("Pool size (blocks)").first.wait_for(timeout=120_000)
    wait_idle(page)

    class Victim:
        sizes = ("14", "12")
        n = 0

        def step(self, timeout_s: float = 30) -> float:
            size = self.sizes[self.n % 2]
            self.n += 1
            button = page.locator("[data-testid=stButtonGroup] button").filter(
                has_text=re.compile(f"^{size}$")
            )
            t0 = time.perf_counter()
            button.first.click()
            page.wait_for_function(
                f"() => new URL(location.href).searchParams.get('num_gpu_blocks') "
                f"{'=== ' + repr(size) if size != '12' else '=== null'}",
                timeout=timeout_s * 1000,
            )
            wait_idle(page, timeout=timeout_s * 1000)
            return time.perf_counter() - t0

        def median(self, k=5) -> float:
            return statistics.median(self.step() for _ in range(k))

        def within_twice(self, k=3) -> None:
            if self.baseline is None:  # measured in the first timed test, the machine quiet
                self.baseline = self.median(3)
            during = self.median(k)
            assert during <= 2 * self.baseline, (
                f"victim {during:.2f} s vs baseline {self.baseline:.2f} s"
            )

    v = Victim()
    # both runs exist in the store after these two: later switches only rerun the page. Each
    # computes a run, untimed, on a machine the other workers share: they get longer than the
    # timed switches (in one fresh clone's full run the first took over 30 s). The baseline is
    # taken by the first timed test, alone (within_twice)
    v.first = (v.step(120), v.step(120))
    v.baseline = None
    yield v
    page.close()


def check_after(server, t0, seconds=CASE_SECONDS):
    url, proc = server
    assert healthy(url), "the server answers /_stcore/health"
    assert rss(proc.pid) < RSS_BOUND, f"server RSS {rss(proc.pid) / 1e6:.0f} MB"
    assert time.perf_counter() - t0 < seconds


LINK_CASES = {
    "huge pool": (playground(num_gpu_blocks=10**9), "PAGED_KV_LAB_MAX_BLOCKS"),
    "huge block size": (playground(block_size=100_000), "PAGED_KV_LAB_MAX_BLOCK_SIZE"),
    "huge prompt": (
        playground({"id": "A", "prompt": "lorem ipsum " * 20_000}),
        "PAGED_KV_LAB_MAX_PROMPT_CHARS",
    ),
    "many requests": (
        playground(*[{"id": f"r{i}", "prompt": "hi"} for i in range(500)]),
        "PAGED_KV_LAB_MAX_REQUESTS",
    ),
    "huge max_tokens": (
        playground({"id": "A", "prompt": "hi", "max_tokens": 10**9}),
        "PAGED_KV_LAB_MAX_TOKENS",
    ),
    "huge budget": (playground(max_num_batched_tokens=10**9), "PAGED_KV_LAB_MAX_BATCHED_TOKENS"),
    "late arrival": (
        playground({"id": "A", "prompt": "hi", "arrival_step": 10**9}),
        "PAGED_KV_LAB_MAX_RUN_STEPS",
    ),
    "zlib bomb": (b'{"name": "' + b" " * 12_000_000 + b'"}', "PAGED_KV_LAB_MAX_FILE_BYTES"),
}


def test_the_victim_switches_its_pool_size(server, victim):
    """The victim's two first switches (each a new run) moved its page's URL and left the server
    healthy and under its memory bound: the session the timed tests below watch works."""
    assert all(0 < s < 120 for s in victim.first), victim.first
    check_after(server, time.perf_counter())


@pytest.mark.alone
def test_hostile_links_get_clear_messages(server, browser, victim):  # noqa: F811
    url, _ = server
    t0 = time.perf_counter()
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    try:
        for case, (scenario, knob) in LINK_CASES.items():
            t1 = time.perf_counter()
            page.goto(
                f"{url}/{PLAYGROUND}?lesson=playground&scn={pack(scenario)}",
                timeout=CASE_SECONDS * 1000,
            )
            page.get_by_text(knob).first.wait_for(timeout=CASE_SECONDS * 1000)
            assert knob in errors(page), case
            check_after(server, t1)
    finally:
        page.close()
    victim.within_twice()
    check_after(server, t0, CASE_SECONDS * len(LINK_CASES))


@pytest.mark.alone
def test_a_far_step_shows_the_last_step_at_once(server, browser, victim):  # noqa: F811
    url, _ = server
    t0 = time.perf_counter()
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    try:
        page.goto(f"{url}/{EVICTION}?lesson=eviction&step=1000000000")
        page.get_by_text("Pool size (blocks)").first.wait_for(timeout=CASE_SECONDS * 1000)
        wait_idle(page)
        page.wait_for_function(
            "() => Number(new URL(location.href).searchParams.get('step')) < 1000",
            timeout=CASE_SECONDS * 1000,
        )
        step = int(re.search(r"[?&]step=(\d+)", page.url).group(1))
        assert 0 < step <= 400, "the cursor stands at the run's last recorded step"
    finally:
        page.close()
    victim.within_twice()
    check_after(server, t0)


def upload(page, name: str, data: bytes, tries: int = 2) -> None:
    """Hand ``data`` to the page's file uploader as ``name``, until the uploader lists the file:
    an upload into an input that a rerun replaces just then is lost (seen once on a loaded
    machine), so it is given again, at most ``tries`` times."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(tries):
        box = page.locator("input[type=file]").first
        box.wait_for(state="attached", timeout=CASE_SECONDS * 1000)
        box.set_input_files(files=[{"name": name, "mimeType": "application/json", "buffer": data}])
        try:
            listed = page.locator("[data-testid=stFileUploader]").get_by_text(name, exact=True)
            listed.first.wait_for(timeout=CASE_SECONDS * 1000 // 4)
            return
        except PlaywrightTimeout:
            if attempt == tries - 1:
                raise


@pytest.mark.alone
def test_hostile_uploads_get_clear_messages(server, browser, victim):  # noqa: F811
    url, _ = server
    t0 = time.perf_counter()
    for name, data, expect in (
        ("big.json", b'{"name": "' + b"x" * 2_000_000 + b'"}', "PAGED_KV_LAB_MAX_FILE_BYTES"),
        ("utf16.json", json.dumps(playground()).encode("utf-16"), "not UTF-8"),
    ):
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        try:
            page.goto(f"{url}/{PLAYGROUND}", timeout=CASE_SECONDS * 1000)
            page.get_by_text("Scenario file").first.wait_for(timeout=CASE_SECONDS * 1000)
            wait_idle(page)
            page.locator("[data-testid=stExpander] summary").filter(
                has_text="Scenario file"
            ).first.click()
            upload(page, name, data)
            page.get_by_text(expect).first.wait_for(timeout=CASE_SECONDS * 1000)
            assert healthy(url), name
        finally:
            page.close()
    victim.within_twice()
    check_after(server, t0, CASE_SECONDS * 2)


@pytest.mark.alone
def test_long_runs_elsewhere_keep_the_victim_within_twice_its_latency(server, browser, victim):  # noqa: F811
    """A session opens a long scenario (each computed in the background up to the step cap, as
    Run to end or Play would need): the worker interleaves their steps with the victim's work."""
    url, _ = server
    victim.baseline = victim.median(3)  # the machine's load drifts: compare with just before
    t0 = time.perf_counter()
    pages = []
    try:
        for k in range(1):
            long = playground(
                *[
                    {
                        "id": c,
                        "prompt": f"{c}{k} tells a long story",
                        "max_tokens": 300,
                        "ignore_eos": True,
                    }
                    for c in "ABCD"
                ],
                num_gpu_blocks=512,
                max_num_seqs=4,
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(
                f"{url}/{PLAYGROUND}?lesson=playground&scn={pack(long)}",
                timeout=CASE_SECONDS * 1000,
            )
            pages.append(page)
        for page in pages:
            page.get_by_text("Scenario file").first.wait_for(timeout=CASE_SECONDS * 1000)
        victim.within_twice(5)
    finally:
        for page in pages:
            page.close()
    check_after(server, t0)
