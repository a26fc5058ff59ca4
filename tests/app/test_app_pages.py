"""AppTest: the home page and every lesson page, driven like a user would, on the tiny model.

What is shown is compared with an independent engine stepped to the same step.
"""

import json

import pytest
from streamlit.testing.v1 import AppTest

from paged_kv_lab.content import BY_ID, LESSONS
from paged_kv_lab.content.registry import lesson_page, nav_title, pages, sections
from paged_kv_lab.player import snapshot_dict
from paged_kv_lab.text.i18n import tr
from support.app import (
    APP,
    TIMEOUT,
    Browser,
    app,
    open_page,
    player_data,
    server_drawn,
    sidebar_set,
)


def engine_snapshot(lesson_id, step, model):
    """An independent engine (not the app's run store) stepped to ``step``."""
    from paged_kv_lab.disagg.pd import engine_for
    from paged_kv_lab.store.timeline import lesson_scenario, played_model

    model = played_model(BY_ID[lesson_id], model)
    scenario = lesson_scenario(BY_ID[lesson_id], model.num_layers, model=model.name, device="cpu")
    engine = engine_for(scenario, model=model)
    records = [engine.step() for _ in range(step)]
    if records and records[-1].replica is not None:  # a step is one replica's: its pool (P/D,
        return records[-1].snapshot  # a fleet)
    return engine.snapshot()


def assert_shows(browser, lesson_id, step, model):
    """The player holds that step exactly as the engine has it, and the page follows the cursor."""
    at = browser.at
    snap = engine_snapshot(lesson_id, step, model)
    assert browser.snaps[step] == snapshot_dict(snap)
    state = at.session_state[f"lesson:{lesson_id}"]
    assert state.run.cursor == step
    assert at.query_params.get("step") in (str(step), [str(step)])
    # the requests table and the charts are the player's, drawn from the data checked above
    assert server_drawn(at) == [], "no per-step picture is drawn by the server"


def test_home_page_runs_and_steps(tiny):  # noqa: F811
    at = app()
    assert "Paged KV caching in a minute" in [h.value for h in at.header]
    b = Browser(at, "home").until_recorded(1)
    assert b.head["intro"], "step 0 shows the lesson's introduction"
    b.show(1)
    assert_shows(b, "home", 1, tiny)
    assert len(at.get("page_link")) == len([p for p in pages() if p.section == "lessons"])
    assert any("tiny-random ready" in s.value for s in at.sidebar.success), (
        "the sidebar shows the load state"
    )


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
    """The sidebar's model, device and language stay the session's across page switches: they
    must not fall back to their first options on the page switched to."""
    at = app()
    at.sidebar.selectbox(key="_sidebar_lang").set_value("zh").run()
    open_page(at, "blocks").run()
    for _ in range(3):
        assert not at.exception, [e.value for e in at.exception]
        ms = at.session_state["_model_state"]
        assert (ms.name, ms.device, at.session_state["lang"]) == ("tiny-random", "cpu", "zh")
        assert (
            at.query_params["model"] == ["tiny-random"] or at.query_params["model"] == "tiny-random"
        )
        at.run()
    open_page(at, "prefix").run()
    ms = at.session_state["_model_state"]
    assert (ms.name, ms.device, at.session_state["lang"]) == ("tiny-random", "cpu", "zh")


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.id)
def test_every_lesson_page(lesson, tiny):  # noqa: F811
    at = app(lesson_page(lesson.id).id)
    assert any(tr(lesson.title, "en") in t.value for t in at.title)
    b = Browser(at, lesson.id)
    assert b.head["lang"] == "en" and b.head["intro"], "step 0 shows the lesson's introduction"
    extra = [p for p in ("budget", "held") if p in lesson.panels]
    assert b.head["panels"] == ["requests", "metrics", *extra], (
        "the player draws the lesson's panels"
    )
    assert b.head["words"]["req_cols"] == list(tr("req_table_cols", "en"))
    assert (
        b.head["budget"]
        == b.at.session_state[f"lesson:{lesson.id}"].run.scenario.engine.max_num_batched_tokens
    )
    b.show(3)
    assert_shows(b, lesson.id, 3, tiny)
    b.show(2)
    assert_shows(b, lesson.id, 2, tiny)
    b.show(0)
    assert_shows(b, lesson.id, 0, tiny)
    b.until_recorded(1 << 30)
    assert b.done, "the run streams to its end"
    last = len(b.steps)
    assert b.snaps[last] == snapshot_dict(engine_snapshot(lesson.id, last, tiny))


