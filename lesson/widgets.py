"""Shared controls: step / back / play / run-until / reset, the timeline, setting switches,
the quiz, and the scenario file (download, upload, paste)."""
from __future__ import annotations

import json

import streamlit as st

from kvcore.scenario import scenario_to_dict

from .catalog import Lesson
from .i18n import pick, tr
from .modelstate import ModelState
from .quiz import make_prediction
from .state import LessonState, PageState, locked, parse_scenario_text, rebuild

UNTIL_KINDS = ("cache_hit", "evicted", "preempted", "window_skipped", "allocated", "finished")


def _guard(state: PageState, lang: str, fn, *args) -> None:
    try:
        locked(fn, *args)
    except Exception as e:  # an engine error is shown, the page keeps running
        state.error = tr("step_error", lang, error=f"{type(e).__name__}: {e}")
        state.playing = False


def _end_text(state: PageState, lang: str) -> str:
    """At the last step: a live run has finished every request; a trace may stop before that."""
    snap = state.run.snapshot
    return tr("trace_end", lang) if snap.waiting or snap.running else tr("all_done", lang)


# -- callbacks (run before the script reruns) -------------------------------------
# ``key`` names the page's widgets (a lesson id, or "trace"); ``focus`` the event kinds it is about.
def on_step(state: PageState, key: str, focus: tuple[str, ...], lang: str) -> None:
    run = state.run
    state.notice = None
    if st.session_state.get(f"quiz:{key}") and state.quiz is None:
        rec = None
        try:
            rec = locked(run.peek_next)
        except Exception as e:
            state.error = tr("step_error", lang, error=f"{type(e).__name__}: {e}")
            return
        if rec is not None:
            pred = make_prediction(run.snapshot, rec, lang, focus)
            if pred is not None:
                state.quiz, state.quiz_choice = pred, None
                return
    state.quiz = None
    if not run.can_forward():
        state.notice = _end_text(state, lang)
        return
    _guard(state, lang, run.forward)


def on_back(state: PageState) -> None:
    state.quiz, state.notice = None, None
    state.run.back()


def on_reset(state: PageState, lang: str) -> None:
    state.quiz, state.notice, state.playing = None, None, False
    _guard(state, lang, state.run.reset)


def on_timeline(state: PageState, key: str, lang: str) -> None:
    state.quiz, state.notice = None, None
    _guard(state, lang, state.run.goto, int(st.session_state[key]))


def on_play(state: PageState) -> None:
    state.playing = not state.playing
    state.quiz = None


def on_to_end(state: PageState, lang: str) -> None:
    state.quiz, state.playing = None, False
    _guard(state, lang, state.run.run_to_end)


def on_until(state: PageState, key: str, lang: str) -> None:
    kind = st.session_state[key]
    state.quiz, state.playing = None, False
    start = state.run.cursor
    try:
        rec = locked(state.run.run_until, kind)
    except Exception as e:
        state.error = tr("step_error", lang, error=f"{type(e).__name__}: {e}")
        return
    label = tr(f"kind_{kind}", lang)
    state.notice = (tr("found_at", lang, kind=label, step=rec.step) if rec is not None
                    else tr("not_found", lang, kind=label, step=state.run.cursor))
    if rec is None and state.run.cursor == start:
        state.notice = _end_text(state, lang)


def on_quiz_answer(state: PageState, key: str) -> None:
    choice = st.session_state.get(key)
    if state.quiz is not None and choice is not None:
        state.quiz_choice = list(state.quiz.options).index(choice)


def on_quiz_reveal(state: PageState, lang: str) -> None:
    state.quiz, state.quiz_choice = None, None
    _guard(state, lang, state.run.forward)


def on_toggle(state: LessonState, lesson: Lesson, ms: ModelState, setting: str, key: str, lang: str) -> None:
    value = st.session_state.get(key)
    default = lesson.scenario.get("engine", {}).get(setting)
    over = dict(state.overrides)
    if value is None or value == default or (setting == "layers" and value == "uniform"):
        over.pop(setting, None)
    else:
        over[setting] = value
    err = rebuild(state, lesson, ms, overrides=over, keep_step=True)
    if err:
        state.error = err


# -- layout pieces -----------------------------------------------------------------
def controls(state: PageState, k: str, focus: tuple[str, ...], lang: str) -> None:
    """Back, Step, Play, Run to end, Reset, Run until, the quiz switch; widget keys end in ``:k``."""
    run = state.run
    c = st.columns([1, 1.2, 1, 1.2, 1, 2.2, 0.8])
    c[0].button(tr("back", lang), key=f"back:{k}", on_click=on_back, args=(state,), disabled=run.cursor == run.first,
                width="stretch", shortcut="Left", icon=":material/arrow_back:")
    c[1].button(tr("step", lang), key=f"step:{k}", on_click=on_step, args=(state, k, focus, lang), type="primary",
                disabled=state.quiz is not None or run.finished, width="stretch", shortcut="Right",
                icon=":material/arrow_forward:", icon_position="right")
    c[2].button(tr("pause", lang) if state.playing else tr("play", lang), key=f"play:{k}", on_click=on_play,
                args=(state,), disabled=run.finished and not state.playing, width="stretch",
                icon=":material/pause:" if state.playing else ":material/play_arrow:")
    c[3].button(tr("to_end", lang), key=f"end:{k}", on_click=on_to_end, args=(state, lang),
                disabled=run.finished, width="stretch", icon=":material/skip_next:")
    c[4].button(tr("reset", lang), key=f"reset:{k}", on_click=on_reset, args=(state, lang), width="stretch",
                icon=":material/restart_alt:")
    kinds = tuple(dict.fromkeys(tuple(x for x in focus if x in UNTIL_KINDS) + UNTIL_KINDS))
    with c[5]:
        ic, bc = st.columns([2, 1])
        ic.selectbox(tr("run_until", lang), kinds, key=f"until_kind:{k}", label_visibility="collapsed",
                     format_func=lambda x: f"{tr('run_until', lang)}: {tr('kind_' + x, lang)}")
        bc.button(tr("run_until_go", lang), key=f"until:{k}", on_click=on_until,
                  args=(state, f"until_kind:{k}", lang), disabled=run.finished, width="stretch")
    c[6].toggle("🎓", key=f"quiz:{k}", help=tr("quiz_mode", lang))


