"""Streamlit AppTest: lesson 11's drafter switch (draft model / n-gram) rebuilds the run with the
other method and keeps it in the URL; the playground's settings form turns the draft model on
(with its k and depth), and its refusal names what was wrong."""

from support.app import app

APPLY = "FormSubmitter:settings:playground-Apply settings"


def test_lesson_switch_changes_the_drafter_and_its_lookahead():
    at = app("draftmodel")
    state = at.session_state["lesson:draftmodel"]
    assert state.run.scenario.engine.speculative.method == "draft_model"
    at.segmented_control(key="tg:draftmodel:spec_method").set_value("ngram").run()
    assert not at.exception
    state = at.session_state["lesson:draftmodel"]
    assert state.run.scenario.engine.speculative.method == "ngram"
    assert at.query_params.get("spec_method") in ("ngram", ["ngram"])


def test_playground_turns_the_draft_model_on():
    at = app("playground")
    at.selectbox(key="pg_spec_method").set_value("draft_model")
    at.number_input(key="pg_num_draft_layers").set_value(40)
    at.button(key=APPLY).click().run()
    assert not at.exception
    assert any("num_draft_layers=40: the model has only 4 layers" in e.value for e in at.error)
    assert at.session_state["lesson:playground"].run.scenario.engine.speculative is None
    at.selectbox(key="pg_spec_method").set_value("draft_model")
    at.number_input(key="pg_num_speculative_tokens").set_value(2)
    at.number_input(key="pg_num_draft_layers").set_value(1)
    at.button(key=APPLY).click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    sp = at.session_state["lesson:playground"].run.scenario.engine.speculative
    assert (sp.method, sp.num_speculative_tokens, sp.num_draft_layers) == ("draft_model", 2, 1)
