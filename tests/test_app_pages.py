"""AppTest: the home page and every lesson page, driven like a user would, on the tiny model.

What is shown is compared with an independent engine stepped to the same step.
"""
import json

import pytest

from _app_helpers import (APP, TIMEOUT, app, charts, grid_cells, metric, queue_order, sidebar_set,  # noqa: F401
                          tiny, tiny_model_env)
from streamlit.testing.v1 import AppTest

from lesson.lessons import BY_ID, LESSONS, PAGE_FILES


def engine_snapshot(lesson_id, step, model):
    from lesson.runtime import lesson_run
    run = lesson_run(BY_ID[lesson_id], model)
    run.goto(step)
    return run.snapshot


def assert_shows(at, lesson_id, step, model):
    snap = engine_snapshot(lesson_id, step, model)
    figs = charts(at)
    assert metric(at, "Step") == str(step)
    assert metric(at, "free blocks") == str(snap.num_free_blocks)
    cells = grid_cells(figs[f"grid:{lesson_id}"])
    for b in snap.blocks:
        if b.ref_cnt > 0:
            assert f"r{b.ref_cnt}" in cells[b.block_id], (b, cells[b.block_id])
    if snap.free_queue:
        assert queue_order(figs[f"queue:{lesson_id}"]) == list(snap.free_queue)
    assert at.query_params.get("step") in (str(step), [str(step)])


def test_home_page_runs_and_steps():
    at = app()
    assert "Paged KV caching in a minute" in [h.value for h in at.header]
    assert "grid:home" in charts(at)
    at.button(key="step:home").click().run()
    assert not at.exception
    assert metric(at, "Step") == "1"
    assert len(at.get("page_link")) == len(LESSONS)
    assert any("tiny-random ready" in s.value for s in at.sidebar.success), "the sidebar shows the load state"


def test_home_sidebar_language_and_bad_device():
    at = app()
    at.sidebar.selectbox(key="_sidebar_lang").set_value("zh").run()
    assert "一分钟看懂分页 KV 缓存" in [h.value for h in at.header]
    assert at.sidebar.selectbox(key="_sidebar_model_name").label == "模型"
    import torch
    if not torch.cuda.is_available():
        at.sidebar.selectbox(key="_sidebar_device").set_value("cuda").run()
        assert not at.exception
        assert any("cuda" in e.value.lower() for e in at.sidebar.error)
        at.sidebar.selectbox(key="_sidebar_device").set_value("cpu").run()
        assert not at.exception and not at.sidebar.error


def test_sidebar_choices_survive_page_switches():
    """A page file's first run and the navigation are different scripts to Streamlit; the
    sidebar's model, device and language must not fall back to their first options there."""
    at = app()
    at.sidebar.selectbox(key="_sidebar_lang").set_value("zh").run()
    at.switch_page(PAGE_FILES["blocks"]).run()
    for _ in range(3):
        assert not at.exception, [e.value for e in at.exception]
        ms = at.session_state["_model_state"]
        assert (ms.name, ms.device, at.session_state["lang"]) == ("tiny-random", "cpu", "zh")
        assert at.query_params["model"] == ["tiny-random"] or at.query_params["model"] == "tiny-random"
        at.run()
    at.switch_page(PAGE_FILES["prefix"]).run()
    ms = at.session_state["_model_state"]
    assert (ms.name, ms.device, at.session_state["lang"]) == ("tiny-random", "cpu", "zh")


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda l: l.id)
def test_every_lesson_page(lesson, tiny):
    at = app(PAGE_FILES[lesson.id])
    assert any(lesson.title["en"] in t.value for t in at.title)
    figs = charts(at)
    assert {f"grid:{lesson.id}", f"queue:{lesson.id}", f"tables:{lesson.id}", f"chains:{lesson.id}",
            f"metrics:{lesson.id}"} <= set(figs)
    assert at.info, "step 0 shows the lesson's introduction"
    for _ in range(3):
        at.button(key=f"step:{lesson.id}").click().run()
        assert not at.exception, [e.value for e in at.exception]
    assert_shows(at, lesson.id, 3, tiny)
    at.button(key=f"back:{lesson.id}").click().run()
    assert_shows(at, lesson.id, 2, tiny)
    at.slider(key=f"timeline:{lesson.id}").set_value(0).run()
    assert_shows(at, lesson.id, 0, tiny)
    at.slider(key=f"timeline:{lesson.id}").set_value(3).run()
    assert_shows(at, lesson.id, 3, tiny)


