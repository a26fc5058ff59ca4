"""The trace viewer: open a trace file (``python -m paged_kv_lab run ... --trace OUT.jsonl``) and
step
through it in the same player as the lessons (a trace is just a recorded run).

Nothing is recomputed: a TraceRun holds the file's records. Loading is plain functions on a
TraceState (``load_trace_bytes``, ``load_example``), which the page's callbacks and the tests call;
a file that does not read leaves the trace shown before untouched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from kvcore.engine.parallel_sampling import scenario_parents
from paged_kv_lab.content import lesson as lesson_by_id
from paged_kv_lab.run.budget import BudgetError, app_limits, check_size
from paged_kv_lab.run.scenario import load_scenario, scenario_to_dict
from paged_kv_lab.run.trace_file import Trace, TraceError, read_trace
from paged_kv_lab.store.timeline import MAX_RUN_STEPS, TraceRun
from paged_kv_lab.text.i18n import Text, said, tr
from paged_kv_lab.ui import panels as P
from paged_kv_lab.ui.class_panel import teach_param
from paged_kv_lab.ui.entry import streamlit_page
from paged_kv_lab.ui.lesson_page import current_lang, current_model, decoder
from paged_kv_lab.ui.modelstate import ModelState
from paged_kv_lab.ui.player_component import export_html, player_panel
from paged_kv_lab.ui.state import PageState, get_state, init_globals_from_url, locked, open_run
from paged_kv_lab.ui.why_panel import why_panel
from paged_kv_lab.ui.widgets import apply_scenario_text, keep_upload_problem, show_upload_problem

KEY = "trace"  # widget keys end in ":trace", as a lesson's end in ":<lesson id>"
STATE_KEY = "trace_viewer"  # the TraceState in st.session_state
FOCUS = ("evicted", "preempted", "cache_hit")
EXAMPLE = Path(__file__).resolve().parents[1] / "content" / "examples" / "eviction.json"


@dataclass
class TraceState(PageState):
    """The trace viewer's state; ``run`` is a TraceRun (or None before the first load)."""

    name: str | None = None  # the loaded file's name


def get_trace_state() -> TraceState:
    state = st.session_state.get(STATE_KEY)
    if state is None:
        state = st.session_state[STATE_KEY] = TraceState()
    return state


# -- loading (plain functions) ------------------------------------------------------------
def load_trace_bytes(
    state: TraceState, data: bytes | str, name: str, lang: str = "en"
) -> str | None:
    """Show the trace in ``data``; on a problem nothing changes and the message (also put in
    ``state.error``) comes back."""
    try:
        check_size(
            len(data.encode() if isinstance(data, str) else data),
            Text("refusal.what.trace_file", {"name": repr(name)}),
            app_limits(),
            "max_trace_bytes",
        )
        run = TraceRun(read_trace(data))
    except TraceError as e:
        state.error = (
            tr("bad_trace", lang, name=name) + "\n" + "\n".join(f"- {p}" for p in e.lines(lang))
        )
        return state.error
    except BudgetError as e:
        state.error = tr("bad_trace", lang, name=name) + "\n- " + said(e, lang)
        return state.error
    state.run, state.name = run, name
    state.quiz, state.quiz_choice, state.playing = None, None, False
    state.notice = tr("trace_loaded", lang, name=P.md_escape(name), steps=len(run.records))
    return None


class ExampleTimeout(TimeoutError):
    """The example's run did not finish within ``seconds`` (the server is busy)."""

    def __init__(self, seconds: float) -> None:
        self.text = Text("trace.example_timeout", {"secs": seconds})
        super().__init__(tr(self.text, "en"))


def example_trace(ms: ModelState, path: Path = EXAMPLE, timeout: float = 120.0) -> str:
    """The scenario at ``path`` run to the end on the loaded model, as the CLI's --trace writes it.
    Its steps come from the shared run store (one engine step at a time, fairly with other
    sessions)."""
    scenario = load_scenario(path, {"model": ms.name, "device": ms.device})
    cursor = open_run(scenario, ms)
    cursor.run_to_end(MAX_RUN_STEPS, timeout=timeout)
    if not cursor.run.done:
        raise ExampleTimeout(timeout)
    outputs = cursor.outputs()
    parents = scenario_parents(scenario.requests, outputs or ())
    return Trace(
        scenario_to_dict(scenario), cursor.initial, tuple(cursor.records), outputs, parents
    ).to_jsonl()


