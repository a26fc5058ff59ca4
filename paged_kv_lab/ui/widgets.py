"""Python-side controls around the player: a lesson's setting switches and the scenario file
(download, upload, paste). Stepping itself happens in the browser (ui/player_component.py)."""

from __future__ import annotations

import json
from typing import Callable, Hashable, Optional, TypeVar

import streamlit as st

from paged_kv_lab.content.catalog import Lesson
from paged_kv_lab.run.budget import BudgetError, app_limits, check_size
from paged_kv_lab.run.scenario import scenario_to_dict
from paged_kv_lab.store.server_cache import Shared
from paged_kv_lab.text.i18n import Text, said, tr
from paged_kv_lab.ui.modelstate import ModelState
from paged_kv_lab.ui.panels import md_escape
from paged_kv_lab.ui.state import LessonState, parse_scenario_text, rebuild

T = TypeVar("T")
POLL_S = 1.0  # how often a placeholder looks whether its value is ready


def on_toggle(
    state: LessonState, lesson: Lesson, ms: ModelState, setting: str, key: str, lang: str
) -> None:
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
        labels = {
            o: tr(t.option_labels[i], lang) if i < len(t.option_labels) else str(o)
            for i, o in enumerate(t.options)
        }
        col.segmented_control(
            tr(t.label, lang),
            t.options,
            key=key,
            format_func=lambda o, L=labels: L[o],
            on_change=on_toggle,
            args=(state, lesson, ms, t.setting, key, lang),
            required=True,
        )
    cols[-1].caption(tr("settings_apply_note", lang))


def apply_scenario_text(
    state: LessonState, lesson: Lesson, ms: ModelState, text, lang: str
) -> bool:
    """Validate and load a scenario; on any problem the old state stays and the problems are
    shown."""
    d, problems = parse_scenario_text(text, lang)
    if d is None:
        state.error = tr("bad_scenario", lang) + "\n" + "\n".join(f"- {p}" for p in problems)
        return False
    err = rebuild(state, lesson, ms, base=d, overrides={}, keep_step=False)
    if err:
        state.error = (
            tr("bad_scenario", lang) + "\n" + "\n".join(f"- {p}" for p in err.splitlines())
        )
        return False
    state.notice = tr("loaded_ok", lang, name=md_escape(str(d.get("name", "?"))))
    return True


def on_paste(state: LessonState, lesson: Lesson, ms: ModelState, key: str, lang: str) -> None:
    apply_scenario_text(state, lesson, ms, st.session_state.get(key) or "", lang)


def keep_upload_problem(state) -> None:
    """The refusal a file handler left in ``state.error``, kept for the uploaded file instead
    (shown by show_upload_problem while that file is in the uploader)."""
    if state.error:
        state.upload_problem, state.error = state.error, None


def show_upload_problem(state, up_key: str) -> None:
    """Why the file now in uploader ``up_key`` was refused, if it was."""
    up = st.session_state.get(up_key)
    if state.upload_problem and up is not None and up.file_id == state.upload_id:
        st.error(state.upload_problem)


def on_upload(state: LessonState, lesson: Lesson, ms: ModelState, key: str, lang: str) -> None:
    up = st.session_state.get(key)
    if up is None or up.file_id == state.upload_id:
        return
    state.upload_id, state.upload_problem = up.file_id, None
    try:  # refuse a too-large file before reading it whole
        check_size(up.size, Text("refusal.what.file", {"name": repr(up.name)}), app_limits())
    except BudgetError as e:
        state.upload_problem = tr("bad_scenario", lang) + "\n- " + said(e, lang)
        return
    apply_scenario_text(state, lesson, ms, up.getvalue(), lang)
    keep_upload_problem(state)


def scenario_file(state: LessonState, lesson: Lesson, ms: ModelState, lang: str) -> None:
    box = st.expander(tr("scenario", lang), key=f"scenario_open:{lesson.id}", on_change="rerun")
    # drawn only when opened: a closed expander's widgets would still load and draw
    if not box.open:
        return
    with box:
        data = json.dumps(scenario_to_dict(state.run.scenario), indent=2, ensure_ascii=False)
        st.download_button(
            tr("download", lang),
            data,
            file_name=f"{state.run.scenario.name}.json",
            mime="application/json",
            key=f"dl:{lesson.id}",
        )
        up_key = f"up:{lesson.id}"
        st.file_uploader(
            tr("upload", lang),
            type=["json"],
            key=up_key,
            on_change=on_upload,
            args=(state, lesson, ms, up_key, lang),
        )
        show_upload_problem(state, up_key)
        key = f"paste:{lesson.id}"
        st.text_area(tr("paste", lang), key=key, height=120)
        st.button(
            tr("load", lang),
            key=f"paste_btn:{lesson.id}",
            on_click=on_paste,
            args=(state, lesson, ms, key, lang),
        )
        st.caption(tr("link_caption", lang))


def ready_or_placeholder(
    shared: Shared[T], key: Hashable, compute: Callable[[], T], note: str
) -> Optional[T]:
    """On a page: the value for ``key`` if it is ready; else start computing it in the background,
    show ``note`` where the value will go, and return None (the note polls every POLL_S s and
    reruns the page when the value is ready, which replaces the note)."""
    shared.start(key, compute)
    value = shared.peek(key)
    if value is None:
        st.fragment(run_every=POLL_S)(_placeholder)(shared, key, note)
    return value


def _placeholder(shared: Shared, key: Hashable, note: str) -> None:
    if shared.ready(key):
        st.rerun()
    st.info(note, icon="⏳")