def test_back_and_step_again_is_identical():
    at = app(PAGE_FILES["eviction"])
    for _ in range(6):
        at.button(key="step:eviction").click().run()
    first = charts(at)["grid:eviction"]
    at.button(key="back:eviction").click().run()
    at.button(key="step:eviction").click().run()
    assert charts(at)["grid:eviction"] == first


def test_run_until_hit_and_events(tiny):
    at = app(PAGE_FILES["prefix"])
    at.selectbox(key="until_kind:prefix").set_value("cache_hit").run()
    at.button(key="until:prefix").click().run()
    state = at.session_state["lesson:prefix"]
    assert any(e.kind == "cache_hit" for e in state.run.record.events)
    md = " ".join(m.value for m in at.markdown)
    assert "hit 3 cached blocks" in md
    assert any("hits" in i.value for i in at.info), "the narration explains the hit"
    assert_shows(at, "prefix", state.run.cursor, tiny)


def test_language_switch_changes_text():
    at = app(PAGE_FILES["prefix"])
    at.button(key="step:prefix").click().run()
    assert at.button(key="step:prefix").label.startswith("Step")
    sidebar_set(at, "lang", "zh")
    assert not at.exception
    assert at.button(key="step:prefix").label.startswith("单步")
    assert any("前缀缓存与哈希链" in t.value for t in at.title)
    md = " ".join(m.value for m in at.markdown)
    assert "到达" in md and "arrived" not in md
    assert metric(at, "步") == "1", "switching the language keeps the step"


def test_bad_scenario_shows_error_and_keeps_state():
    at = app(PAGE_FILES["prefix"])
    for _ in range(2):
        at.button(key="step:prefix").click().run()
    state = at.session_state["lesson:prefix"]
    before = (state.run.scenario, state.run.cursor)
    at.text_area(key="paste:prefix").set_value('{"engine": {"block_size": 0}, "requests": [{"id": "A"}]}').run()
    at.button(key="paste_btn:prefix").click().run()
    errors = " ".join(e.value for e in at.error)
    assert "engine.block_size" in errors and "requests[0]" in errors
    assert (state.run.scenario, state.run.cursor) == before
    assert metric(at, "Step") == "2"
    at.text_area(key="paste:prefix").set_value("{not json").run()
    at.button(key="paste_btn:prefix").click().run()
    assert "json" in " ".join(e.value for e in at.error)
    at.file_uploader(key="up:prefix").upload("bad.json", b'{"requests": [{"id": "A", "prompt": "x", "max_tokens": -1}]}',
                                             "application/json").run()
    assert "requests[0].max_tokens" in " ".join(e.value for e in at.error)
    assert (state.run.scenario, state.run.cursor) == before