def test_run_until_hit_and_events(tiny):  # noqa: F811
    at = app("prefix")
    b = Browser(at, "prefix").until_recorded(1 << 30)
    hit = next(i + 1 for i, st in enumerate(b.steps) if any(e[0] == "cache_hit" for e in st["ev"]))
    assert any("hit 3 cached blocks" in t for t in b.texts(hit))
    assert any("hits" in n for n in b.steps[hit - 1]["nar"]), "the narration explains the hit"
    assert "cache_hit" in b.head["until_kinds"]
    b.show(hit)
    assert_shows(b, "prefix", hit, tiny)


def test_language_switch_changes_text():
    at = app("prefix")
    b = Browser(at, "prefix").show(1)
    assert b.head["lang"] == "en" and any("arrived" in t for t in b.texts(1))
    sidebar_set(at, "lang", "zh")
    assert not at.exception
    b.sync().until_recorded(1)
    assert b.head["lang"] == "zh", "the player is sent the run in Chinese"
    assert any("到达" in t for t in b.texts(1)) and not any("arrived" in t for t in b.texts(1))
    assert any("前缀缓存与哈希链" in t.value for t in at.title)
    assert b.goto["step"] == 1, "switching the language keeps the step"


def test_bad_scenario_shows_error_and_keeps_state():
    at = app("prefix")
    Browser(at, "prefix").show(2)
    state = at.session_state["lesson:prefix"]
    before = (state.run.scenario, state.run.cursor)
    assert not at.text_area, (
        "the scenario file's widgets are drawn only once its expander is opened"
    )
    at.session_state["scenario_open:prefix"] = True
    at.run()
    at.text_area(key="paste:prefix").set_value(
        '{"engine": {"block_size": 0}, "requests": [{"id": "A"}]}'
    ).run()
    at.button(key="paste_btn:prefix").click().run()
    errors = " ".join(e.value for e in at.error)
    assert "engine.block_size" in errors and "requests[0]" in errors
    assert (state.run.scenario, state.run.cursor) == before
    at.text_area(key="paste:prefix").set_value("{not json").run()
    at.button(key="paste_btn:prefix").click().run()
    assert "json" in " ".join(e.value for e in at.error)
    at.file_uploader(key="up:prefix").upload(
        "bad.json",
        b'{"requests": [{"id": "A", "prompt": "x", "max_tokens": -1}]}',
        "application/json",
    ).run()
    assert "requests[0].max_tokens" in " ".join(e.value for e in at.error)
    assert (state.run.scenario, state.run.cursor) == before
    # the refusal stays beside the uploader while the file is in it: a rerun (another widget, or
    # one that interrupted the run that first showed it) does not lose it
    at.run()
    assert "requests[0].max_tokens" in " ".join(e.value for e in at.error)


