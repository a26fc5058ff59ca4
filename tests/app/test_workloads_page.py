"""AppTest: the "Real workloads" page replays a slice of Mooncake's trace (the page's "shipped"
trace pointed at tests/fixtures/mooncake_shared_slice.jsonl), shows the replay's figures, sweeps
the pool size, opens the large-pool player at a step with exactly the frames an independent
recording gives, answers Why? and refuses what is over its budget, naming the limit."""

import json
import os

import pytest

from paged_kv_lab.player.pool_payload import encode_frames
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.workloads_page import (
    KEY,
    MOMENT,
    OVER_TIME_POINTS,
    SERIES,
    WorkloadsState,
    clicked_step,
    load_shipped,
    load_upload,
)
from paged_kv_lab.why.explain_replay import replay_hit_sentences
from paged_kv_lab.workloads.page_data import (
    Settings,
    record_window,
    run_workload,
    series_rows,
)
from paged_kv_lab.workloads.trace_formats import load_trace
from paged_kv_lab.workloads.trace_limits import PAGE_ENV, page_trace_limits
from support.app import app, sidebar_set, vega_charts
from support.paths import FIXTURES

SLICE = FIXTURES / "mooncake_shared_slice.jsonl"


@pytest.fixture(scope="module", autouse=True)
def slice_as_shipped():
    old = os.environ.get("PAGED_KV_LAB_REPLAY_TRACE")
    os.environ["PAGED_KV_LAB_REPLAY_TRACE"] = str(SLICE)
    yield
    if old is None:
        os.environ.pop("PAGED_KV_LAB_REPLAY_TRACE", None)
    else:
        os.environ["PAGED_KV_LAB_REPLAY_TRACE"] = old


@pytest.fixture(scope="module")
def page():
    at = app("workloads")
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[KEY].trace is not None, "the first slice is open at once"
    at.button(key=f"load:{KEY}").click().run()
    at.button(key=f"replay:{KEY}").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.fixture(scope="module")
def independent():
    trace = load_trace(SLICE)
    return trace, run_workload(trace, Settings(), page_trace_limits())


def test_the_page_opens_on_the_first_slice_replayed(independent):
    """No click needed: the shipped trace's first slice, replayed with the form's defaults (the
    server's warm-up replays it ahead; until then a note stands where the figures go)."""
    from paged_kv_lab.ui.workloads_page import RUNS, first_slice, prepare_first_slice

    prepare_first_slice()
    at = app("workloads")
    assert not at.exception, [e.value for e in at.exception]
    key, trace, settings = first_slice(page_trace_limits())
    assert RUNS.ready((key, settings)) and settings == Settings()
    r = independent[1].result
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == f"{r.requests:,}"
    assert metrics["Prefix hit rate"] == f"{100 * r.hit_rate:.1f}%"
    assert len(vega_charts(at)) == 1
    assert not at.get("plotly_chart"), "no plotly figure: its script holds the page back"


def test_the_figures_are_the_replays(page, independent):
    _, run = independent
    r = run.result
    metrics = {m.label: m.value for m in page.metric}
    assert metrics["Requests"] == f"{r.requests:,}"
    assert metrics["Prefix hit rate"] == f"{100 * r.hit_rate:.1f}%"
    assert metrics["Evictions"] == f"{r.evictions:,}" and r.hit_rate > 0.5
    (spec, data), *_ = vega_charts(page)
    assert len(vega_charts(page)) == 1 and not page.get("plotly_chart")
    # usage / hit rate / running / waiting over steps: each series is the replay's, row by row
    rows = series_rows(r, OVER_TIME_POINTS)
    labels = {"usage": "KV usage", "hit_rate": "hit rate (so far)"}
    labels |= {"running": "running", "waiting": "waiting"}
    assert [k for k, _ in SERIES] == list(labels)
    assert list(data.columns) == ["step", *labels.values()]
    assert list(data["step"]) == [x["step"] for x in rows]
    for key, label in labels.items():
        assert list(data[label]) == [x[key] for x in rows], key
    # fractions on the left axis, request counts on the right, as lines; one invisible point per
    # step carries the hover (the step and the four values) and the click
    left, right, picker = spec["layer"]
    assert left["transform"][0]["fold"] == ["KV usage", "hit rate (so far)"]
    assert right["transform"][0]["fold"] == ["running", "waiting"]
    assert left["mark"]["type"] == right["mark"]["type"] == "line"
    assert left["encoding"]["y"]["scale"]["domain"] == [0, 1.02]
    assert right["encoding"]["y"]["axis"]["orient"] == "right"
    assert picker["mark"]["opacity"] == 0 and "transform" not in picker
    tips = [t["field"] for t in picker["encoding"]["tooltip"]]
    assert tips == ["step", *labels.values()]
    # a click selects the nearest step (the browser test clicks it for real)
    (param,) = picker["params"]
    assert param["name"] == MOMENT and param["select"]["fields"] == ["step"]
    assert param["select"]["nearest"] and param["select"]["on"] == "click"


