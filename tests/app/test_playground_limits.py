"""Valid scenarios past the form's old ranges open on the playground (paste, upload, link), and
the form's ranges come from the schema and the budget (issue 26, AppTest)."""

import copy
import json

import pytest
from streamlit.testing.v1 import AppTest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.run.budget import app_limits
from paged_kv_lab.ui.playground import FIELD_INT_MAX, form_range
from paged_kv_lab.ui.state import _encode_base
from support.app import APP, TIMEOUT, app, open_page

APPLY = "FormSubmitter:settings:playground-Apply settings"
# each was accepted by the schema and raised StreamlitValueAboveMaxError in settings_form
VALID = [
    ("sliding_window", 200_000),
    ("max_cache_hit_length", 10**7),
    ("seed", 2**31 + 5),
    ("max_num_seqs", 100),  # past the form's range (the request budget): kept, with a note
]


def scenario_with(setting: str, value) -> dict:
    d = copy.deepcopy(BY_ID["playground"].scenario)
    d["name"] = f"edge-{setting}"
    d["engine"][setting] = value
    return d


def assert_open(at, setting: str, value) -> None:
    """The run is open with the value, the page drew to its end, the scenario box is usable."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    state = at.session_state["lesson:playground"]
    assert getattr(state.run.scenario.engine, setting) == value
    assert at.text_area(key="paste:playground") is not None, "the scenario box is still drawn"
    assert at.button(key="paste_btn:playground") is not None


def open_box(at):
    at.session_state["scenario_open:playground"] = True
    return at.run()


@pytest.mark.parametrize("setting,value", VALID)
def test_pasted_valid_scenario_opens(setting, value):
    at = open_box(app("playground"))
    at.text_area(key="paste:playground").set_value(json.dumps(scenario_with(setting, value))).run()
    at.button(key="paste_btn:playground").click().run()
    assert_open(at, setting, value)
    # Apply keeps the value the form could not edit (or edited within its widened range)
    at.button(key=APPLY).click().run()
    assert_open(at, setting, value)
    if setting == "max_num_seqs":
        assert any("kept as the scenario gives it" in c.value for c in at.caption)


@pytest.mark.parametrize("setting,value", VALID[:3])
def test_linked_valid_scenario_opens(setting, value):
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(
        {"lesson": "playground", "scn": _encode_base(scenario_with(setting, value))}
    )
    open_page(at, "playground").run()
    open_box(at)
    assert_open(at, setting, value)


def test_uploaded_valid_scenario_opens():
    at = open_box(app("playground"))
    data = json.dumps(scenario_with("sliding_window", 200_000)).encode()
    at.file_uploader(key="up:playground").upload("edge.json", data, "application/json").run()
    assert_open(at, "sliding_window", 200_000)


def test_a_value_over_the_budget_is_a_named_refusal_and_the_box_stays():
    at = open_box(app("playground"))
    before = at.session_state["lesson:playground"].run.scenario
    big = app_limits().max_num_gpu_blocks + 1
    at.text_area(key="paste:playground").set_value(
        json.dumps(scenario_with("num_gpu_blocks", big))
    ).run()
    at.button(key="paste_btn:playground").click().run()
    assert not at.exception
    assert "PAGED_KV_LAB_MAX_BLOCKS" in " ".join(e.value for e in at.error)
    assert at.session_state["lesson:playground"].run.scenario == before
    assert at.text_area(key="paste:playground") is not None


def test_form_ranges_come_from_the_schema_and_the_budget():
    lim = app_limits()
    assert form_range("num_gpu_blocks") == (2, lim.max_num_gpu_blocks)
    assert form_range("block_size") == (1, lim.max_block_size)
    assert form_range("max_num_batched_tokens") == (1, lim.max_num_batched_tokens)
    assert form_range("sliding_window") == (0, FIELD_INT_MAX)  # 0 writes null
    assert form_range("max_cache_hit_length") == (-1, FIELD_INT_MAX)  # -1 writes null
    assert form_range("prefix_cache_retention_interval") == (-1, FIELD_INT_MAX)
    assert form_range("seed") == (-1, FIELD_INT_MAX)  # -1 writes null (greedy); 0 is a seed


def test_form_offers_no_pool_the_budget_refuses(monkeypatch, tiny):  # noqa: F811
    """num_gpu_blocks × block_size is what the KV budget limits: each field's maximum follows the
    other's value, and the note next to them names the budget and its variable."""
    from paged_kv_lab.run.budget import kv_pool_bytes

    per_block = kv_pool_bytes(tiny.config, 8, 1)  # the playground's block_size
    monkeypatch.setenv("PAGED_KV_LAB_MAX_RUN_BYTES", str(per_block * 40))
    at = app("playground")
    assert at.number_input(key="pg_num_gpu_blocks").max == 40
    assert at.number_input(key="pg_block_size").max == 40 * 8 // 24  # at its 24 blocks
    note = " ".join(c.value for c in at.caption)
    assert "PAGED_KV_LAB_MAX_RUN_BYTES" in note and "at most 40 blocks" in note
    at.number_input(key="pg_num_gpu_blocks").set_value(40)
    at.button(key=APPLY).click().run()
    assert (
        not at.error
        and at.session_state["lesson:playground"].run.scenario.engine.num_gpu_blocks == 40
    )
    assert at.number_input(key="pg_block_size").max == 8, "the other field's limit follows"


