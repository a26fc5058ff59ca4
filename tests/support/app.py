"""Driving the app with AppTest on the tiny model: shared by the page tests (test_app_pages.py,
test_app_trace.py). Importing the fixtures into a test module makes them that module's fixtures."""

import json
import os

os.environ.setdefault("PAGED_KV_LAB_MODEL", "tiny-random")
os.environ.setdefault("PAGED_KV_LAB_DEVICE", "cpu")

from streamlit.testing.v1 import AppTest  # noqa: E402

from support.paths import ROOT  # noqa: E402

APP = str(ROOT / "paged_kv_lab" / "streamlit_app.py")
TIMEOUT = 180


def sidebar_set(at, key, value):
    """Set a sidebar choice on a page as the sidebar's widgets would: the session keys they
    write (``key`` and ``_prefs``), then a run."""
    at.session_state[key] = value
    at.session_state["_prefs"] = {**at.session_state["_prefs"], key: value}
    return at.run()


def open_page(at: AppTest, page_id: str) -> AppTest:
    """Go to the registry's page ``page_id`` at the next ``run()``, as a browser does at
    ``/<slug>``: Streamlit routes by the page's URL path, whose hash is what st.Page registers
    (``AppTest.switch_page`` takes page files only, and the app's pages are functions). Before
    the first run it is a first visit (a deep link); after it, a page switch."""
    from streamlit.util import calc_hash

    from paged_kv_lab.content.registry import page

    at._page_hash = calc_hash(page(page_id).url_path)  # AppTest has no public way for st.Page
    registered = at._registered_pages
    if registered:
        assert at._page_hash in registered, f"{page_id}: not in the app's navigation"
    return at


def app(page: str | None = None) -> AppTest:
    """The app (home page first), then the registry's page ``page`` (an id) if one is given."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    assert not at.exception, [e.value for e in at.exception]
    if page:
        open_page(at, page).run()
        assert not at.exception, [e.value for e in at.exception]
    return at


def server_drawn(at) -> list[str]:
    """Pictures drawn by the server on the page (plotly and Vega-Lite charts, dataframes): the
    per-step ones are the browser player's, so a lesson's fragment has none (it reruns on every
    cursor report)."""
    kinds = ("plotly_chart", "vega_lite_chart", "dataframe")
    return [e.type for kind in kinds for e in at.get(kind)]


def vega_charts(at) -> list[tuple]:
    """The page's Vega-Lite charts as (spec, data): the spec as Streamlit sent it, the data
    decoded from the Arrow table it sent with it."""
    from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df

    return [
        (json.loads(e.proto.spec), convert_arrow_bytes_to_pandas_df(e.proto.data.data))
        for e in at.get("vega_lite_chart")
    ]


def player_data(at, key: str) -> dict:
    """What the page sent the browser player in its last run (``key``: a lesson id or "trace")."""
    els = [e for e in at.get("bidi_component") if e.proto.id.endswith(f"pkv:{key}")]
    assert len(els) == 1, f"one player for {key}, found {len(els)}"
    return json.loads(els[0].proto.json)


class Browser:
    """The browser side of one player: the head, then every step streamed (checked to arrive in
    order, none skipped). ``snaps`` are the snapshots the browser's decoder rebuilds from them
    (player/assets/decode.js, checked in a real browser by tests/browser/test_browser_decoder.py):
    each step is checked here to be exactly the delta (player.delta) from the snapshot before to the
    snapshot the page recorded for that step, and that recorded snapshot is the one kept."""

    def __init__(self, at, key: str) -> None:
        self.at, self.key = at, key
        self.run_token, self.head, self.steps, self.snaps, self.vocab = None, None, [], [], {}
        self.done, self.hold_at, self.goto = False, None, None
        self.sync()

    def recorded(self) -> tuple[list, int]:
        """The records of the run the page streams (its Timeline) and its ``first``."""
        run = self.at.session_state[f"player:{self.key}"].run
        return run.records, run.first

    def sync(self) -> "Browser":
        from paged_kv_lab.player import WIRE, delta, snapshot_dict

        d = player_data(self.at, self.key)
        if d["run"] != self.run_token and d["head"] is None:
            # a run this browser never saw the head of: ask for it again, as player.js does
            self.at.session_state[f"pkv:{self.key}"] = {"have": {"run": d["run"], "n": -1}}
            self.at.run()
            d = player_data(self.at, self.key)
            assert d["head"] is not None and d["base"] == 0, (
                "asked again, the page sends the run from its start"
            )
        if d["run"] != self.run_token:
            assert d.get("wire") == WIRE and d.get("strings"), (
                "the head comes with the wire keys and the words"
            )
            self.run_token, self.head, self.steps = d["run"], d["head"], []
            self.snaps, self.vocab = [d["head"]["initial"]], dict(d["head"]["vocab"])
        assert d["base"] <= len(self.steps), "no step is skipped"
        new = d["steps"][len(self.steps) - d["base"] :]
        if new:
            records, first = self.recorded()
            if len(self.steps) == 0:
                start = (
                    records[0].snapshot
                    if first
                    else self.at.session_state[f"player:{self.key}"].run.initial
                )
                assert self.snaps[0] == snapshot_dict(start), (
                    "the head holds the state the run starts from"
                )
            state = set(WIRE["snapshot"].values()) | {WIRE["step"]["request_order"]}
            for st in new:
                cur = snapshot_dict(records[len(self.steps) + first].snapshot)
                assert {k: v for k, v in st.items() if k in state} == delta(self.snaps[-1], cur), (
                    f"step {cur['step']} is the delta to the recorded snapshot"
                )
                self.steps.append(st)
                self.vocab.update(st["vocab"])
                self.snaps.append(cur)
        self.done, self.hold_at = d["done"], d["hold_at"]
        self.goto = d["goto"] or self.goto  # a jump is sent once; the browser remembers it
        return self

    def run(self) -> "Browser":
        self.at.run()
        assert not self.at.exception, [e.value for e in self.at.exception]
        return self.sync()

    def until_recorded(self, n: int, seconds: float = 60) -> "Browser":
        """Rerun (as player.js's ``poll`` asks do) until ``n`` steps have arrived or the run
        ended."""
        import time

        t0 = time.time()
        while len(self.steps) < n and not self.done and time.time() - t0 < seconds:
            time.sleep(0.05)
            self.run()
        return self

    def show(self, step: int) -> "Browser":
        """The learner moves the player to ``step``: the browser reports its cursor, the page
        reruns."""
        self.until_recorded(step)
        self.at.session_state[f"pkv:{self.key}"] = {"cursor": {"run": self.run_token, "step": step}}
        return self.run()

    def texts(self, step: int) -> list[str]:
        return [e[3] for e in self.steps[step - 1]["ev"]] if step else []


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def pick_case(at, case):
    """On the casebook page: choose the case's group, then the case, as a visitor does."""
    if at.radio(key="casebook:where").value != case.where:
        at.radio(key="casebook:where").set_value(case.where).run()
    at.radio(key="casebook:case").set_value(case.id).run()