def test_a_click_on_the_chart_opens_the_player_there(independent, monkeypatch):
    """The click handler: Streamlit's selection state for the chart holds the step clicked; the
    page sets the "at step" field to it and records the window around it, once per click."""
    from paged_kv_lab.ui import workloads_page as wp

    assert clicked_step({"selection": {MOMENT: [{"step": 212}]}}) == 212
    assert clicked_step({"selection": {MOMENT: []}}) is None and clicked_step(None) is None
    trace, run = independent
    state = WorkloadsState(trace=trace)
    state.run = run
    opened = []
    monkeypatch.setattr(wp, "open_moment", lambda s, step, lang: opened.append(step))
    monkeypatch.setattr(
        wp.st, "vega_lite_chart", lambda *a, **kw: {"selection": {MOMENT: [{"step": 212}]}}
    )
    session = {}
    monkeypatch.setattr(wp.st, "session_state", session)
    monkeypatch.setattr(wp.st, "subheader", lambda *a, **kw: None)
    monkeypatch.setattr(wp.st, "caption", lambda *a, **kw: None)
    wp.show_over_time(state, "en")
    wp.show_over_time(state, "en")  # the same selection on the next rerun opens nothing again
    assert opened == [212] and session[f"at:{KEY}"] == 212


def pool_data(page) -> dict:
    els = [e for e in page.get("bidi_component") if e.proto.id.endswith(f"pool:{KEY}")]
    assert len(els) == 1
    return json.loads(els[0].proto.json)


def test_a_moment_opens_the_player_on_a_glimpse_then_on_its_whole_window(page, independent):
    """A click sends the glimpse at once (the step, GLIMPSE around it); the whole window, recorded
    in the background once the browser holds the glimpse, follows, its head naming the glimpse's
    run as the one it extends; each is exactly what an independent recording gives."""
    from paged_kv_lab.ui import workloads_page as wp

    trace, _ = independent
    limits = page_trace_limits()
    page.number_input(key=f"at:{KEY}").set_value(300)
    page.button(key=f"open:{KEY}").click().run()
    first = pool_data(page)
    before, after = wp.GLIMPSE
    g = record_window(trace, Settings(), 300, limits, show_before=before, show_after=after)
    assert first["frames"] == json.loads(json.dumps(encode_frames(g.frames)))
    assert [f["s"] for f in first["frames"]] == list(range(300 - before, 301 + after))
    assert first["frames"][first["head"]["start"]]["s"] == 300
    assert first["head"]["num_gpu_blocks"] == 10_000 and "extends" not in first["head"]
    state = page.session_state[KEY]
    key = state.window_key
    assert key is not None, "the whole window is still to come"
    wp.WINDOWS.get(key, lambda: wp._record_whole(state.run, 300))  # what the browser's ask starts
    page.run()
    whole = pool_data(page)
    w = record_window(trace, Settings(), 300, limits)
    assert whole["frames"] == json.loads(json.dumps(encode_frames(w.frames)))
    assert whole["frames"][whole["head"]["start"]]["s"] == 300
    assert whole["head"]["extends"] == first["run"] and whole["run"] != first["run"]
    assert page.session_state[KEY].window_key is None


