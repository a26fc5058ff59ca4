"""A real ``streamlit run`` of the app and Debian's chromium driven by Playwright: the server, the
page helpers every browser test uses, and the visible-text walk (no Markdown mark may show). The
fixtures that start them (``server``, ``browser``, ``smollm2_server``) are in
tests/browser/conftest.py."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from support.paths import ROOT

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MODEL = os.environ.get("PAGED_KV_LAB_BROWSER_MODEL", "tiny-random")  # smollm2 for the real model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model_for_browser() -> str:
    from kvcore.model import smollm2_available

    return MODEL if MODEL != "smollm2" or smollm2_available() else "tiny-random"


@contextlib.contextmanager
def streamlit_server(model: str, warm_up: bool = False):
    """``streamlit run`` of the app on 127.0.0.1 and a free port, in its own process group;
    yields (url, process) once /_stcore/health answers, and stops the whole group afterwards.
    The server's warm-up (every lesson, case and study recorded ahead, app/warm_up.py) runs only
    where a test measures it: elsewhere it would only take the two cores from the tests."""
    port = free_port()
    env = {
        **os.environ,
        "PAGED_KV_LAB_MODEL": model,
        "PAGED_KV_LAB_DEVICE": "cpu",
        "PAGED_KV_LAB_WARM_UP": "1" if warm_up else "0",
    }
    if warm_up:
        # a warm-up that is timed records its runs itself: runs other processes kept on disk
        # (store/run_files.py) would end it before the tests could visit during it
        env["PAGED_KV_LAB_RUN_FILES"] = "off"
    # the server's log goes to a file: an undrained pipe fills up and then blocks the server
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "paged_kv_lab/streamlit_app.py",
            "--server.headless",
            "true",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
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
                log.seek(0)
                out = log.read().decode(errors="replace")
                pytest.fail(f"streamlit did not become healthy: {out[-2000:]}")
            time.sleep(0.3)
        with registered_server(proc.pid):
            yield url, proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


# Under xdist, the folder where each worker lists the servers it runs (tests/conftest.py sets it):
# an ``alone`` test pauses the other workers' servers while it runs (their run stores go on
# computing steps ahead between tests, SmolLM2's on two threads, and would time themselves into
# the alone test's figures)
SERVERS_ENV = "PAKV_TEST_SERVERS"


@contextlib.contextmanager
def registered_server(pgid: int):
    """List the server (its process group) as this worker's while it runs."""
    folder = os.environ.get(SERVERS_ENV)
    if not folder:
        yield
        return
    entry = os.path.join(folder, f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.{pgid}")
    os.makedirs(folder, exist_ok=True)
    open(entry, "w").close()
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(entry)


def register_worker(folder: str) -> None:
    """List this xdist worker's own process (``<worker>.p<pid>``): its background threads (a run
    store computing ahead in an app test's process) pause with its servers."""
    os.makedirs(folder, exist_ok=True)
    me = os.environ.get("PYTEST_XDIST_WORKER", "main")
    open(os.path.join(folder, f"{me}.p{os.getpid()}"), "w").close()


def _signal_entry(name: str, sig: int) -> bool:
    """``sig`` to a listed server's process group (``<worker>.<pgid>``) or a worker's process
    (``<worker>.p<pid>``); False if it is gone."""
    _, _, ref = name.rpartition(".")
    try:
        if ref.startswith("p") and ref[1:].isdigit():
            os.kill(int(ref[1:]), sig)
        elif ref.isdigit():
            os.killpg(int(ref), sig)
        else:
            return False
    except (ProcessLookupError, PermissionError):
        return False
    return True


@contextlib.contextmanager
def others_paused(folder: str):
    """The other workers, and the servers they listed, stopped (SIGSTOP) for the block, then
    continued (SIGCONT). Their tests wait for the block's end anyway (the alone lock); what they
    do besides (a run store computing ahead, a server's, or one in the worker's own process; a
    worker still collecting) stops too."""
    me = os.environ.get("PYTEST_XDIST_WORKER", "main")
    paused = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.rpartition(".")[0] != me and _signal_entry(name, signal.SIGSTOP):
            paused.append(name)
    try:
        yield paused
    finally:
        for name in paused:
            _signal_entry(name, signal.SIGCONT)


def resume_mine(folder: str) -> None:
    """SIGCONT to this worker's listed servers: a no-op unless an alone test's worker ended
    without continuing them (killed), when this worker's next test would find them stopped."""
    me = os.environ.get("PYTEST_XDIST_WORKER", "main")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.rpartition(".")[0] == me:
            _signal_entry(name, signal.SIGCONT)


def wait_idle(page, timeout=120_000):
    """Until Streamlit finished the rerun (its status widget disappears)."""
    page.wait_for_timeout(250)
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=stStatusWidget]')", timeout=timeout
    )