def test_good_scenario_upload_replaces_the_run():
    at = app(PAGE_FILES["playground"])
    good = {"name": "mine", "engine": {"block_size": 2, "num_gpu_blocks": 10},
            "requests": [{"id": "Z", "prompt": "Hello there", "max_tokens": 3}]}
    at.text_area(key="paste:playground").set_value(json.dumps(good)).run()
    at.button(key="paste_btn:playground").click().run()
    assert not at.error
    state = at.session_state["lesson:playground"]
    assert state.run.scenario.name == "mine" and state.run.cursor == 0
    assert "scn" in at.query_params
    at.button(key="step:playground").click().run()
    assert [r.request_id for r in state.run.snapshot.requests] == ["Z"]
    link = {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    again = AppTest.from_file(APP, default_timeout=TIMEOUT)
    again.query_params.update(link)
    again.switch_page(PAGE_FILES["playground"]).run()
    other = again.session_state["lesson:playground"]
    assert other.run.scenario == state.run.scenario and other.run.cursor == 1, "the link carries the scenario"


def test_url_reopens_the_same_view(tiny):
    link = {"lesson": "eviction", "step": "5", "lang": "zh", "num_gpu_blocks": "14"}
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(link)
    at.switch_page(PAGE_FILES["eviction"]).run()  # a deep link: the first run is the lesson page
    assert not at.exception
    state = at.session_state["lesson:eviction"]
    assert state.run.cursor == 5 and state.run.scenario.engine.num_gpu_blocks == 14
    assert any("驱逐" in t.value for t in at.title), "the link's language is applied"


def test_toggle_rebuilds_at_the_same_step():
    at = app(PAGE_FILES["preemption"])
    for _ in range(4):
        at.button(key="step:preemption").click().run()
    at.segmented_control(key="tg:preemption:policy").set_value("priority").run()
    assert not at.exception
    state = at.session_state["lesson:preemption"]
    assert state.run.scenario.engine.policy == "priority" and state.run.cursor == 4
    assert at.query_params.get("policy") in ("priority", ["priority"])


def test_quiz_asks_then_reveals():
    at = app(PAGE_FILES["blocks"])
    at.toggle(key="quiz:blocks").set_value(True).run()
    at.button(key="step:blocks").click().run()
    state = at.session_state["lesson:blocks"]
    assert state.quiz is not None and state.run.cursor == 0, "the question comes before the step"
    q = state.quiz
    at.radio(key="quiz_choice:blocks").set_value(q.options[q.answer]).run()
    at.button(key="quiz_ans:blocks").click().run()
    assert any("Right" in s.value for s in at.success)
    at.button(key="quiz_rev:blocks").click().run()
    assert state.run.cursor == 1 and state.quiz is None


def test_playground_adds_a_request():
    at = app(PAGE_FILES["playground"])
    at.button(key="step:playground").click().run()
    at.text_input(key="pg_req_id").set_value("Q")
    at.text_input(key="pg_req_text").set_value("Why is the sea blue?")
    at.button(key="FormSubmitter:addreq:playground-Add request").click().run()
    assert not at.exception and not at.error
    state = at.session_state["lesson:playground"]
    assert any(r.id == "Q" and r.arrival_step == 1 for r in state.run.scenario.requests)
    at.button(key="step:playground").click().run()
    assert any(e.kind == "arrived" and e.request_id == "Q" for e in state.run.record.events)


def test_two_sessions_do_not_share_state():
    a, b = app(PAGE_FILES["blocks"]), app(PAGE_FILES["blocks"])
    a.button(key="step:blocks").click().run()
    a.button(key="step:blocks").click().run()
    b.run()
    assert metric(a, "Step") == "2" and metric(b, "Step") == "0"
    assert a.session_state["lesson:blocks"].run is not b.session_state["lesson:blocks"].run


def test_unavailable_device_keeps_the_app_running():
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here; the failure path needs a machine without it")
    at = app(PAGE_FILES["blocks"])
    sidebar_set(at, "device", "cuda")
    assert not at.exception
    assert any("cuda" in e.value.lower() for e in at.error)
    sidebar_set(at, "device", "cpu")
    assert not at.exception and metric(at, "Step") == "0"


def test_playground_refuses_a_request_that_never_fits():
    at = app(PAGE_FILES["playground"])
    state = at.session_state["lesson:playground"]
    before = state.run.scenario
    at.text_input(key="pg_req_text").set_value("many words " * 200)
    at.button(key="FormSubmitter:addreq:playground-Add request").click().run()
    assert not at.exception
    assert "usable blocks" in " ".join(e.value for e in at.error)
    assert state.run.scenario == before


def test_every_page_file_is_in_the_navigation_under_streamlits_name():
    """A page file's URL path must be the name Streamlit derives from it (lesson/lessons url_path)."""
    from pathlib import Path

    from streamlit.source_util import page_icon_and_name

    from lesson.lessons import page_url_path
    from lesson.trace_page import PAGE_FILE
    root = Path(APP).resolve().parent
    files = sorted((root / "pages").glob("*.py"))
    assert {f"pages/{f.name}" for f in files} == set(PAGE_FILES.values()) | {PAGE_FILE}
    for f in files:
        assert page_url_path(f"pages/{f.name}") == page_icon_and_name(f)[1]
