"""One real browser: Debian's chromium, driven by Playwright, through the prefix-caching lesson."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MODEL = os.environ.get("PAGED_KV_LAB_BROWSER_MODEL", "smollm2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_for_browser() -> str:
    from kvcore.model import smollm2_available
    return MODEL if MODEL != "smollm2" or smollm2_available() else "tiny-random"


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {**os.environ, "PAGED_KV_LAB_MODEL": model_for_browser(), "PAGED_KV_LAB_DEVICE": "cpu"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.read().decode().strip() == "ok":
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                out = proc.stdout.read().decode(errors="replace") if proc.poll() is not None else ""
                pytest.fail(f"streamlit did not become healthy: {out[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright python package is not installed")
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        except Exception as e:  # e.g. missing shared libraries for a headless browser
            pytest.skip(f"chromium cannot start here: {str(e).splitlines()[0]}")
        yield b
        b.close()


def wait_idle(page, timeout=120_000):
    """Until Streamlit finished the rerun (its status widget disappears)."""
    page.wait_for_timeout(250)
    page.wait_for_function("() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=timeout)


@pytest.mark.browser
def test_prefix_caching_lesson_shows_a_hit(server, browser):
    page = browser.new_page(viewport={"width": 1500, "height": 1900})
    page.goto(server + "/prefix_caching")
    page.wait_for_selector(".js-plotly-plot", timeout=180_000)
    wait_idle(page)
    assert "Prefix caching and hash chains" in page.inner_text("h1")
    step = page.locator("button[kind=primary]").filter(has_text="Step").first
    hit = page.get_by_text("hit 3 cached blocks")
    for n in range(1, 13):
        step.click()
        page.get_by_text(f"Step {n} of {n} computed").wait_for(timeout=120_000)
        wait_idle(page)
        if hit.count():
            break
    assert hit.count(), "stepping the lesson shows B's cache hit"
    assert page.get_by_text("touch [1, 2, 3]").count()
    assert "step=" in page.url and "lesson=prefix" in page.url
    grid_text = page.locator(".js-plotly-plot").first.inner_text()
    assert "r2" in grid_text, "blocks shared by A and B show ref_cnt 2 in the grid"
    page.wait_for_timeout(800)
    out = ROOT / "test-artifacts"
    out.mkdir(exist_ok=True)
    page.screenshot(path=str(out / "prefix-caching-hit.png"))
    (ROOT / "docs").mkdir(exist_ok=True)
    if os.environ.get("PAGED_KV_LAB_UPDATE_SCREENSHOT"):  # refresh the README's picture on request only
        shutil.copy(out / "prefix-caching-hit.png", ROOT / "docs" / "screenshot.png")
    page.close()
