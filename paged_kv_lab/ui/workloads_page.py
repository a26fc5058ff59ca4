"""The "Real workloads" page: replay a production trace through the faithful cache, ask "what if"
of the pool size, and step into any moment of it in the large-pool player.

Input: the shipped Mooncake trace (a slice of it) or an uploaded one, bounded by the page's
budget (workloads/trace_limits.py: bytes, requests, tokens, blocks, steps; each refusal names its
variable). Charts (Vega-Lite): hit rate against pool size (a sweep), and usage, hit rate, running
and waiting over the replay's steps; a click on a point, or a request picked, opens the player
there. The Why? panel tells why a request hit what it hit, from the replay's cache history.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import pandas as pd
import streamlit as st

from paged_kv_lab.player.pool_payload import pool_asset, pool_css, pool_module_js, pool_payload
from paged_kv_lab.run.budget import BudgetError
from paged_kv_lab.store.server_cache import Shared, collector_paused
from paged_kv_lab.text.i18n import Text, said, tr
from paged_kv_lab.ui import class_panel as classroom
from paged_kv_lab.ui.lesson_page import current_lang
from paged_kv_lab.ui.panels import md_escape
from paged_kv_lab.ui.widgets import ready_or_placeholder
from paged_kv_lab.why.explain_replay import replay_hit_sentences
from paged_kv_lab.workloads.bound import unbounded_answer, why_not_exact
from paged_kv_lab.workloads.page_data import (
    Settings,
    Window,
    WorkloadRun,
    admission_step,
    fill_checkpoints,
    read_upload,
    record_window,
    run_workload,
    series_rows,
    shipped_trace,
    shipped_trace_path,
    sweep_values,
)
from paged_kv_lab.workloads.replay import ReplayError
from paged_kv_lab.workloads.sweep import sweep
from paged_kv_lab.workloads.trace_formats import Trace, TraceError
from paged_kv_lab.workloads.trace_limits import check, page_trace_limits

KEY = "workloads"
COMPONENT = "paged_kv_lab.pool_player"
BLOCK_SIZES = (16, 32, 64, 128, 256, 512)
SLIDING_MULTIPLES = (1, 2, 4, 8)  # the sliding-window layers' block over block_size


@dataclass
class WorkloadsState:
    """The page's state in one session: the trace shown, its replay, the sweep, the window."""

    trace: Optional[Trace] = None
    trace_key: str = ""  # names the trace's content (for the shared caches)
    run: Optional[WorkloadRun] = None
    sweep: list[tuple[int, float]] = field(default_factory=list)
    sweep_errors: list[str] = field(default_factory=list)
    unbounded: Any = None  # workload.bound.UnboundedAnswer (sequential arrival only)
    unbounded_why: str = ""
    window: Optional[Window] = None
    window_token: str = ""
    # while ``window`` is a moment's glimpse: the WINDOWS key of the whole window around it
    window_key: Optional[tuple] = None
    window_extends: Optional[str] = None  # the run (token) the whole window replaced
    goto_seq: int = 0
    error: Optional[str] = None
    upload_id: Any = None
    opened: bool = False  # the first slice was offered (on the session's first visit)
    first: Optional[Settings] = None  # the first slice's settings while it replays


def get_workloads_state() -> WorkloadsState:
    state = st.session_state.get(KEY)
    if state is None:
        state = st.session_state[KEY] = WorkloadsState()
    return state


# -- shared between sessions: a replay depends only on the trace and the settings ---------------
# (trace key, settings) -> the replay. Its size is measured over everything it holds (figures,
# the cache history and the replay's pool, which the history keeps: some 40 MB and 700,000
# objects for the first slice), in the background once stored, since that walk takes seconds;
# it goes when the server's one cache (runs/server_cache.py) needs the room
RUNS: Shared[WorkloadRun] = Shared("workloads", measure_later=True)
# (trace key, settings) -> the sweep: (pool size, hit rate) points, errors, the one-pass answer
SWEEPS: Shared[tuple] = Shared("sweeps")
FIRST_COUNT = 100  # the shipped trace's first slice, replayed before anyone asks
# (trace key, settings) -> the bytes of checkpoints added to that replay (fill_checkpoints: a
# moment's window then resumes near it), computed ahead of visitors once the replay is shown
FILLED: Shared[int] = Shared("filled checkpoints", size=lambda added: added)
# (trace key, settings, step) -> the whole window around a moment (record_window's default
# extent: 40 steps before it, 80 after), recorded in the background after its glimpse showed
WINDOWS: Shared[Window] = Shared("moment windows", keep=8, measure_later=True)
# A click opens the player on a glimpse first: the step, GLIMPSE[0] steps before it and
# GLIMPSE[1] after, each frame as the whole window has it, recorded in a fraction of the time;
# the whole window replaces it once recorded, the player staying at its step
GLIMPSE = (2, 4)
# (trace key, settings, step) -> that moment's glimpse: recorded when a click asks for it, or
# ahead, once a step is entered in the "open at step" field or a request picked (the learner
# then clicks the button: the glimpse is ready or under way, and no session records it twice)
GLIMPSES: Shared[Window] = Shared("moment glimpses", keep=8, measure_later=True)
WINDOW_POLL_S = 0.5  # how often the page looks whether the whole window is ready


