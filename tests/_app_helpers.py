"""Driving the app with AppTest on the tiny model: shared by the page tests (test_app_pages.py,
test_app_trace.py). Importing the fixtures into a test module makes them that module's fixtures."""
import json
import os

import pytest

os.environ.setdefault("PAGED_KV_LAB_MODEL", "tiny-random")
os.environ.setdefault("PAGED_KV_LAB_DEVICE", "cpu")

from streamlit.testing.v1 import AppTest  # noqa: E402

APP = os.path.join(os.path.dirname(__file__), "..", "app.py")
TIMEOUT = 180


@pytest.fixture(scope="module", autouse=True)
def tiny_model_env():
    old = {k: os.environ.get(k) for k in ("PAGED_KV_LAB_MODEL", "PAGED_KV_LAB_DEVICE")}
    os.environ["PAGED_KV_LAB_MODEL"], os.environ["PAGED_KV_LAB_DEVICE"] = "tiny-random", "cpu"
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def tiny():
    from kvcore.model import load_model
    return load_model("tiny-random", "cpu")


def sidebar_set(at, key, value):
    """Set a sidebar choice on a page. AppTest.switch_page runs the page file alone (not app.py),
    so there is no sidebar there; the page reads the same session keys the sidebar widgets write."""
    at.session_state[key] = value
    at.session_state["_prefs"] = {**at.session_state["_prefs"], key: value}
    return at.run()


def app(page: str | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    if page:
        at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at) -> dict[str, dict]:
    """Plotly figures on the page by their key ("grid:prefix", "queue:prefix", ...)."""
    return {el.proto.id.rsplit("-", 1)[-1]: json.loads(el.proto.spec) for el in at.get("plotly_chart")}


def grid_cells(fig) -> list[str]:
    hm = next(t for t in fig["data"] if t["type"] == "heatmap")
    return [c for row in hm["text"] for c in row if c]


def queue_order(fig) -> list[int]:
    hm = next(t for t in fig["data"] if t["type"] == "heatmap")
    return [int(c.split("</b>")[0].replace("<b>", "")) for row in hm["text"] for c in row if c]


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