def open_player(page, url, done=True):
    page.goto(url)
    try:
        page.wait_for_selector(".pkv[data-total]", timeout=180_000)
    except Exception:
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "test-artifacts" / "player-missing.png"))
        raise
    # the run streamed in to its end (the tiny model records a lesson in well under a second)
    if done:
        page.wait_for_selector('.pkv[data-done="true"]', timeout=180_000)
    return page.locator(".pkv")


def shown_step(page) -> int:
    return int(page.locator(".pkv").get_attribute("data-step"))


def wait_step(page, n: int):
    page.wait_for_selector(f'.pkv[data-step="{n}"]', timeout=10_000)


# The visible text nodes of a document, its shadow roots and their shadow roots, minus the text
# that shows tokens or code verbatim (the player's token texts, its tooltip, code blocks, fields).
VISIBLE_TEXT = """() => {
  const SKIP = 'pre, textarea, input, .pkv-text, .pkv-tip, [data-testid="stCode"], .stCode';
  const texts = [];
  const walk = (root) => {
    const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT | NodeFilter.SHOW_ELEMENT);
    for (let n = w.currentNode; n; n = w.nextNode()) {
      if (n.nodeType === Node.ELEMENT_NODE) { if (n.shadowRoot) walk(n.shadowRoot); continue; }
      const p = n.parentElement;
      if (!p || !n.data.trim() || p.closest(SKIP)) continue;
      const seen = { checkOpacity: true, checkVisibilityCSS: true };
      if (p.checkVisibility && !p.checkVisibility(seen)) continue;
      // an event's sentence and the address line quote the tokens they name: “…” (the model's)
      const quotes = p.closest(".pkv-events, .pkv-addr-line");
      texts.push(quotes ? n.data.replace(/“[^”]*”/g, "“…”") : n.data);
    }
  };
  walk(document.body || document.documentElement);
  return texts.join("\\n");
}"""

MARK = re.compile(r".{0,40}(\*\*|`).{0,40}")


def marks(page) -> list[str]:
    """Markdown marks in the visible text of the page and of every frame in it."""
    found = []
    for frame in page.frames:
        try:
            text = frame.evaluate(VISIBLE_TEXT)
        except Exception:  # a frame that went away while the page reran
            continue
        found += [m.group(0) for m in MARK.finditer(text)]
    return found


def settle(page, limit_s: float = 90.0):
    """Until the page is drawn: Streamlit idle, and its text the same on two looks 0.4 s apart (a
    page's player and panels arrive after its first paint). Bounded."""
    text = None
    for _ in range(int(limit_s / 0.4)):
        wait_idle(page)
        now = page.evaluate(VISIBLE_TEXT)
        if now == text:
            return
        text = now
        page.wait_for_timeout(400)


def go(page, url: str) -> None:
    """To another page of the app as a learner does, by its sidebar link (no reload)."""
    path = "/" + url.split("/", 3)[3].split("?")[0]
    page.locator(f'[data-testid=stSidebarNav] a[href="{url}"]').click()
    page.wait_for_function("(p) => location.pathname === p", arg=path.rstrip("/") or "/")