def shared_run(trace_key: str, trace: Trace, settings: Settings, limits) -> WorkloadRun:
    """The replay of ``trace`` with ``settings``, computed once for every session that asks
    (a second asker waits for the first)."""
    return RUNS.get((trace_key, settings), lambda: run_workload(trace, settings, limits))


def fill_ahead(trace_key: str, run: WorkloadRun) -> None:
    """Fill the run's checkpoints in the background (once per replay, for every session)."""
    FILLED.start((trace_key, run.settings), lambda: filled_and_warm(run))


def filled_and_warm(run: WorkloadRun) -> int:
    """``fill_checkpoints``, then one moment's glimpse recorded and encoded, unshown: the first
    moment a visitor opens then costs what any later one does (in a fresh process the first
    took some 0.2 s more: the code and words it reads the first time). The bytes added."""
    added = fill_checkpoints(run)
    try:
        w = record_window(
            run.trace,
            run.settings,
            max(1, run.result.steps // 2),
            page_trace_limits(),
            checkpoints=run.checkpoints,
            show_before=GLIMPSE[0],
            show_after=GLIMPSE[1],
        )
    except (BudgetError, ReplayError, ValueError):  # the moment the visitor opens will say why
        return added
    pool_payload(w.frames, num_gpu_blocks=w.num_gpu_blocks, block_size=w.block_size, start=w.start)
    return added


def first_slice(limits) -> tuple[str, Trace, Settings]:
    """What the page opens on: the shipped trace's first requests with the form's defaults."""
    count = min(FIRST_COUNT, limits.max_requests)
    settings = Settings(num_gpu_blocks=min(Settings.num_gpu_blocks, limits.max_num_gpu_blocks))
    return f"shipped:{shipped_trace_path()}:0:{count}", shipped_trace(0, count, limits), settings


def prepare_first_slice() -> None:
    """Replay the first slice now (the server's warm-up thread calls this); a trace over the
    page's budget is left for the page to refuse."""
    limits = page_trace_limits()
    try:
        key, trace, settings = first_slice(limits)
    except (BudgetError, TraceError):
        return
    run = shared_run(key, trace, settings, limits)
    FILLED.get((key, settings), lambda: filled_and_warm(run))


# -- actions (plain functions: the page's buttons and the tests call them) -------------------------
def forget_sweep(state: WorkloadsState) -> None:
    state.sweep, state.sweep_errors, state.unbounded, state.unbounded_why = [], [], None, ""


def use_trace(state: WorkloadsState, trace: Trace, key: str) -> None:
    state.trace, state.trace_key = trace, key
    state.run, state.window, state.first = None, None, None
    forget_sweep(state)


def load_shipped(state: WorkloadsState, start: int, count: int, lang: str = "en") -> Optional[str]:
    try:
        trace = shipped_trace(start, count, page_trace_limits())
    except (BudgetError, TraceError) as e:
        state.error = tr("workloads.bad_trace", lang, error=said(e, lang))
        return state.error
    use_trace(state, trace, f"shipped:{shipped_trace_path()}:{start}:{count}")
    return None


def open_first_slice(state: WorkloadsState, limits, lang: str = "en") -> None:
    """Show the shipped trace's first slice, replayed with the form's defaults (computed ahead by
    the server's warm-up; until it is ready the page says so where the figures go)."""
    try:
        key, trace, settings = first_slice(limits)
    except (BudgetError, TraceError) as e:
        state.error = tr("workloads.bad_trace", lang, error=said(e, lang))
        return
    use_trace(state, trace, key)
    state.first = settings


def load_upload(state: WorkloadsState, data: bytes, name: str, lang: str = "en") -> Optional[str]:
    try:
        trace = read_upload(data, name, page_trace_limits())
    except (BudgetError, TraceError) as e:
        state.error = tr("workloads.bad_trace", lang, error=said(e, lang))
        return state.error
    use_trace(state, trace, "upload:" + hashlib.sha256(data).hexdigest())
    return None


def replay_now(state: WorkloadsState, settings: Settings, lang: str = "en") -> Optional[str]:
    if state.trace is None:
        return None
    try:
        state.run = shared_run(state.trace_key, state.trace, settings, page_trace_limits())
    except (BudgetError, ReplayError, ValueError) as e:
        state.error = tr("workloads.bad_replay", lang, error=said(e, lang))
        return state.error
    state.window = None
    forget_sweep(state)
    return None


def sweep_now(state: WorkloadsState, lang: str = "en") -> Optional[str]:
    """The hit rate at pool sizes around the chosen one (workload.sweep: each a whole replay,
    here in this process), and with sequential arrival the one-pass answer: what an unbounded
    pool reaches and the smallest pool that does (paged_kv_lab.workloads.bound). Computed once per
    trace and settings for every session that asks (``SWEEPS``)."""
    run = state.run
    if run is None:
        return None
    trace, s = state.trace, run.settings

    def compute() -> tuple:
        base = s.replay_settings(trace)
        points = sweep(
            trace,
            {k: v for k, v in s.engine_overrides().items() if k != "num_gpu_blocks"},
            "num_gpu_blocks",
            sweep_values(trace, s, page_trace_limits()),
            workers=1,
            arrival=s.arrival,
            speedup=s.speedup,
        )
        # a pool too small for the longest request is no point (its error says why)
        return (
            [(p.value, p.result.hit_rate) for p in points if p.result is not None],
            [f"{p.value:,}: {p.error}" for p in points if p.result is None],
            unbounded_answer(trace, base) if not why_not_exact(base) else None,
            why_not_exact(base),
        )

    found = SWEEPS.get((state.trace_key, s), compute)
    state.sweep, state.sweep_errors = list(found[0]), list(found[1])
    state.unbounded, state.unbounded_why = found[2], found[3]
    return None


def open_moment(
    state: WorkloadsState, step: int, lang: str = "en", request: Optional[str] = None
) -> Optional[str]:
    """Open the player at ``step`` (following ``request``): on the whole window around it if
    some session opened that step before, else on its glimpse (``GLIMPSE``), whose whole window
    is recorded once the browser holds the glimpse (``pool_player``)."""
    run = state.run
    if run is None:
        return None
    step = max(1, min(int(step), run.result.steps))
    key = (state.trace_key, run.settings, step)
    try:
        whole = WINDOWS.peek(key)
    except (BudgetError, ReplayError, ValueError):  # its recording failed: the glimpse says why
        whole = None
    try:
        state.window = whole or GLIMPSES.get(key, lambda: _record_glimpse(run, step))
    except (BudgetError, ReplayError, ValueError) as e:
        state.error = tr("workloads.bad_replay", lang, error=said(e, lang))
        return state.error
    state.window_key = None if whole else key
    state.window_extends = None
    state.goto_seq += 1
    state.window_token = _window_token(state, step, "whole" if whole else "glimpse")
    st.session_state[f"{KEY}:follow"] = request
    return None


def _window_token(state: WorkloadsState, step: int, extent: str) -> str:
    run = state.run
    text = f"{state.trace_key}|{run.settings}|{step}|{state.goto_seq}|{extent}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _record_glimpse(run: WorkloadRun, step: int) -> Window:
    with collector_paused():  # a burst of allocation a visitor waits for
        return record_window(
            run.trace,
            run.settings,
            step,
            page_trace_limits(),
            checkpoints=run.checkpoints,
            show_before=GLIMPSE[0],
            show_after=GLIMPSE[1],
        )


def glimpse_ahead(state: WorkloadsState, step: Optional[int]) -> None:
    """Record the glimpse of ``step`` in the background (``GLIMPSES``) when it is not the step
    this session last asked ahead for: the learner entered it, and opens it next."""
    run = state.run
    if run is None or step is None:
        return
    step = max(1, min(int(step), run.result.steps))
    if st.session_state.get(f"{KEY}:ahead") == step:
        return
    st.session_state[f"{KEY}:ahead"] = step
    key = (state.trace_key, run.settings, step)
    if WINDOWS.ready(key):
        return
    GLIMPSES.start(key, lambda: _record_glimpse(run, step))


def _record_whole(run: WorkloadRun, step: int) -> Window:
    return record_window(
        run.trace, run.settings, step, page_trace_limits(), checkpoints=run.checkpoints
    )


def complete_window(state: WorkloadsState, lang: str) -> None:
    """The glimpse shown gives way to its whole window once that is recorded (the player, told
    which run it extends, stays at its step)."""
    key = state.window_key
    if key is None or state.run is None:
        return
    try:
        whole = WINDOWS.peek(key)
    except (BudgetError, ReplayError, ValueError):
        state.window_key = None  # the glimpse stays
        return
    if whole is None:
        return
    state.window_extends = state.window_token + lang
    state.window, state.window_key = whole, None
    state.window_token = _window_token(state, key[2], "whole")


# -- the player --------------------------------------------------------------------------------
def pool_component():
    return st.components.v2.component(
        COMPONENT, html=pool_asset("pool.html"), css=pool_css(), js=pool_module_js()
    )


def pool_player(state: WorkloadsState, lang: str) -> None:
    """Mount the large-pool player on the recorded window. The frames go to the browser once:
    it says which window it holds (``have``), and later reruns of the page send only where to
    go; a browser that lost them (a reload) asks again."""
    w = state.window
    token = state.window_token + lang
    got = st.session_state.get(f"pool:{KEY}")
    have = (dict(got).get("have") if got is not None else None) or {}
    follow = st.session_state.get(f"{KEY}:follow")
    data: dict = {"run": token}
    if have.get("run") != token:
        data = pool_payload(
            w.frames,
            num_gpu_blocks=w.num_gpu_blocks,
            block_size=w.block_size,
            lang=lang,
            start=w.start,
            run=token,
            groups=w.groups,
            group_block_sizes=w.group_block_sizes,
            extends=state.window_extends,
        )
    data["goto"] = {"seq": state.goto_seq, "index": w.start, "request": follow}
    teaching = classroom.teaching(KEY)
    data["room"] = classroom.room_cfg(teaching, state.window_token, lang)
    mount_pool(data)
    key = state.window_key
    if key is not None:
        if have.get("run") == token:  # the browser shows the glimpse: now the whole window
            run, step = state.run, key[2]
            WINDOWS.start(key, lambda: _record_whole(run, step))
        st.fragment(run_every=WINDOW_POLL_S)(_whole_window_ready)(key)

    def whole() -> dict:
        return pool_payload(
            w.frames,
            num_gpu_blocks=w.num_gpu_blocks,
            block_size=w.block_size,
            lang=lang,
            start=w.start,
            run=token,
            groups=w.groups,
            group_block_sizes=w.group_block_sizes,
        )

    classroom.teach_pool_panel(KEY, lang, teaching, state.window_token, whole)


def _noop() -> None:
    pass


def _whole_window_ready(key: tuple) -> None:
    if WINDOWS.ready(key):
        st.rerun()


# -- the page ----------------------------------------------------------------------------------
def render_workloads_page() -> None:
    lang = current_lang()
    state = get_workloads_state()
    limits = page_trace_limits()
    st.title(f"🏭 {tr('workloads.title', lang)}")
    st.caption(tr("workloads.summary", lang))
    source = st.radio(
        tr("workloads.source", lang),
        ("shipped", "upload"),
        format_func=lambda s: tr(f"workloads.source_{s}", lang),
        horizontal=True,
        key=f"source:{KEY}",
    )
    if source == "shipped" and state.trace is None and not state.opened:
        state.opened = True  # once: a refused first slice is said, then the form is the page's
        open_first_slice(state, limits, lang)
    if source == "shipped":
        c1, c2, c3 = st.columns([1, 1, 1], vertical_alignment="bottom")
        start = c1.number_input(
            tr("workloads.start", lang), 0, 10**6, 0, step=1, key=f"start:{KEY}"
        )
        count = c2.number_input(
            tr("workloads.count", lang, limit=limits.max_requests),
            1,
            10**6,
            min(100, limits.max_requests),
            step=10,
            key=f"count:{KEY}",
        )
        if c3.button(tr("workloads.load", lang), key=f"load:{KEY}", width="stretch"):
            load_shipped(state, int(start), int(count), lang)
        st.caption(tr("workloads.shipped_about", lang))
    else:
        up = st.file_uploader(
            tr("workloads.upload", lang, limit=limits.max_trace_bytes // 1000),
            type=["jsonl", "json"],
            key=f"up:{KEY}",
        )
        if up is not None and up.file_id != state.upload_id:
            state.upload_id = up.file_id
            try:  # refused before it is read whole
                what = Text("refusal.what.trace_file", {"name": repr(up.name)})
                check(what, up.size, limits, "max_trace_bytes")
            except BudgetError as e:
                state.error = tr("workloads.bad_trace", lang, error=said(e, lang))
            else:
                load_upload(state, up.getvalue(), up.name, lang)
    if state.error:
        st.error(state.error)
        state.error = None
    trace = state.trace
    if trace is None:
        st.info(tr("workloads.none", lang))
        return
    st.markdown(
        tr(
            "workloads.trace_about",
            lang,
            name=md_escape(trace.name),
            requests=f"{len(trace):,}",
            fmt=trace.format,
            block=trace.block_size,
            prompt=f"{trace.prompt_tokens:,}",
            output=f"{trace.output_tokens:,}",
        )
    )
    settings = settings_form(trace, lang, limits)
    if st.button(tr("workloads.replay", lang), type="primary", key=f"replay:{KEY}"):
        with st.spinner(tr("workloads.replaying", lang)):
            replay_now(state, settings, lang)
        if state.error:
            st.error(state.error)
            state.error = None
    if state.run is None and state.first is not None:
        first = state.first
        compute = lambda: run_workload(trace, first, limits)  # noqa: E731
        key = (state.trace_key, first)  # shared_run's
        state.run = ready_or_placeholder(RUNS, key, compute, tr("workloads.replaying", lang))
        if state.run is not None:
            state.first = None
    run = state.run
    if run is None:
        return
    fill_ahead(state.trace_key, run)
    if run.settings != settings:
        st.caption(tr("workloads.settings_changed", lang))
    show_figures(run, lang)
    show_over_time(state, lang)
    show_sweep(state, lang)
    show_moment(state, lang)
    why_panel(state, lang)
    show_requests(run, lang)
    from paged_kv_lab.ui.fleet_workloads import render_fleet_mode

    render_fleet_mode(trace, state.trace_key, run.settings, lang)


def settings_form(trace: Trace, lang: str, limits) -> Settings:
    sizes = [b for b in BLOCK_SIZES if trace.block_size % b == 0] or [trace.block_size]
    c1, c2, c3, c4 = st.columns(4)
    bs = c1.selectbox("block_size", sizes, key=f"bs:{KEY}")
    blocks = c2.number_input(
        "num_gpu_blocks",
        2,
        limits.max_num_gpu_blocks,
        min(10_000, limits.max_num_gpu_blocks),
        step=1000,
        key=f"blocks:{KEY}",
    )
    seqs = c3.number_input("max_num_seqs", 1, 1024, 64, key=f"seqs:{KEY}")
    batched = c4.number_input("max_num_batched_tokens", 16, 65536, 8192, step=512, key=f"mbt:{KEY}")
    c1, c2 = st.columns(2)
    arrival = c1.radio(
        tr("workloads.arrival", lang),
        ("timestamps", "sequential"),
        format_func=lambda a: tr(f"workloads.arrival_{a}", lang),
        horizontal=True,
        key=f"arrival:{KEY}",
    )
    speedup = c2.number_input(
        tr("workloads.speedup", lang),
        0.01,
        1000.0,
        1.0,
        key=f"speedup:{KEY}",
        disabled=arrival != "timestamps",
    )
    c1, c2 = st.columns(2)
    window = c1.number_input(
        "sliding_window",
        0,
        max(trace.max_model_len, 1),
        0,
        step=256,
        key=f"window:{KEY}",
        help=tr("workloads.sliding_help", lang),
    )
    # the sliding-window layers' block (block_size times this) divides the trace's block too
    multiples = [k for k in SLIDING_MULTIPLES if trace.block_size % (bs * k) == 0] or [1]
    multiple = c2.selectbox(
        "sliding_block_multiple",
        multiples,
        key=f"multiple:{KEY}",
        disabled=not window,
        help=tr("workloads.sliding_multiple_help", lang),
    )
    return Settings(
        int(bs),
        int(blocks),
        int(seqs),
        int(batched),
        arrival,
        float(speedup),
        int(window),
        int(multiple) if window else 1,
    )


def show_figures(run: WorkloadRun, lang: str) -> None:
    r = run.result
    # the infinite-cache figure counts full-attention hits only (workloads/replay.py's
    # upper_bound_hits): not shown for a run with a sliding-window layer
    full_only = run.settings.sliding_window > 0
    cells = (
        (tr("workloads.m_requests", lang), f"{r.requests:,}"),
        (tr("workloads.m_hit_rate", lang), f"{100 * r.hit_rate:.1f}%"),
        (
            tr("workloads.m_upper", lang),
            "—" if full_only else f"{100 * r.upper_bound_hit_rate:.1f}%",
        ),
        (tr("workloads.m_evictions", lang), f"{r.evictions:,}"),
        (tr("workloads.m_preemptions", lang), f"{r.preemptions:,}"),
        (tr("workloads.m_steps", lang), f"{r.steps:,}"),
    )
    for col, (label, value) in zip(st.columns(len(cells)), cells):
        col.metric(label, value)
    st.caption(
        tr(
            "workloads.hits_line",
            lang,
            hits=r.hit_tokens,
            queries=r.queries,
            pre=r.preempted_requests,
            pre_hits=r.preempted_hits,
            pre_queries=r.preempted_queries,
        )
    )
    if full_only:
        st.caption(tr("workloads.full_attention_only", lang))


# The series over time, each with the axis it is drawn against: fractions on the left, request
# counts on the right (the rows of series_rows hold them all).
SERIES = (
    ("usage", "fraction"),
    ("hit_rate", "fraction"),
    ("running", "requests"),
    ("waiting", "requests"),
)
MOMENT = "moment"  # the over-time chart's point selection: a click picks the nearest step
# the over-time chart's points (peaks and troughs kept: TimeSeries.sample): ~2.5 px each across the
# page; the first slice's 755 change points drawn whole held the page's first paint back ~0.5 s
OVER_TIME_POINTS = 400


def over_time_chart(rows: list[dict], lang: str) -> tuple[pd.DataFrame, dict]:
    """The replay's usage, hit rate, running and waiting over its steps as a Vega-Lite layered
    chart (data, spec). The data is series_rows' table as it is, its columns named by the
    series' labels; the lines fold each axis' columns into (series, value) rows. One invisible
    point per step carries the hover (the step and the four values) and the point selection
    ``MOMENT`` (a click on the plot selects the nearest step): one per step, not one per series
    and step, as drawing the points is most of the page's first paint. Vega-Lite, not plotly:
    plotly's 4.7 MB script would hold the whole page back on a first visit."""
    labels = {key: tr(f"workloads.{key}", lang) for key, _ in SERIES}
    data = pd.DataFrame(rows, columns=["step", *labels]).rename(columns=labels)
    x = {"field": "step", "type": "quantitative", "title": tr("workloads.step", lang)}
    color = {
        "field": "series",
        "type": "nominal",
        "scale": {"domain": list(labels.values())},
        "legend": {"orient": "top", "title": None},
    }

    def field(name: str) -> str:
        # a field name escapes Vega-Lite's path characters
        return re.sub(r"([.\[\]\\])", r"\\\1", name)

    def side(axis: str, title: str, y: dict) -> dict:
        names = [labels[key] for key, a in SERIES if a == axis]
        return {
            "transform": [{"fold": [field(n) for n in names], "as": ["series", "value"]}],
            "mark": {"type": "line", "strokeWidth": 1.5},
            "encoding": {
                "x": x,
                "y": {"field": "value", "type": "quantitative", "title": title, **y},
                "color": color,
            },
        }

    fraction = {"scale": {"domain": [0, 1.02]}, "axis": {"orient": "left"}}
    tip = [x] + [
        {
            "field": field(labels[key]),
            "type": "quantitative",
            "title": labels[key],
            "format": ",.3~f" if axis == "fraction" else ",d",
        }
        for key, axis in SERIES
    ]
    picker = {
        "mark": {"type": "point", "opacity": 0, "tooltip": True},
        "encoding": {
            "x": x,
            "y": {
                "field": field(labels["usage"]),
                "type": "quantitative",
                "scale": fraction["scale"],
                "axis": None,
            },
            "tooltip": tip,
        },
        "params": [
            {
                "name": MOMENT,
                "select": {"type": "point", "fields": ["step"], "nearest": True, "on": "click"},
            }
        ],
    }
    requests = {"scale": {"zero": True}, "axis": {"orient": "right"}}
    layers = [
        side("fraction", tr("workloads.fraction", lang), fraction),
        side("requests", tr("workloads.requests_axis", lang), requests),
    ]
    spec = {
        "height": 320,
        "layer": [*layers, picker],
        "resolve": {"scale": {"y": "independent"}},
    }
    return data, spec


def clicked_step(event: Any) -> Optional[int]:
    """The step a click on the over-time chart selected, if any (Streamlit's selection state:
    ``{"selection": {MOMENT: [{"step": n}]}}``)."""
    points = ((event or {}).get("selection") or {}).get(MOMENT) or []
    return int(points[0]["step"]) if points and "step" in points[0] else None


def show_over_time(state: WorkloadsState, lang: str) -> None:
    st.subheader(tr("workloads.over_time", lang))
    st.caption(tr("workloads.over_time_help", lang))
    data, spec = over_time_chart(series_rows(state.run.result, OVER_TIME_POINTS), lang)
    event = st.vega_lite_chart(
        data, spec, key=f"over:{KEY}", on_select="rerun", selection_mode=MOMENT
    )
    step = clicked_step(event)
    if step is not None and st.session_state.get(f"{KEY}:clicked") != step:
        st.session_state[f"{KEY}:clicked"] = step
        st.session_state[f"at:{KEY}"] = step
        open_moment(state, step, lang)


def sweep_chart(
    vllm: list[tuple[int, float]],
    upper: Optional[float],
    curves: list[tuple[str, list[tuple[int, float]]]],
    lang: str,
) -> tuple[pd.DataFrame, dict]:
    """Hit rate against pool size (data, spec): vLLM's curve, a dotted curve per other design
    (``curves``: name and points, designs_page.design_curves) and the trace's upper bound as a
    dashed rule (none where ``upper`` is None); the x axis is logarithmic, as the swept sizes
    are."""
    vllm_name = tr("workloads.hit_rate", lang)
    data = pd.DataFrame(
        [
            {"num_gpu_blocks": n, "hit_rate": h, "design": name, "vllm": name == vllm_name}
            for name, pts in [(vllm_name, vllm), *curves]
            for n, h in pts
        ]
    )
    upper_name = tr("workloads.m_upper", lang)
    hit = tr("workloads.hit_rate", lang)
    x = {"field": "num_gpu_blocks", "type": "quantitative", "scale": {"type": "log"}}
    layers = [
        {
            "mark": {"type": "line", "point": True, "tooltip": True},
            "encoding": {
                "x": {**x, "title": "num_gpu_blocks"},
                "y": {
                    "field": "hit_rate",
                    "type": "quantitative",
                    "title": hit,
                    "scale": {"domain": [0, 1.02]},
                },
                "color": {
                    "field": "design",
                    "type": "nominal",
                    "scale": {"domain": [vllm_name] + [name for name, _ in curves]},
                    "legend": {"orient": "top", "title": None},
                },
                "strokeDash": {
                    "field": "vllm",
                    "type": "nominal",
                    "scale": {"domain": [True, False], "range": [[1, 0], [2, 2]]},
                    "legend": None,
                },
            },
        }
    ]
    if upper is not None:
        layers.append(
            {
                "data": {"values": [{"upper": upper, "label": upper_name}]},
                "layer": [
                    {
                        "mark": {"type": "rule", "strokeDash": [6, 4], "tooltip": True},
                        "encoding": {"y": {"field": "upper", "type": "quantitative"}},
                    },
                    {
                        "mark": {"type": "text", "align": "right", "dy": -6, "x": "width"},
                        "encoding": {
                            "y": {"field": "upper", "type": "quantitative"},
                            "text": {"field": "label"},
                        },
                    },
                ],
            }
        )
    spec = {"height": 300, "layer": layers}
    return data, spec


def show_sweep(state: WorkloadsState, lang: str) -> None:
    st.subheader(tr("workloads.sweep", lang))
    run = state.run
    vals = sweep_values(state.trace, run.settings, page_trace_limits())
    if st.button(
        tr("workloads.sweep_button", lang, values=", ".join(f"{v:,}" for v in vals)),
        key=f"sweep:{KEY}",
    ):
        with st.spinner(tr("workloads.replaying", lang)):
            sweep_now(state, lang)
    if not state.sweep:
        return
    from paged_kv_lab.ui.designs_page import design_curves  # SGLang's and nano-vllm's, asked for

    curves = design_curves(state.trace, run.settings, [n for n, _ in state.sweep], lang)
    upper = None if run.settings.sliding_window else run.result.upper_bound_hit_rate
    data, spec = sweep_chart(state.sweep, upper, curves, lang)
    st.vega_lite_chart(data, spec, key=f"sweepchart:{KEY}")
    if state.sweep_errors:
        st.caption(tr("workloads.sweep_skipped", lang, points="; ".join(state.sweep_errors)))
    u = state.unbounded
    if u is not None and u.hit_rate is not None:
        st.markdown(
            tr(
                "workloads.unbounded",
                lang,
                rate=f"{100 * u.hit_rate:.1f}",
                blocks=f"{u.smallest_num_gpu_blocks:,}" if u.smallest_num_gpu_blocks else "?",
                exact=tr("workloads.exact", lang) if u.exact else u.why,
            )
        )
    elif state.unbounded_why:
        st.caption(tr("workloads.unbounded_not", lang, why=state.unbounded_why))


@st.fragment
def show_moment(state: WorkloadsState, lang: str) -> None:
    """The section that steps into a moment, and the player: a fragment, so that a click there
    reruns only this part of the page (the figures and charts above it are not sent again). A
    moment opened here is a burst of allocation (a checkpoint unpickled, steps recorded, the
    frames encoded and sent): the garbage collector waits for its end (``collector_paused``)."""
    with collector_paused():
        complete_window(state, lang)
        show_step_into(state, lang)
        if state.window is not None:
            pool_player(state, lang)
        else:
            # the player mounted empty (hidden until it has a step: pool.css), so the browser
            # loads its script and builds it before the first moment, not after that click
            mount_pool(data={"run": None})


def mount_pool(data: dict) -> None:
    pool_component()(
        key=f"pool:{KEY}", data=data, default={"have": None}, on_have_change=_noop, height="content"
    )


def show_step_into(state: WorkloadsState, lang: str) -> None:
    st.subheader(tr("workloads.step_into", lang))
    run = state.run
    c1, c2, c3 = st.columns([1, 1, 1], vertical_alignment="bottom")
    st.session_state.setdefault(f"at:{KEY}", max(1, run.result.steps // 2))
    at = c1.number_input(
        tr("workloads.at_step", lang, steps=run.result.steps),
        1,
        max(1, run.result.steps),
        key=f"at:{KEY}",
    )
    opened = c1.button(tr("workloads.open_here", lang), key=f"open:{KEY}")
    if opened:
        open_moment(state, int(at), lang)
    ids = [p.request_id for p in run.result.per_request if p.admitted_step >= 0]
    rid = c2.selectbox(tr("workloads.pick_request", lang), ids, key=f"req:{KEY}")
    if c2.button(tr("workloads.open_request", lang), key=f"openreq:{KEY}") and rid is not None:
        step = admission_step(run, rid) or 1
        open_moment(state, step, lang, request=rid)
    elif not opened:
        # the step entered (or the picked request's admission, when it changed) is opened next
        picked = st.session_state.get(f"{KEY}:picked")
        st.session_state[f"{KEY}:picked"] = rid
        if rid is not None and picked is not None and rid != picked:
            glimpse_ahead(state, admission_step(run, rid) or 1)
        elif f"{KEY}:ahead" in st.session_state:
            glimpse_ahead(state, int(at))
        else:  # the page's first drawing: nothing asked yet, the default step is not recorded
            st.session_state[f"{KEY}:ahead"] = int(at)
    if state.error:  # the page's top is not drawn again in this fragment's rerun
        st.error(state.error)
        state.error = None
    if state.window is not None:
        w = state.window
        c3.caption(tr("workloads.window", lang, first=w.frames[0].step, last=w.frames[-1].step))


def why_panel(state: WorkloadsState, lang: str) -> None:
    """Why? on the replay: a request's hit against its shared blocks (words/explain_replay.py)."""
    run = state.run
    if not st.toggle(tr("why.title", lang), key=f"why_open:{KEY}"):
        return
    if run.settings.sliding_window:  # its answers follow full-attention hits only
        st.caption(tr("workloads.full_attention_only", lang))
        return
    with st.container(border=True):
        ids = [p.request_id for p in run.result.per_request if p.admitted_step >= 0]
        default = st.session_state.get(f"req:{KEY}")
        rid = st.selectbox(
            tr("why.pick_request", lang),
            ids,
            index=ids.index(default) if default in ids else 0,
            key=f"why_req:{KEY}",
        )
        if rid is None:
            return
        tr_req = state.trace.requests[int(rid)]
        for x in run.explain(rid):
            for line in replay_hit_sentences(x, lang, state.trace.block_size, tr_req.hash_ids):
                st.markdown(md_escape(line))


def show_requests(run: WorkloadRun, lang: str) -> None:
    # the table is sent when the expander is opened: a closed one would still make the browser
    # load and draw a data grid before the page shows
    box = st.expander(tr("workloads.per_request", lang), key=f"reqs_open:{KEY}", on_change="rerun")
    if box.open:
        box.dataframe(
            pd.DataFrame([p.__dict__ for p in run.result.per_request]),
            hide_index=True,
            width="stretch",
            key=f"reqtable:{KEY}",
        )