def test_the_step_cap_announces_itself_on_the_page_and_to_the_player(monkeypatch):
    """A run the server stops at its step cap with requests unfinished says so under the player
    and in it (the player gets the cap with the run's end), in EN and 中文."""
    import paged_kv_lab.store.run_store as store_mod
    from paged_kv_lab.store.run_store import RunStore
    from support.app import Browser, player_data, sidebar_set

    store = RunStore(max_steps=3, limits=app_limits())
    monkeypatch.setattr(store_mod, "_STORE", store)
    try:
        at = app("playground")
        b = Browser(at, "playground").until_recorded(10)
        assert b.done and len(b.steps) == 3
        assert player_data(at, "playground")["stop"] == {"steps": 3}
        warn = " ".join(w.value for w in at.warning)
        assert "at most 3 steps" in warn and "PAGED_KV_LAB_MAX_RUN_STEPS" in warn
        sidebar_set(at, "lang", "zh")
        Browser(at, "playground").until_recorded(10)
        warn = " ".join(w.value for w in at.warning)
        assert "最多计算 3 步" in warn and "PAGED_KV_LAB_MAX_RUN_STEPS" in warn
    finally:
        store.close()


def test_an_over_long_prompt_is_refused_with_its_limit_and_nothing_else_is_added():
    at = app("playground")
    most = app_limits().max_prompt_chars
    note = " ".join(c.value for c in at.caption)
    assert f"{most:,} characters" in note and "PAGED_KV_LAB_MAX_PROMPT_CHARS" in note
    before = at.session_state["lesson:playground"].base["requests"]
    at.text_input(key="pg_req_text").set_value("x" * (most + 1))
    at.button(key="FormSubmitter:addreq:playground-Add request").click().run()
    assert not at.exception
    err = " ".join(e.value for e in at.error)
    assert f"{most + 1:,} characters" in err and "PAGED_KV_LAB_MAX_PROMPT_CHARS" in err
    assert at.session_state["lesson:playground"].base["requests"] == before, "nothing submitted"
    assert at.text_input(key="pg_req_text").value == "x" * (most + 1), "the text stays to edit"
    at.text_input(key="pg_req_text").set_value("What is a block table?")
    at.button(key="FormSubmitter:addreq:playground-Add request").click().run()
    assert not at.error
    added = at.session_state["lesson:playground"].base["requests"][-1]
    assert added["prompt"] == "What is a block table?"
