"""AppTest: the trace viewer opens what `python -m paged_kv_lab run --trace` wrote and steps
through it.

The trace is written by the real CLI (tiny model); what the page shows is compared with an
independent engine stepped to the same step, as for the lesson pages.
"""

import json
from dataclasses import replace

import pytest
from streamlit.testing.v1 import AppTest

from paged_kv_lab.player import snapshot_dict
from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.ui.trace_page import STATE_KEY
from paged_kv_lab.why.sentences import step_sentences
from support.app import APP, TIMEOUT, Browser, app, open_page, player_data, sidebar_set
from support.cli import run_cli_here
from support.paths import ROOT

PAGE_ID = "trace"
EVICTION = ROOT / "paged_kv_lab" / "content" / "examples" / "eviction.json"


@pytest.fixture(scope="module")
def cli_trace(tmp_path_factory) -> str:
    """examples/eviction.json replayed by the CLI on the tiny model, as a trace file."""
    out = tmp_path_factory.mktemp("trace") / "eviction.jsonl"
    r = run_cli_here(
        "run", EVICTION, "--model", "tiny-random", "--device", "cpu", "--trace", out, "--quiet"
    )
    assert r.returncode == 0, r.stderr
    return out.read_text()


@pytest.fixture(scope="module")
def engine_records(tiny):  # noqa: F811
    """The same scenario on an independent engine: (state before step 1, records)."""
    from paged_kv_lab.run.engine import Engine

    engine = Engine(replace(load_scenario(EVICTION), model="tiny-random", device="cpu"), model=tiny)
    initial = engine.snapshot()
    return initial, engine.run()


def snapshot_at(engine_records, step):
    initial, records = engine_records
    return initial if step == 0 else records[step - 1].snapshot


def trace_app(lang: str = "en") -> AppTest:
    """The trace viewer, opened from the app, with the tiny model in the sidebar (the model that
    wrote the trace, so token text is decoded)."""
    at = app(PAGE_ID)
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


def assert_shows(b, snap):
    """The player holds ``snap`` at its step, exactly, and the page's cursor is there."""
    assert b.snaps[snap.step - b.head["first"]] == snapshot_dict(snap)
    assert b.at.session_state[STATE_KEY].run.cursor == snap.step


def markdown(at) -> str:
    return "\n".join(m.value for m in at.markdown)


def test_open_a_cli_trace_and_step_through_it(cli_trace, engine_records, tiny):  # noqa: F811
    at = trace_app()
    assert any("Trace viewer" in t.value for t in at.title)
    assert any("No trace loaded" in i.value for i in at.info) and not at.get("bidi_component")
    upload(at, cli_trace)
    n = len(engine_records[1])
    # the file name is the visitor's text, so it is Markdown-escaped (shown as eviction.jsonl)
    assert any(f"Loaded trace “eviction\\.jsonl”: {n} steps." in s.value for s in at.success)
    b = Browser(at, "trace")
    assert b.done and len(b.steps) == n and b.head["first"] == 0, (
        "a trace is sent whole: nothing to compute"
    )
    for step in range(n + 1):
        assert b.snaps[step] == snapshot_dict(snapshot_at(engine_records, step)), step
    for rec in engine_records[1]:
        assert b.texts(rec.step) == [s for _, s in step_sentences(rec.events, "en", tiny.decode)]
    assert_shows(b, snapshot_at(engine_records, 0))
    for step in (2, 1, 5, n):
        b.show(step)
        assert_shows(b, snapshot_at(engine_records, step))
    assert b.head["panels"] == ["requests", "metrics"], (
        "the player draws the requests table at its cursor"
    )
    assert {"evicted", "cache_hit", "finished"} <= set(b.head["until_kinds"])
    # the outputs line and the header's scenario
    final = json.loads(cli_trace.splitlines()[-1])["outputs"]
    table = at.dataframe[-1].value
    assert list(table["request"]) == list(final) and list(table["text"]) == [
        o["text"] for o in final.values()
    ]
    assert "`block_size=4`" in markdown(at) and "`num_gpu_blocks=14`" in markdown(at)
    assert not any("shown as ids" in c.value for c in at.caption), (
        "the trace's model is loaded: text is decoded"
    )
    assert b.head["decoded"]
    assert "step" not in at.query_params and "lesson" not in at.query_params


def test_token_ids_when_the_trace_was_recorded_with_another_model(cli_trace):
    header, *rest = cli_trace.splitlines()
    h = json.loads(header)
    h["scenario"]["model"] = "smollm2"
    at = upload(trace_app(), "\n".join([json.dumps(h)] + rest))
    assert any(
        "shown as ids: the trace was recorded with smollm2, the sidebar's model is tiny-random"
        in c.value
        for c in at.caption
    )
    b = Browser(at, "trace")
    assert not b.head["decoded"] and not b.vocab, (
        "no text is made up from another model's tokenizer"
    )


