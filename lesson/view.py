"""One lesson page: settings, controls, narration and every live picture."""
from __future__ import annotations

import time

import streamlit as st

from . import panels as P
from .figures import color_map
from .i18n import pick, tr
from .lessons import BY_ID
from .modelstate import ModelState, default_device, default_model
from .state import get_state, init_globals_from_url, locked, pref, write_url
from .widgets import controls, quiz_box, scenario_file, timeline, toggles

PLAY_SECONDS = 0.8


def current_lang() -> str:
    return pref("lang", "en")


def current_model() -> ModelState:
    """The model the sidebar loaded in this run (lesson/entry.py stores it); loaded here only if a
    page is drawn without the entry."""
    name = pref("model_name", default_model())
    device = pref("device", default_device())
    ms = st.session_state.get("_model_state")
    if ms is None or (ms.name, ms.device) != (name, device):
        from .modelstate import get_model
        ms = get_model(name, device)
    return ms


_DECODED: dict[int, dict[tuple[int, ...], str]] = {}   # per model: token ids -> text (figures decode a lot)


def decoder(model):
    if model is None:
        return None
    cache = _DECODED.setdefault(id(model), {})

    def decode(ids):
        key = tuple(int(i) for i in ids)
        if key not in cache:
            if len(cache) > 50_000:
                cache.clear()
            cache[key] = model.decode(list(key))
        return cache[key]
    return decode


def render_lesson(lesson_id: str, compact: bool = False) -> None:
    lesson = BY_ID[lesson_id]
    init_globals_from_url()
    lang = current_lang()
    ms = current_model()
    if not compact:
        st.title(f"{lesson.icon} {lesson.number}. {pick(lesson.title, lang)}" if lesson.number else
                 pick(lesson.title, lang))
        st.caption(pick(lesson.summary, lang))
    if ms.model is None:
        st.error(tr("model_failed", lang, model=ms.name, device=ms.device, error=ms.error))
        st.info(tr("model_hint", lang))
        st.markdown(pick(lesson.intro, lang).replace("{", "(").replace("}", ")"))
        P.show_questions(lesson, lang)
        return
    state = get_state(lesson, ms)
    run = state.run
    if state.error:
        st.error(state.error)
        state.error = None
    if state.notice:
        st.success(state.notice)
        state.notice = None
    decode = decoder(ms.model)
    colors = color_map(r.id for r in run.scenario.requests)
    key = lesson.id
    if not compact:
        toggles(state, lesson, ms, lang)
    controls(state, lesson.id, lesson.focus, lang)
    timeline(state, lesson.id, lang)
    quiz_box(state, lesson.id, lang)
    if state.quiz is None:
        P.show_narration(lesson, run, lang)
    P.show_metrics_row(run, lang)
    left, right = st.columns([3, 2])
    with left:
        P.show_grid(run, lang, decode, colors, key)
    with right:
        P.show_events(run, lang, decode)
    P.show_queue(run, lang, decode, key)
    P.show_outputs(run, lang)
    P.show_tables(run, lang, decode, colors, key)
    if not compact:
        P.show_chains_and_metrics(run, lang, decode, colors, key)
        P.show_extra_panels(lesson, run, lang, colors, key, ms.model)
        P.show_address(run, lang, colors, key, decode)
        P.show_requests(run, lang)
        if lesson.id == "playground":
            from .playground import request_form, settings_form
            settings_form(state, lesson, ms, lang)
            request_form(state, lesson, ms, lang)
        P.show_myths(run, lang, expanded="myths" in lesson.panels)
        P.show_questions(lesson, lang)
        scenario_file(state, lesson, ms, lang)
    write_url(state, lesson, lang, ms)
    play_tick(state, lang)


def play_tick(state, lang: str) -> None:
    """While playing: wait, step, rerun. A click on Pause interrupts the wait."""
    if not state.playing:
        return
    if not state.run.can_forward():
        state.playing = False
        return
    time.sleep(PLAY_SECONDS)
    try:
        locked(state.run.forward)
    except Exception as e:
        state.error = tr("step_error", lang, error=f"{type(e).__name__}: {e}")
        state.playing = False
    st.rerun()