def timeline(state: PageState, k: str, lang: str, caption: str = "step_of") -> None:
    """A slider over the recorded steps (from ``run.first``); ``caption`` is a text key with step/total."""
    run = state.run
    key = f"timeline:{k}"
    top = max(len(run.records), run.first + 1)
    st.session_state[key] = min(run.cursor, top)
    st.slider(tr("timeline", lang), run.first, top, key=key, on_change=on_timeline, args=(state, key, lang),
              disabled=len(run.records) <= run.first)
    st.caption(tr(caption, lang, step=run.cursor, total=len(run.records)))


def toggles(state: LessonState, lesson: Lesson, ms: ModelState, lang: str) -> None:
    if not lesson.toggles:
        return
    cols = st.columns(len(lesson.toggles) + 1)
    for col, t in zip(cols, lesson.toggles):
        key = f"tg:{lesson.id}:{t.setting}"
        default = lesson.scenario.get("engine", {}).get(t.setting, t.options[0])
        if t.setting == "layers":
            default = "uniform"
        st.session_state[key] = state.overrides.get(t.setting, default)
        labels = {o: pick(t.option_labels[i], lang) if i < len(t.option_labels) else str(o)
                  for i, o in enumerate(t.options)}
        col.segmented_control(pick(t.label, lang), t.options, key=key, format_func=lambda o, L=labels: L[o],
                              on_change=on_toggle, args=(state, lesson, ms, t.setting, key, lang), required=True)
    cols[-1].caption(tr("settings_apply_note", lang))


def quiz_box(state: PageState, k: str, lang: str) -> None:
    q = state.quiz
    if q is None:
        return
    with st.container(border=True):
        st.markdown(f"#### 🎓 {tr('quiz_title', lang)}")
        key = f"quiz_choice:{k}"
        st.radio(q.prompt, list(q.options), index=None, key=key, horizontal=True)
        c1, c2, c3 = st.columns(3)
        c1.button(tr("quiz_answer", lang), key=f"quiz_ans:{k}", on_click=on_quiz_answer, args=(state, key),
                  disabled=state.quiz_choice is not None)
        c2.button(tr("quiz_reveal", lang), key=f"quiz_rev:{k}", on_click=on_quiz_reveal,
                  args=(state, lang), type="primary")
        c3.button(tr("quiz_skip", lang), key=f"quiz_skip:{k}", on_click=on_quiz_reveal, args=(state, lang))
        if state.quiz_choice is not None:
            if state.quiz_choice == q.answer:
                st.success(f"{tr('quiz_right', lang)} {q.explain}")
            else:
                st.error(f"{tr('quiz_wrong', lang, answer=q.options[q.answer])} {q.explain}")


def apply_scenario_text(state: LessonState, lesson: Lesson, ms: ModelState, text, lang: str) -> bool:
    """Validate and load a scenario; on any problem the old state stays and the problems are shown."""
    d, problems = parse_scenario_text(text)
    if d is None:
        state.error = tr("bad_scenario", lang) + "\n" + "\n".join(f"- {p}" for p in problems)
        return False
    err = rebuild(state, lesson, ms, base=d, overrides={}, keep_step=False)
    if err:
        state.error = tr("bad_scenario", lang) + "\n" + "\n".join(f"- {p}" for p in err.splitlines())
        return False
    state.notice = tr("loaded_ok", lang, name=d.get("name", "?"))
    return True


def on_paste(state: LessonState, lesson: Lesson, ms: ModelState, key: str, lang: str) -> None:
    apply_scenario_text(state, lesson, ms, st.session_state.get(key) or "", lang)


def on_upload(state: LessonState, lesson: Lesson, ms: ModelState, key: str, lang: str) -> None:
    up = st.session_state.get(key)
    if up is None or up.file_id == state.upload_id:
        return
    state.upload_id = up.file_id
    apply_scenario_text(state, lesson, ms, up.getvalue(), lang)


def scenario_file(state: LessonState, lesson: Lesson, ms: ModelState, lang: str) -> None:
    with st.expander(tr("scenario", lang), expanded=False):
        data = json.dumps(scenario_to_dict(state.run.scenario), indent=2, ensure_ascii=False)
        st.download_button(tr("download", lang), data, file_name=f"{state.run.scenario.name}.json",
                           mime="application/json", key=f"dl:{lesson.id}")
        up_key = f"up:{lesson.id}"
        st.file_uploader(tr("upload", lang), type=["json"], key=up_key, on_change=on_upload,
                         args=(state, lesson, ms, up_key, lang))
        key = f"paste:{lesson.id}"
        st.text_area(tr("paste", lang), key=key, height=120)
        st.button(tr("load", lang), key=f"paste_btn:{lesson.id}", on_click=on_paste,
                  args=(state, lesson, ms, key, lang))
        st.caption(tr("link_caption", lang))
