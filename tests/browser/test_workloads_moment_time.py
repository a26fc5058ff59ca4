"""Stepping into a moment of a replay, timed in chromium: on the "Real workloads" page, from the
click on "Open the player at this step" to the large-pool player showing that step, at most 1 s
on the default slice (the shipped trace's first 100 requests) and at most 2 s on the whole shipped
trace, at steps early, in the middle and late in the run (issue 45: the window resumes from the
run's checkpoints, workloads/replay.py's ``Checkpoints``)."""

import os
import re
import time

import pytest

from support.browser import streamlit_server, wait_idle

pytestmark = pytest.mark.browser

# the page's budget raised so that it takes the whole shipped trace (its defaults stop at 400
# requests); the default slice is the same either way
WHOLE = {
    "PAGED_KV_LAB_REPLAY_MAX_REQUESTS": "4000",
    "PAGED_KV_LAB_REPLAY_MAX_TOKENS": str(10**9),
    "PAGED_KV_LAB_REPLAY_MAX_BYTES": str(10**9),
    "PAGED_KV_LAB_REPLAY_MAX_STEPS": str(10**8),
}


@pytest.fixture(scope="module")
def server():
    old = {k: os.environ.get(k) for k in WHOLE}
    os.environ.update(WHOLE)
    try:
        with streamlit_server("tiny-random") as (url, _):
            yield url
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def replay_requests(page, server, count: int, blocks: int, timeout_ms: int) -> int:
    """The shipped trace's first ``count`` requests replayed with the page's defaults but a pool
    of ``blocks``; the run's number of steps."""
    page.goto(server + "/real_workloads")
    use = page.get_by_role("button", name="Use these requests")
    use.wait_for(timeout=180_000)
    wait_idle(page)
    field = page.get_by_label("Requests (at most", exact=False)
    field.fill(str(count))
    field.press("Enter")
    wait_idle(page)
    use.click()
    wait_idle(page)
    pool = page.get_by_label("num_gpu_blocks", exact=True)
    pool.fill(str(blocks))
    pool.press("Enter")
    wait_idle(page)
    page.get_by_role("button", name="Replay", exact=True).click()
    wait_idle(page, timeout=timeout_ms)
    field = page.get_by_label("Step (1–", exact=False)
    field.wait_for(timeout=timeout_ms)
    got = re.search(r"Step \(1–([\d,]+)\)", field.get_attribute("aria-label"))
    return int(got.group(1).replace(",", ""))


def seconds_to_open(page, step: int) -> float:
    """From the click to the player showing ``step``."""
    field = page.get_by_label("Step (1–", exact=False)
    field.fill(str(step))
    field.press("Enter")
    wait_idle(page)
    button = page.get_by_role("button", name="Open the player at this step")
    t0 = time.perf_counter()
    button.click()
    page.wait_for_selector(f'.pkv-pool[data-step="{step}"]', timeout=120_000)
    return time.perf_counter() - t0


# Not reached yet (issue 45, point 2), so both cases are expected to fail, strictly: the day one
# passes, its mark goes. Measured: the slice 7.7-13.1 s a click at load average 16-19 (the
# server's work a click, in CPU seconds: the window 0.96, its payload 0.44, before the page's rerun
# and the browser); the whole trace's replay on the page took 934 s at load 20, its windows 24-142
# s (docs/results.md).
NOT_YET = pytest.mark.xfail(
    strict=True, reason="issue 45 point 2: a moment does not open within its bound yet"
)


# the default slice with the page's default pool; the whole trace with the smallest round pool
# its longest request fits in at block size 16 (11,963 blocks)
@pytest.mark.alone
@pytest.mark.parametrize(
    "count,blocks,bound_s,replay_ms",
    [
        pytest.param(100, 10_000, 1.0, 600_000, id="slice", marks=NOT_YET),
        pytest.param(
            3993, 16_000, 2.0, 3_600_000, id="whole", marks=[NOT_YET, pytest.mark.timeout(5400)]
        ),
    ],
)
def test_a_moment_opens_within_its_bound(server, browser, count, blocks, bound_s, replay_ms):
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    steps = replay_requests(page, server, count, blocks, replay_ms)
    assert steps > 100
    took = {}
    for at in (steps // 10, steps // 2, steps - steps // 10):
        took[at] = seconds_to_open(page, at)
    print(f"\n{count} requests, {steps} steps: seconds to open {took}")
    assert max(took.values()) <= bound_s, took
    page.close()
