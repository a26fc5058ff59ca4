"""One lesson page: settings, the step player (every per-step picture, drawn in the browser) and
the Python panels that follow its cursor."""

from __future__ import annotations

import streamlit as st

from paged_kv_lab.content import lesson as lesson_by_id
from paged_kv_lab.run.scenario import block_size_note
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui import panels as P
from paged_kv_lab.ui.modelstate import ModelState, default_device, default_model
from paged_kv_lab.ui.player_component import (
    export_html,
    page_fragment,
    player_panel,
    step_cap_note,
)
from paged_kv_lab.ui.state import get_state, init_globals_from_url, pref, write_url
from paged_kv_lab.ui.why_panel import why_panel
from paged_kv_lab.ui.widgets import scenario_file, toggles


def current_lang() -> str:
    return pref("lang", "en")


def current_model() -> ModelState:
    """The model the sidebar loaded in this run (ui/entry.py stores it); loaded here only if a
    page is drawn without the entry."""
    name = pref("model_name", default_model())
    device = pref("device", default_device())
    ms = st.session_state.get("_model_state")
    if ms is None or (ms.name, ms.device) != (name, device):
        from paged_kv_lab.ui.modelstate import get_model

        ms = get_model(name, device)
    return ms


def played_model_state(lesson, ms: ModelState, lang: str) -> ModelState:
    """The model a lesson (or a case) plays on (modelstate.played_model_state), said while it
    loads."""
    from paged_kv_lab.ui.modelstate import played_model_state as played

    if lesson.model is None or lesson.model == ms.name:
        return ms
    return played(lesson, ms, tr("model_loading", lang, model=lesson.model, device=ms.device))


def decoder(model):
    """The model's shared decoder: a bounded, thread-safe cache of token ids -> text
    (runstore/store.py)."""
    from paged_kv_lab.store.token_text import decoder_for

    return decoder_for(model)


def render_lesson(lesson_id: str, compact: bool = False) -> None:
    lesson = lesson_by_id(lesson_id)
    init_globals_from_url()
    lang = current_lang()
    ms = played_model_state(lesson, current_model(), lang)
    if not compact:
        st.title(
            f"{lesson.icon} {lesson.number}. {tr(lesson.title, lang)}"
            if lesson.number
            else tr(lesson.title, lang)
        )
        if lesson.summary:
            st.caption(tr(lesson.summary, lang))
    if ms.model is None:
        st.error(tr("model_failed", lang, model=ms.name, device=ms.device, error=ms.error))
        st.info(tr("model_hint", lang))
        st.markdown(tr(lesson.intro, lang).replace("{", "(").replace("}", ")"))
        P.show_questions(lesson, lang)
        return
    state = get_state(lesson, ms)
    if state.error:
        st.error(state.error)
        state.error = None
    if state.notice:
        st.success(state.notice)
        state.notice = None
    if not compact:
        toggles(state, lesson, ms, lang)
        note = block_size_note(state.run.scenario)
        if note is not None:  # a hybrid model: its block size as vLLM resolves it
            st.caption(tr(note, lang))
    c1, c2 = st.columns([1, 5], vertical_alignment="center")
    c1.toggle("🎓", key=f"quiz:{lesson.id}", help=tr("quiz_mode", lang))
    with c2:
        download_run(state, lesson, ms, lang)
    page_fragment(lesson_stage, lesson.id)(lesson, state, ms, lang, compact)
    if not compact:
        if "memory" in lesson.panels and ms.model is not None:  # not per step: outside the fragment
            P.show_memory(state.run, lang, ms.model, lesson.id)
        if "hybrid" in lesson.panels and ms.model is not None:
            P.show_hybrid_pages(state.run, lang, ms.model)
        if "admission" in lesson.panels:  # the window switch's runs side by side
            from paged_kv_lab.ui.admission_panel import show_admission

            show_admission(state, lesson, ms, lang)
        if lesson.id == "playground":
            from paged_kv_lab.ui.playground import request_form, settings_form

            settings_form(state, lesson, ms, lang)
            request_form(state, lesson, ms, lang)
        P.show_questions(lesson, lang)
        scenario_file(state, lesson, ms, lang)


def lesson_player(state, lesson, ms, lang: str) -> dict:
    """What the player needs besides the run, for a lesson (the page and the export share it)."""
    run = state.run
    decode = decoder(ms.model)
    narrate = P.LessonNarrator(lesson, run, lang)
    if getattr(run.scenario.engine, "fleet", None) is not None:  # replicas behind a router
        from paged_kv_lab.ui.fleet_page import fleet_narrator

        narrate = fleet_narrator(narrate, run.scenario, lang)
    return {
        "decode": decode,
        "narrate": narrate,
        "intro": P.intro_text(lesson, run, lang),
        "outro": P.outro_text(lesson, run, lang),
        "request_ids": [r.id for r in run.scenario.requests],
        "meta": P.player_panels(("requests", "metrics", *lesson.panels), run, lang),
    }


def lesson_stage(lesson, state, ms, lang: str, compact: bool) -> None:
    """The part of the page that follows the player's cursor: it reruns alone (a fragment), when the
    player reports its cursor or asks for the steps recorded since."""
    kw = lesson_player(state, lesson, ms, lang)
    if compact:  # the player alone: no panels under it
        kw["meta"] = P.player_panels((), state.run, lang)
    player_panel(
        state,
        lesson.id,
        lang,
        focus=lesson.focus,
        url_step=True,
        class_questions=lesson.class_questions,
        **{k: kw[k] for k in ("decode", "narrate", "intro", "outro", "request_ids", "meta")},
    )
    run = state.run
    step_cap_note(run, lang)
    if not compact:
        if "cpu_tier" in lesson.panels or run.scenario.engine.cpu_offload is not None:
            from paged_kv_lab.ui.cpu_tier import show_cpu_tier

            show_cpu_tier(run, lang, ms.device)
        if "pd" in lesson.panels:
            from paged_kv_lab.ui.pd_panel import show_pools, show_ttft_split

            show_pools(run, lang)
            show_ttft_split(run, lang, ms.device)
        designs = None
        if "designs" in lesson.panels:  # SGLang's and nano-vllm's views at the player's step
            from paged_kv_lab.ui.designs_page import show_designs

            designs = show_designs(run, lang, kw["decode"], lesson.id)
        if "fleet" in lesson.panels:  # the router's decisions and the replicas at the step
            from paged_kv_lab.ui.fleet_page import show_fleet

            show_fleet(run, lang, lesson, ms, state.overrides)
        P.show_myths(run, lang, lesson.id, expanded="myths" in lesson.panels)
        if getattr(run.scenario.engine, "fleet", None) is None:  # a fleet's "why?" is above
            why_panel(run, lang, lesson.id, kw["decode"], designs=designs)
    write_url(state, lesson, lang, ms)


def download_run(state, lesson, ms, lang: str) -> None:
    """ "Download this run": the recorded steps so far, as one HTML file that plays offline."""

    def build() -> str:
        return export_html(
            state.run,
            lang,
            f"Paged KV Lab · {tr(lesson.title, lang)}",
            focus=lesson.focus,
            **lesson_player(state, lesson, ms, lang),
        )

    st.download_button(
        tr("download_run", lang),
        build,
        file_name=f"{state.run.scenario.name}.html",
        mime="text/html",
        key=f"dl_run:{lesson.id}",
        on_click="ignore",
        icon=":material/download:",
        help=tr("download_run_help", lang),
    )