def test_good_scenario_upload_replaces_the_run():
    at = app("playground")
    good = {
        "name": "mine",
        "engine": {"block_size": 2, "num_gpu_blocks": 10},
        "requests": [{"id": "Z", "prompt": "Hello there", "max_tokens": 3}],
    }
    at.session_state["scenario_open:playground"] = True
    at.run()
    at.text_area(key="paste:playground").set_value(json.dumps(good)).run()
    at.button(key="paste_btn:playground").click().run()
    assert not at.error
    state = at.session_state["lesson:playground"]
    assert state.run.scenario.name == "mine" and state.run.cursor == 0
    assert "scn" in at.query_params
    b = Browser(at, "playground").show(1)
    assert [r["id"] for r in b.snaps[1]["reqs"]] == ["Z"]
    assert [r.request_id for r in state.run.snapshot.requests] == ["Z"]
    link = {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    again = AppTest.from_file(APP, default_timeout=TIMEOUT)
    again.query_params.update(link)
    open_page(again, "playground").run()
    other = again.session_state["lesson:playground"]
    assert other.run.scenario == state.run.scenario and other.run.cursor == 1, (
        "the link carries the scenario"
    )


def test_url_reopens_the_same_view(tiny):  # noqa: F811
    link = {"lesson": "eviction", "step": "5", "lang": "zh", "num_gpu_blocks": "14"}
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(link)
    open_page(at, "eviction").run()  # a deep link: the first run is the lesson page
    assert not at.exception
    state = at.session_state["lesson:eviction"]
    assert state.run.cursor == 5 and state.run.scenario.engine.num_gpu_blocks == 14
    b = Browser(at, "eviction")
    assert b.goto["step"] == 5 and len(b.steps) >= 5, "the player opens at the link's step"
    assert any("驱逐" in t.value for t in at.title), "the link's language is applied"


def test_toggle_rebuilds_at_the_same_step():
    at = app("preemption")
    Browser(at, "preemption").show(4)
    at.segmented_control(key="tg:preemption:policy").set_value("priority").run()
    assert not at.exception
    state = at.session_state["lesson:preemption"]
    assert state.run.scenario.engine.policy == "priority" and state.run.cursor == 4
    assert at.query_params.get("policy") in ("priority", ["priority"])


def test_quiz_asks_then_reveals():
    at = app("blocks")
    at.toggle(key="quiz:blocks").set_value(True).run()
    b = Browser(at, "blocks")
    state = at.session_state["lesson:blocks"]
    assert state.quiz is not None and state.run.cursor == 0, "the question comes before the step"
    assert b.hold_at == 0, "the player holds the next step back"
    q = state.quiz
    at.radio(key="quiz_choice:blocks").set_value(q.options[q.answer]).run()
    at.button(key="quiz_ans:blocks").click().run()
    assert any("Right" in s.value for s in at.success)
    at.button(key="quiz_rev:blocks").click().run()
    b.sync()
    assert state.run.cursor == 1 and b.goto["step"] == 1, "the answer releases the step"
    assert (b.hold_at == 1) == (state.quiz is not None), (
        "the next question holds the following step back"
    )


def test_playground_adds_a_request():
    at = app("playground")
    Browser(at, "playground").show(1)
    at.text_input(key="pg_req_id").set_value("Q")
    at.text_input(key="pg_req_text").set_value("Why is the sea blue?")
    at.button(key="FormSubmitter:addreq:playground-Add request").click().run()
    assert not at.exception and not at.error
    state = at.session_state["lesson:playground"]
    assert any(r.id == "Q" and r.arrival_step == 1 for r in state.run.scenario.requests)
    b = Browser(at, "playground").until_recorded(2)
    assert b.goto["step"] == 1, "the new run opens at the same step"
    assert any(e[0] == "arrived" and e[1] == "Q" for e in b.steps[1]["ev"])


def test_two_sessions_do_not_share_state():
    a, b = app("blocks"), app("blocks")
    Browser(a, "blocks").show(2)
    b.run()
    assert (
        a.session_state["lesson:blocks"].run.cursor == 2
        and b.session_state["lesson:blocks"].run.cursor == 0
    )
    assert a.session_state["lesson:blocks"].run is not b.session_state["lesson:blocks"].run
    assert player_data(a, "blocks")["run"] != player_data(b, "blocks")["run"]


def test_unavailable_device_keeps_the_app_running():
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is available here; the failure path needs a machine without it")
    at = app("blocks")
    sidebar_set(at, "device", "cuda")
    assert not at.exception
    assert any("cuda" in e.value.lower() for e in at.error)
    sidebar_set(at, "device", "cpu")
    assert not at.exception and Browser(at, "blocks").head is not None, "the player is back"


def test_playground_refuses_a_request_that_never_fits():
    at = app("playground")
    state = at.session_state["lesson:playground"]
    before = state.run.scenario
    at.text_input(key="pg_req_text").set_value("many words " * 200)
    at.button(key="FormSubmitter:addreq:playground-Add request").click().run()
    assert not at.exception
    assert "usable blocks" in " ".join(e.value for e in at.error)
    assert state.run.scenario == before


def navigation(monkeypatch) -> dict[str, list]:
    """What the app hands st.navigation on its first run: section title -> its StreamlitPages."""
    import streamlit as st

    seen: dict = {}
    real = st.navigation

    def spy(pages, *a, **kw):
        seen.update(pages)
        return real(pages, *a, **kw)

    monkeypatch.setattr(st, "navigation", spy)
    app()
    monkeypatch.setattr(st, "navigation", real)
    return seen


def test_the_navigation_is_the_registry_with_no_page_file(monkeypatch):
    """The pages are built from the registry alone: its sections in order, each page a function
    at its slug with its title and icon (a lesson's numbered by its place); no page file and no
    pages/ folder (which would make Streamlit route a first visit by file names)."""
    from pathlib import Path

    root = Path(APP).resolve().parent
    assert not (root / "pages").exists() and not (root.parent / "pages").exists()
    nav = navigation(monkeypatch)
    assert list(nav) == [tr(s.title, "en") for s in sections()]
    got = [(p.url_path, p.title, p.icon, callable(p._page)) for ps in nav.values() for p in ps]
    assert got == [(p.url_path, nav_title(p, "en"), p.icon, True) for p in pages()]
    assert [nav_title(p, "en").split(".")[0] for p in pages() if p.number] == [
        str(n) for n in range(1, len(LESSONS) + 1)
    ]
    assert [BY_ID[p.lesson].id for p in pages() if p.number] == [lesson.id for lesson in LESSONS]
    assert all(BY_ID[p.lesson].icon == p.icon for p in pages() if p.lesson)
    assert [s.id for s in sections()] == ["start", "lessons", "topics", "tools"]


def test_the_root_app_py_is_the_same_app():
    """``streamlit run app.py`` from a clone: the home page, then a page by its URL path."""
    from pathlib import Path

    at = AppTest.from_file(
        str(Path(APP).resolve().parent.parent / "app.py"), default_timeout=TIMEOUT
    )
    at.run()
    assert not at.exception and "Paged KV caching in a minute" in [h.value for h in at.header]
    open_page(at, "eviction").run()
    assert not at.exception and any("Eviction" in t.value for t in at.title)


def test_the_home_cards_are_the_registrys_lessons_in_both_languages():
    """The home page's cards: the registry's Lessons section, titled and numbered from the
    catalogue in the sidebar's language (the sidebar itself:
    tests/browser/test_browser_markdown.py)."""
    at = app()
    for lang in ("en", "zh"):
        at.sidebar.selectbox(key="_sidebar_lang").set_value(lang).run()
        assert not at.exception
        cards = [p for p in pages() if p.section == "lessons"]
        assert [link.label for link in at.get("page_link")] == [
            nav_title(p, lang) for p in cards[0::2] + cards[1::2]
        ], "two columns, filled alternately"
        assert {c.value for c in at.caption} >= {tr(p.summary, lang) for p in cards}


def test_a_broken_browser_report_changes_nothing():
    """The page reads the player's reports defensively: garbage from a client is ignored."""
    at = app("blocks")
    b = Browser(at, "blocks").show(2)
    for junk in (
        {"cursor": {"run": b.run_token, "step": "x"}},
        {"want": {"run": b.run_token, "step": None}},
        {"have": {"run": b.run_token, "n": [1]}},
        {"cursor": "nonsense"},
        {"cursor": {"run": "other", "step": 1}},
    ):
        at.session_state["pkv:blocks"] = junk
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["lesson:blocks"].run.cursor == 2


def test_the_warm_up_prepares_the_pages_and_the_sidebar_says_when(monkeypatch):
    """Once the model is loaded, the server's warm-up (off elsewhere in these tests) records the
    cases' runs, replays Real workloads' first slice and measures the topic studies in the
    background; the sidebar says it is under way, then done."""
    from paged_kv_lab.content.casebook import CASES
    from paged_kv_lab.ui import topic_pages, workloads_page
    from paged_kv_lab.ui.casebook_page import case_lessons
    from paged_kv_lab.ui.modelstate import played_model_state
    from paged_kv_lab.ui.state import build_scenario, model_key, open_run
    from paged_kv_lab.ui.warm_up import WARM_UPS
    from paged_kv_lab.workloads.trace_limits import page_trace_limits

    monkeypatch.setenv("PAGED_KV_LAB_WARM_UP", "1")
    at = app()
    ms = at.session_state["_model_state"]
    lines = {tr("page.warm_up.running", "en"), tr("page.warm_up.done", "en")}
    assert lines & {c.value for c in at.sidebar.caption}, "the sidebar tells the warm-up's state"
    WARM_UPS.wait(model_key(ms), 600)
    at.run()
    assert tr("page.warm_up.done", "en") in [c.value for c in at.sidebar.caption]
    key, _, settings = workloads_page.first_slice(page_trace_limits())
    assert workloads_page.RUNS.ready((key, settings))
    assert all(topic_pages.STUDIES.ready(k) for k in topic_pages.topic_studies(ms.model))
    for lesson in (x for c in CASES for x in case_lessons(c)):
        lms = played_model_state(lesson, ms)  # a case on a hybrid model plays on its own
        assert open_run(build_scenario(lesson, lesson.scenario, {}, lms), lms).run.done, lesson.id