def test_a_step_entered_or_a_request_picked_has_its_glimpse_recorded_ahead(page, independent):
    """Entering a step in the "open at step" field records its glimpse in the background
    (``GLIMPSES``), before the learner clicks; the click then opens that glimpse, as an
    independent recording gives it. Picking a request does the same for its admission step."""
    from paged_kv_lab.ui import workloads_page as wp
    from paged_kv_lab.workloads.page_data import admission_step

    trace, run = independent
    state = page.session_state[KEY]
    page.number_input(key=f"at:{KEY}").set_value(421).run()
    key = (state.trace_key, state.run.settings, 421)
    ahead = wp.GLIMPSES.wait(key, 120)
    assert ahead is not None, "the glimpse of the step entered is recorded ahead"
    page.button(key=f"open:{KEY}").click().run()
    assert page.session_state[KEY].window is ahead
    before, after = wp.GLIMPSE
    g = record_window(
        trace, Settings(), 421, page_trace_limits(), show_before=before, show_after=after
    )
    assert pool_data(page)["frames"] == json.loads(json.dumps(encode_frames(g.frames)))
    # a request picked: the glimpse of the step it was admitted at
    rid = next(p.request_id for p in run.result.per_request if p.admitted_step > 600)
    page.selectbox(key=f"req:{KEY}").set_value(rid).run()
    step = admission_step(state.run, rid)
    assert wp.GLIMPSES.wait((state.trace_key, state.run.settings, step), 120) is not None


def test_why_tells_a_requests_hit(page, independent):
    trace, run = independent
    hit = next(p for p in run.result.per_request if p.hit_tokens > 0)
    page.toggle(key=f"why_open:{KEY}").set_value(True).run()
    page.selectbox(key=f"why_req:{KEY}").set_value(hit.request_id).run()
    shown = " ".join(m.value for m in page.markdown).replace("\\", "")
    x = run.explain(hit.request_id)[0]
    for line in replay_hit_sentences(
        x, "en", trace.block_size, trace.requests[int(hit.request_id)].hash_ids
    ):
        assert line in shown


def test_the_sweep_draws_hit_rate_against_pool_size(page):
    page.button(key=f"sweep:{KEY}").click().run()
    assert not page.exception, [e.value for e in page.exception]
    charts = vega_charts(page)
    assert len(charts) == 2 and not page.get("plotly_chart")
    spec, data = charts[1]
    xs = list(data[data["design"] == "hit rate (so far)"]["num_gpu_blocks"])
    assert 10_000 in xs and len(xs) >= 3 and xs == sorted(xs)
    assert spec["layer"][0]["encoding"]["x"]["scale"]["type"] == "log"
    state = page.session_state[KEY]
    upper = spec["layer"][1]["data"]["values"][0]
    assert upper["upper"] == state.run.result.upper_bound_hit_rate


def test_every_requests_row_is_sent_once_the_table_is_opened(page, independent):
    """Closed, the expander sends no table (the browser would load and draw a data grid before
    the page shows); opened, every request's row."""
    assert not page.dataframe
    page.session_state[f"reqs_open:{KEY}"] = True
    page.run()
    (table,) = page.dataframe
    ids = [p.request_id for p in independent[1].result.per_request]
    assert list(table.value["request_id"]) == ids
    page.session_state[f"reqs_open:{KEY}"] = False
    page.run()


def test_the_page_speaks_chinese(page):
    sidebar_set(page, "lang", "zh")
    assert any("真实负载" in t.value for t in page.title)
    assert {m.label for m in page.metric} >= {"请求数", "前缀命中率"}
    sidebar_set(page, "lang", "en")