def load_example(state: TraceState, ms: ModelState, lang: str = "en") -> str | None:
    try:
        text = locked(example_trace, ms)
    except ExampleTimeout as e:
        state.error = tr(e.text, lang)
        return state.error
    except Exception as e:  # the engine failed: the page says why and keeps running
        state.error = tr("step_error", lang, error=f"{type(e).__name__}: {e}")
        return state.error
    return load_trace_bytes(state, text, EXAMPLE.with_suffix(".jsonl").name, lang)


def trace_decoder(run: TraceRun, ms: ModelState):
    """Decode token ids with the loaded model only if it is the model that recorded the trace."""
    if run.scenario is not None and ms.model is not None and run.scenario.model == ms.name:
        return decoder(ms.model)
    return None


def request_ids(run: TraceRun) -> list[str]:
    """Every request in the trace: the scenario's order, then any other in order of appearance."""
    ids = [r.id for r in run.scenario.requests] if run.scenario is not None else []
    ids += [r.request_id for s in run.snapshots(len(run.records)) for r in s.requests]
    return list(dict.fromkeys(ids))


def open_in_playground(trace: Trace, ms: ModelState, lang: str) -> str | None:
    """Make the header's scenario the Playground's (as an uploaded scenario would); an error or
    None."""
    lesson = lesson_by_id("playground")
    pstate = get_state(lesson, ms)
    if apply_scenario_text(pstate, lesson, ms, json.dumps(trace.scenario), lang):
        return None
    err, pstate.error = pstate.error, None
    return err


# -- callbacks -------------------------------------------------------------------------
def on_upload(state: TraceState, key: str, lang: str) -> None:
    up = st.session_state.get(key)
    if up is None or up.file_id == state.upload_id:
        return
    state.upload_id, state.upload_problem = up.file_id, None
    try:  # refuse a too-large file before reading it whole
        what = Text("refusal.what.trace_file", {"name": repr(up.name)})
        check_size(up.size, what, app_limits(), "max_trace_bytes")
    except BudgetError as e:
        state.upload_problem = tr("bad_trace", lang, name=up.name) + "\n- " + said(e, lang)
        return
    load_trace_bytes(state, up.getvalue(), up.name, lang)
    keep_upload_problem(state)


# -- the page --------------------------------------------------------------------------
def render_trace_page() -> None:
    init_globals_from_url()
    lang = current_lang()
    ms = current_model()
    state = get_trace_state()
    st.title(f"🔎 {tr('trace_title', lang)}")
    st.caption(tr("trace_summary", lang))
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    up_key = f"up:{KEY}"
    c1.file_uploader(
        tr("trace_upload", lang),
        type=["jsonl", "json"],
        key=up_key,
        on_change=on_upload,
        args=(state, up_key, lang),
    )
    with c1:
        show_upload_problem(state, up_key)
    c2.button(
        tr("trace_example", lang),
        key=f"example:{KEY}",
        on_click=load_example,
        args=(state, ms, lang),
        help=tr("trace_example_help", lang),
        disabled=ms.model is None,
        width="stretch",
    )
    if state.error:
        st.error(state.error)
        state.error = None
    if state.notice:
        st.success(state.notice)
        state.notice = None
    write_url(lang, ms)
    run = state.run
    if run is None:
        st.info(tr("trace_none", lang))
        return
    decode = trace_decoder(run, ms)
    show_about(state, ms, lang, decoded=decode is not None)
    c1, c2 = st.columns([1, 5], vertical_alignment="center")
    c1.toggle("🎓", key=f"quiz:{KEY}", help=tr("quiz_mode", lang))
    with c2:
        download_trace_run(state, lang, decode)
    st.fragment(trace_stage)(state, lang, decode)
    show_final_outputs(run.trace, lang)
    show_scenario(run.trace, ms, lang)


