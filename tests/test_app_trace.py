"""AppTest: the trace viewer opens what `python -m kvcore run --trace` wrote and steps through it.

The trace is written by the real CLI (tiny model); what the page shows is compared with an
independent engine stepped to the same step, as for the lesson pages.
"""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from _app_helpers import APP, TIMEOUT, app, charts, grid_cells, metric, queue_order, sidebar_set  # noqa: F401
from _app_helpers import tiny, tiny_model_env  # noqa: F401
from streamlit.testing.v1 import AppTest

from kvcore.scenario import load_scenario
from lesson.events import step_sentences
from lesson.lessons import PAGE_FILES
from lesson.panels import md_escape_keep
from lesson.trace_page import PAGE_FILE, STATE_KEY

ROOT = Path(__file__).resolve().parent.parent
EVICTION = ROOT / "examples" / "eviction.json"


@pytest.fixture(scope="module")
def cli_trace(tmp_path_factory) -> str:
    """examples/eviction.json replayed by the CLI on the tiny model, as a trace file."""
    out = tmp_path_factory.mktemp("trace") / "eviction.jsonl"
    r = subprocess.run([sys.executable, "-m", "kvcore", "run", str(EVICTION), "--model", "tiny-random",
                        "--device", "cpu", "--trace", str(out), "--quiet"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return out.read_text()


@pytest.fixture(scope="module")
def engine_records(tiny):
    """The same scenario on an independent engine: (state before step 1, records)."""
    from kvcore.engine import Engine
    engine = Engine(replace(load_scenario(EVICTION), model="tiny-random", device="cpu"), model=tiny)
    initial = engine.snapshot()
    return initial, engine.run()


def snapshot_at(engine_records, step):
    initial, records = engine_records
    return initial if step == 0 else records[step - 1].snapshot


def trace_app(lang: str = "en") -> AppTest:
    """The trace viewer, opened from the app, with the tiny model in the sidebar (the model that wrote
    the trace, so token text is decoded)."""
    at = app(PAGE_FILE)
    sidebar_set(at, "model_name", "tiny-random")
    if lang != "en":
        sidebar_set(at, "lang", lang)
    assert not at.exception, [e.value for e in at.exception]
    return at


def upload(at, text, name="eviction.jsonl") -> AppTest:
    data = text.encode() if isinstance(text, str) else text
    at.file_uploader(key="up:trace").upload(name, data, "application/jsonl").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def assert_shows(at, snap, step_label="Step", free_label="free blocks"):
    figs = charts(at)
    assert metric(at, step_label) == str(snap.step)
    assert metric(at, free_label) == str(snap.num_free_blocks)
    cells = grid_cells(figs["grid:trace"])
    for b in snap.blocks:
        if b.ref_cnt > 0:
            assert f"r{b.ref_cnt}" in cells[b.block_id], (b, cells[b.block_id])
    if snap.free_queue:
        assert queue_order(figs["queue:trace"]) == list(snap.free_queue)
    assert {"grid:trace", "queue:trace", "tables:trace", "chains:trace", "metrics:trace"} <= set(figs)


def markdown(at) -> str:
    return "\n".join(m.value for m in at.markdown)


def test_open_a_cli_trace_and_step_through_it(cli_trace, engine_records, tiny):
    at = trace_app()
    assert any("Trace viewer" in t.value for t in at.title)
    assert any("No trace loaded" in i.value for i in at.info) and not charts(at)
    upload(at, cli_trace)
    n = len(engine_records[1])
    assert any(f"Loaded trace “eviction.jsonl”: {n} steps." in s.value for s in at.success)
    assert_shows(at, snapshot_at(engine_records, 0))
    assert at.button(key="back:trace").disabled
    for step in (1, 2):
        at.button(key="step:trace").click().run()
        assert not at.exception, [e.value for e in at.exception]
        assert_shows(at, snapshot_at(engine_records, step))
    rec = engine_records[1][1]
    for _, sentence in step_sentences(rec.events, "en", tiny.decode):
        assert md_escape_keep(sentence) in markdown(at), sentence
    at.button(key="back:trace").click().run()
    assert_shows(at, snapshot_at(engine_records, 1))
    at.slider(key="timeline:trace").set_value(5).run()
    assert_shows(at, snapshot_at(engine_records, 5))
    # run until an event, within the recorded steps
    found = {k: next((r.step for r in engine_records[1][5:] if any(e.kind == k for e in r.events)), None)
             for k in ("evicted", "cache_hit", "finished")}
    kind, step = next((k, s) for k, s in found.items() if s is not None)
    at.selectbox(key="until_kind:trace").set_value(kind).run()
    at.button(key="until:trace").click().run()
    label = {"evicted": "eviction", "cache_hit": "cache hit", "finished": "a request finishing"}[kind]
    assert any(f"First “{label}” event at step {step}" in s.value for s in at.success)
    assert_shows(at, snapshot_at(engine_records, step))
    at.button(key="end:trace").click().run()
    assert_shows(at, snapshot_at(engine_records, n))
    assert at.button(key="step:trace").disabled and at.button(key="end:trace").disabled
    # the outputs line and the header's scenario
    final = json.loads(cli_trace.splitlines()[-1])["outputs"]
    table = at.dataframe[-1].value
    assert list(table["request"]) == list(final) and list(table["text"]) == [o["text"] for o in final.values()]
    assert "`block_size=4`" in markdown(at) and "`num_gpu_blocks=14`" in markdown(at)
    assert not any("shown as ids" in c.value for c in at.caption), "the trace's model is loaded: text is decoded"
    assert "step" not in at.query_params and "lesson" not in at.query_params


def test_token_ids_when_the_trace_was_recorded_with_another_model(cli_trace):
    header, *rest = cli_trace.splitlines()
    h = json.loads(header)
    h["scenario"]["model"] = "smollm2"
    at = upload(trace_app(), "\n".join([json.dumps(h)] + rest))
    assert any("shown as ids: the trace was recorded with smollm2, the sidebar's model is tiny-random" in c.value
               for c in at.caption)
    assert charts(at)["grid:trace"]


BAD_FILES = [
    ("broken.jsonl", "{not json", "line 1: not JSON"),
    ("order.jsonl", lambda lines: "\n".join([lines[0], lines[2]]), "line 2: step 2 first: steps must be 1, 2, 3..."),
    ("cut.jsonl", lambda lines: "\n".join([lines[0], lines[1][:300]]), "line 2: not JSON"),
    ("scenario.json", EVICTION.read_text(), "this looks like a scenario file, not a trace"),
    ("empty.jsonl", "", "empty file"),
    ("binary.jsonl", b"\xff\xfe\x00", "not UTF-8"),
]


def test_a_bad_file_shows_why_and_keeps_the_trace(cli_trace, engine_records):
    at = upload(trace_app(), cli_trace)
    for _ in range(2):
        at.button(key="step:trace").click().run()
    state = at.session_state[STATE_KEY]
    before = (state.run, state.run.cursor, state.name)
    lines = cli_trace.splitlines()
    for name, content, needle in BAD_FILES:
        upload(at, content(lines) if callable(content) else content, name)
        errors = " ".join(e.value for e in at.error)
        assert f"“{name}” was not loaded; the trace shown before is kept" in errors and needle in errors, errors
        assert (state.run, state.run.cursor, state.name) == before
        assert_shows(at, snapshot_at(engine_records, 2))
    at.button(key="step:trace").click().run()
    assert_shows(at, snapshot_at(engine_records, 3))  # the old trace keeps working


def test_a_trace_without_header_starts_at_step_one(cli_trace, engine_records):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.switch_page(PAGE_FILE).run()          # a deep link: the first run is the trace page itself
    assert not at.exception
    lines = cli_trace.splitlines()
    upload(at, "\n".join(lines[1:-1]), "old.jsonl")      # no header, and cut before the outputs line
    assert any("no header line" in i.value for i in at.info)
    assert any("does not say which model" in c.value for c in at.caption)
    assert any("no outputs line" in c.value for c in at.caption)
    assert_shows(at, snapshot_at(engine_records, 1))
    assert at.button(key="back:trace").disabled
    assert at.slider(key="timeline:trace").min == 1
    at.button(key="step:trace").click().run()
    assert_shows(at, snapshot_at(engine_records, 2))
    at.slider(key="timeline:trace").set_value(1).run()
    assert_shows(at, snapshot_at(engine_records, 1))


def test_chinese(cli_trace, engine_records, tiny):
    at = trace_app("zh")
    assert any("轨迹查看器" in t.value for t in at.title)
    assert any("尚未加载轨迹" in i.value for i in at.info)
    upload(at, cli_trace)
    assert any("已加载轨迹" in s.value for s in at.success)
    assert at.button(key="step:trace").label.startswith("单步")
    at.button(key="step:trace").click().run()
    assert_shows(at, snapshot_at(engine_records, 1), "步", "空闲块")
    for _, sentence in step_sentences(engine_records[1][0].events, "zh", tiny.decode):
        assert md_escape_keep(sentence) in markdown(at), sentence
    upload(at, "{x", "bad.jsonl")
    assert any("未加载" in e.value for e in at.error)
    assert metric(at, "步") == "1"


def test_example_trace_then_open_its_scenario_in_the_playground(engine_records):
    at = trace_app()
    at.button(key="example:trace").click().run()
    assert not at.exception and not at.error
    state = at.session_state[STATE_KEY]
    t = state.run.trace
    assert state.name == "eviction.jsonl" and t.scenario["name"] == "eviction" and t.scenario["model"] == "tiny-random"
    assert t.initial == engine_records[0] and list(t.records) == engine_records[1], \
        "the example is what the CLI writes for examples/eviction.json"
    at.button(key="step:trace").click().run()
    assert_shows(at, snapshot_at(engine_records, 1))
    at.button(key="playground:trace").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Playground" in t.value for t in at.title)
    run = at.session_state["lesson:playground"].run
    assert run.scenario.name == "eviction" and [r.id for r in run.scenario.requests] == ["A", "B", "C"]
    assert run.scenario.engine == load_scenario(EVICTION).engine
    assert any("Loaded scenario “eviction”" in s.value for s in at.success)