BAD_FILES = [
    ("broken.jsonl", "{not json", "line 1: not JSON"),
    (
        "order.jsonl",
        lambda lines: "\n".join([lines[0], lines[2]]),
        "line 2: step 2 first: steps must be 1, 2, 3...",
    ),
    ("cut.jsonl", lambda lines: "\n".join([lines[0], lines[1][:300]]), "line 2: not JSON"),
    ("scenario.json", EVICTION.read_text(), "this looks like a scenario file, not a trace"),
    ("empty.jsonl", "", "empty file"),
    ("binary.jsonl", b"\xff\xfe\x00", "not UTF-8"),
]


def test_a_bad_file_shows_why_and_keeps_the_trace(cli_trace, engine_records):
    at = upload(trace_app(), cli_trace)
    b = Browser(at, "trace").show(2)
    state = at.session_state[STATE_KEY]
    before = (state.run, state.run.cursor, state.name)
    lines = cli_trace.splitlines()
    for name, content, needle in BAD_FILES:
        upload(at, content(lines) if callable(content) else content, name)
        errors = " ".join(e.value for e in at.error)
        assert (
            f"“{name}” was not loaded; the trace shown before is kept" in errors
            and needle in errors
        ), errors
        assert (state.run, state.run.cursor, state.name) == before
        assert b.sync().run_token == player_data(at, "trace")["run"], (
            "the player keeps the same run"
        )
        assert_shows(b, snapshot_at(engine_records, 2))
    b.show(3)
    assert_shows(b, snapshot_at(engine_records, 3))  # the old trace keeps working


def test_a_trace_without_header_starts_at_step_one(cli_trace, engine_records):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    open_page(at, PAGE_ID).run()  # a deep link: the first run is the trace page itself
    assert not at.exception
    lines = cli_trace.splitlines()
    upload(at, "\n".join(lines[1:-1]), "old.jsonl")  # no header, and cut before the outputs line
    assert any("no header line" in i.value for i in at.info)
    assert any("does not say which model" in c.value for c in at.caption)
    assert any("no outputs line" in c.value for c in at.caption)
    b = Browser(at, "trace")
    assert b.head["first"] == 1 and b.head["step0"]["ev"], (
        "the first position is step 1, with its events"
    )
    assert_shows(b, snapshot_at(engine_records, 1))
    b.show(2)
    assert_shows(b, snapshot_at(engine_records, 2))
    b.show(1)
    assert_shows(b, snapshot_at(engine_records, 1))


def test_chinese(cli_trace, engine_records, tiny):  # noqa: F811
    at = trace_app("zh")
    assert any("轨迹查看器" in t.value for t in at.title)
    assert any("尚未加载轨迹" in i.value for i in at.info)
    upload(at, cli_trace)
    assert any("已加载轨迹" in s.value for s in at.success)
    b = Browser(at, "trace").show(1)
    assert b.head["lang"] == "zh"
    assert_shows(b, snapshot_at(engine_records, 1))
    assert b.texts(1) == [
        s for _, s in step_sentences(engine_records[1][0].events, "zh", tiny.decode)
    ]
    upload(at, "{x", "bad.jsonl")
    assert any("未加载" in e.value for e in at.error)
    assert at.session_state[STATE_KEY].run.cursor == 1


def test_example_trace_then_open_its_scenario_in_the_playground(engine_records):
    at = trace_app()
    at.button(key="example:trace").click().run()
    assert not at.exception and not at.error
    state = at.session_state[STATE_KEY]
    t = state.run.trace
    assert (
        state.name == "eviction.jsonl"
        and t.scenario["name"] == "eviction"
        and t.scenario["model"] == "tiny-random"
    )
    assert t.initial == engine_records[0] and list(t.records) == engine_records[1], (
        "the example is what the CLI writes for examples/eviction.json"
    )
    b = Browser(at, "trace").show(1)
    assert_shows(b, snapshot_at(engine_records, 1))
    at.button(key="playground:trace").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Playground" in t.value for t in at.title)
    run = at.session_state["lesson:playground"].run
    assert run.scenario.name == "eviction" and [r.id for r in run.scenario.requests] == [
        "A",
        "B",
        "C",
    ]
    assert run.scenario.engine == load_scenario(EVICTION).engine
    assert any("Loaded scenario “eviction”" in s.value for s in at.success)


def test_why_panel_on_the_trace_viewer_explains_the_steps_shown(engine_records):
    """A trace is a recorded run: the Why? panel answers on it, up to the player's cursor."""
    from paged_kv_lab.why.explain import RecordedSteps, explain_hit
    from paged_kv_lab.why.explain_text import hit_sentences

    at = trace_app()
    at.button(key="example:trace").click().run()
    b = Browser(at, "trace").show(len(engine_records[1]))
    at.toggle(key="why_open:trace").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    at.selectbox(key="why_req:trace").set_value("C").run()
    assert not at.exception, [e.value for e in at.exception]
    steps = RecordedSteps(
        engine_records[0], tuple(engine_records[1]), load_scenario(EVICTION).engine, None
    )
    expected = hit_sentences(explain_hit(steps, "C")[0], "en")[0]
    text = " ".join(m.value for m in at.markdown).replace("\\", "")
    assert expected[:30] in text, (expected, text[:500])
    assert b.done