def trace_stage(state: TraceState, lang: str, decode) -> None:
    """The player over the trace's steps and the "Why?" panel at its cursor (a fragment)."""
    run = state.run
    player_panel(
        state,
        KEY,
        lang,
        decode=decode,
        focus=FOCUS,
        request_ids=request_ids(run),
        meta=P.player_panels(("requests", "metrics"), run, lang),
    )
    why_panel(run, lang, KEY, decode)


def download_trace_run(state: TraceState, lang: str, decode) -> None:
    def build() -> str:
        return export_html(
            state.run,
            lang,
            tr("trace.export_title", lang, name=state.name or tr("trace.unnamed", lang)),
            decode=decode,
            request_ids=request_ids(state.run),
            focus=FOCUS,
            meta=P.player_panels(("requests", "metrics"), state.run, lang),
        )

    st.download_button(
        tr("download_run", lang),
        build,
        file_name=f"{Path(state.name or 'trace').stem}.html",
        mime="text/html",
        key=f"dl_run:{KEY}",
        on_click="ignore",
        icon=":material/download:",
        help=tr("download_run_help", lang),
    )


def show_about(state: TraceState, ms: ModelState, lang: str, decoded: bool) -> None:
    run = state.run
    sc = run.scenario
    st.markdown(
        tr(
            "trace_about",
            lang,
            name=P.md_escape(state.name or "?"),
            steps=len(run.records),
            scenario=P.md_escape(short(sc.name)) if sc else "?",
            model=sc.model if sc else "?",
        )
    )
    if sc is None:
        st.info(tr("trace_no_header", lang))
    if not decoded:
        st.caption(
            tr("trace_ids_only", lang, model=sc.model, loaded=ms.name)
            if sc is not None
            else tr("trace_ids_unknown", lang)
        )


def show_final_outputs(trace: Trace, lang: str) -> None:
    st.markdown(f"**{tr('trace_outputs', lang)}**")
    if trace.outputs is None:
        st.caption(tr("trace_no_outputs", lang))
        return
    rows = [
        (rid, o["finish_reason"] or "—", o["text"], " ".join(map(str, o["token_ids"])))
        for rid, o in trace.outputs.items()
    ]
    st.dataframe(
        pd.DataFrame(rows, columns=list(tr("trace_outputs_cols", lang))),
        hide_index=True,
        width="stretch",
    )
    if trace.parents:  # n > 1: the children above, grouped under the request as it was sent
        cols = list(tr("trace_parents_cols", lang))
        st.dataframe(
            pd.DataFrame(
                [(p, len(k), ", ".join(k)) for p, k in trace.parents.items()], columns=cols
            ),
            hide_index=True,
            width="stretch",
        )


def show_scenario(trace: Trace, ms: ModelState, lang: str) -> None:
    if trace.scenario is None:
        return
    with st.expander(tr("trace_scenario", lang), expanded=False):
        sc = trace.scenario
        if sc.get("description"):
            st.caption(P.md_escape(short(sc["description"])))
        # the file's words, never markup: code spans (a backtick in a value would end one, so
        # it goes), cut so that a huge value cannot fill the page
        st.markdown(
            " · ".join(
                f"`{k}={short(str(v)).replace('`', '')}`"
                for k, v in sc["engine"].items()
                if v is not None
            )
        )
        st.json(sc, expanded=False)
        if st.button(
            tr("trace_open_playground", lang), key=f"playground:{KEY}", disabled=ms.model is None
        ):
            err = open_in_playground(trace, ms, lang)
            if err is None:
                st.switch_page(streamlit_page("playground", lang))  # stops this run
            else:
                st.error(err)


def short(text: str, most: int = 200) -> str:
    return text if len(text) <= most else text[:most] + f"… ({len(text):,})"


def write_url(lang: str, ms: ModelState) -> None:
    """A trace cannot live in the URL: keep only the sidebar's choices (drop a lesson's step,
    settings)."""
    params = {"lang": lang, "model": ms.name, "device": ms.device, **teach_param()}
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)