def test_refusals_name_the_limit_and_its_variable(monkeypatch):
    state = WorkloadsState()
    monkeypatch.setenv(PAGE_ENV["max_requests"], "5")
    err = load_shipped(state, 0, 28)
    assert "PAGED_KV_LAB_REPLAY_MAX_REQUESTS" in err and "at most 5" in err
    assert state.trace is None
    data = SLICE.read_bytes()
    err = load_upload(state, data, "slice.jsonl")  # 28 requests > 5
    assert "PAGED_KV_LAB_REPLAY_MAX_REQUESTS" in err and state.trace is None
    monkeypatch.setenv(PAGE_ENV["max_trace_bytes"], "1000")
    err = load_upload(state, data, "slice.jsonl")
    assert "PAGED_KV_LAB_REPLAY_MAX_BYTES" in err and "slice.jsonl" in err
    monkeypatch.delenv(PAGE_ENV["max_trace_bytes"])
    monkeypatch.delenv(PAGE_ENV["max_requests"])
    err = load_upload(state, b'{"timestamp": 0, "input_length": 10}\n', "bad.jsonl")
    assert "line 1" in err and state.trace is None  # the reader names the line and field
    assert load_upload(state, data, "slice.jsonl") is None and len(state.trace) == 28


def test_a_sliding_window_layer_with_longer_blocks_opens_the_player_with_each_groups_size():
    """The form's sliding_window and sliding_block_multiple replay with a full-attention and a
    sliding-window layer whose blocks are 4 x block_size: the player's head gives each group the
    block size the engine's own kv_cache_config has (the scheduler's block is their least common
    multiple), and its frames are an independent recording's, each block's group beside it."""
    from paged_kv_lab.workloads.replay import Replay

    at = app("workloads")
    at.button(key=f"load:{KEY}").click().run()
    at.number_input(key=f"window:{KEY}").set_value(1024).run()
    at.selectbox(key=f"multiple:{KEY}").set_value(4)
    at.button(key=f"replay:{KEY}").click().run()
    assert not at.exception, [e.value for e in at.exception]
    settings = at.session_state[KEY].run.settings
    assert (settings.sliding_window, settings.sliding_block_multiple) == (1024, 4)
    # the infinite-cache figure and Why? count full-attention hits only: left out, and said so
    said = tr("workloads.full_attention_only", "en")
    assert {m.label: m.value for m in at.metric}["Infinite cache would hit"] == "—"
    assert said in [c.value for c in at.caption]
    at.toggle(key=f"why_open:{KEY}").set_value(True).run()
    assert [c.value for c in at.caption].count(said) == 2
    assert f"why_req:{KEY}" not in [b.key for b in at.selectbox]
    at.number_input(key=f"at:{KEY}").set_value(300)
    at.button(key=f"open:{KEY}").click().run()
    data = pool_data(at)
    trace = load_trace(SLICE)
    kvm = Replay(trace, settings.replay_settings(trace)).kv_cache_manager
    sizes = [g.kv_cache_spec.block_size for g in kvm.kv_cache_config.kv_cache_groups]
    assert sizes == [16, 64]
    assert [g["block_size"] for g in data["head"]["groups"]] == sizes
    assert data["head"]["block_size"] == kvm.block_size == 64
    from paged_kv_lab.ui.workloads_page import GLIMPSE

    before, after = GLIMPSE
    g = record_window(
        trace, settings, 300, page_trace_limits(), show_before=before, show_after=after
    )
    assert data["frames"] == json.loads(json.dumps(encode_frames(g.frames)))
    assert all("bg" in f for f in data["frames"] if f["b"])


def test_the_sweep_chart_draws_the_infinite_cache_rule_only_when_given():
    from paged_kv_lab.ui.workloads_page import sweep_chart

    points = [(1000, 0.2), (4000, 0.5)]
    _, with_rule = sweep_chart(points, 0.7, [], "en")
    _, without = sweep_chart(points, None, [], "en")
    assert with_rule["layer"][1]["data"]["values"][0]["upper"] == 0.7
    assert without["layer"] == with_rule["layer"][:1]
