"""The server's warm-up: once a model is loaded, one background thread computes what the pages
show, so that a first visit finds it ready instead of computing it in the page's script.

In order: the page modules are imported (plotly, pandas and the player's assets load once); every
case's run (and its fixed twin) and every lesson's is opened in the run store and asked for to its
end as background work (the store's worker records them, keeping any session's clicks first);
meanwhile the shipped trace's first slice is replayed for Real workloads and the topic pages'
studies are measured. The sidebar says whether it is under way or done (``warm_up_line``). A page
visited before its part is ready shows a note that fills in (store/server_cache.py:
``ready_or_placeholder``), or, for a run, plays the steps recorded so far.

It yields to visitors: while some session draws a page, it waits at its next ``stop_point`` and
the store computes no step ahead (store/server_cache.py: ``VISITORS``; docs/class-server.md).

Once per model, device and dtype per server process. ``PAGED_KV_LAB_WARM_UP=0`` turns it off
(the pages then compute on first need, behind the same notes). At interpreter exit it ends at its
next ``stop_point`` (store/server_cache.py: between two parts, never inside a model step) and the
exit
waits for it.
"""

from __future__ import annotations

import importlib
import os
import time

from paged_kv_lab.store.server_cache import (
    Shared,
    stop_point,
    yielding,
)

ENV = "PAGED_KV_LAB_WARM_UP"
RUN_WAIT_S = 600.0  # how long the warm-up holds a run it opened for the run to end
WAIT_SLICE_S = 0.5  # how often a wait for a run looks whether the process is exiting
PAGE_MODULES = (
    "paged_kv_lab.ui.casebook_page",
    "paged_kv_lab.ui.designs_page",
    "paged_kv_lab.ui.fleet_page",
    "paged_kv_lab.ui.live_page",
    "paged_kv_lab.ui.topic_pages",
    "paged_kv_lab.ui.trace_page",
    "paged_kv_lab.ui.workloads_page",
)
# (model, device, dtype) -> None once the warm-up ran: pinned in the server's one cache (a few
# bytes, never evicted below its hard limit), so the warm-up runs once per model per process
WARM_UPS: Shared[None] = Shared("warm-up", pinned=True)


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


def start_warm_up(ms) -> None:
    """Start the warm-up for the loaded model ``ms`` (a ModelState) unless it ran or runs."""
    if ms.model is None or not enabled():
        return
    from paged_kv_lab.ui.state import model_key

    WARM_UPS.start(model_key(ms), lambda: warm_up(ms))


def open_ahead(lessons, ms) -> list:
    """Open each lesson's run as a first visit would (its scenario, no overrides) and ask the
    store for every step as background work; the cursors returned hold the runs (the store stops
    computing a run nobody holds). A scenario the store refuses is skipped: its page says why."""
    from paged_kv_lab.ui.modelstate import played_model_state
    from paged_kv_lab.ui.state import build_scenario, open_run

    held = []
    for lesson in lessons:
        stop_point()
        lms = played_model_state(lesson, ms)  # a lesson's own model (hybrid), as its page has it
        try:
            timeline = open_run(build_scenario(lesson, lesson.scenario, {}, lms), lms)
        except Exception:  # over the budget or refused by the engine: the page tells
            continue
        timeline.run.want(1 << 30)
        held.append(timeline)
    return held


def record_ahead(lessons, ms, wait_s: float = RUN_WAIT_S) -> None:
    """``open_ahead``, then wait up to ``wait_s`` s for each run to end."""
    for timeline in open_ahead(lessons, ms):
        wait_to_end(timeline.run, wait_s)


def wait_to_end(run, wait_s: float) -> None:
    """Wait up to ``wait_s`` s for ``run`` (a RecordedRun) to end, in slices: Stopping when the
    process exits meanwhile."""
    if run._store is None:  # no store computes it: it will not change
        return
    deadline = time.monotonic() + wait_s
    while not run.done and time.monotonic() < deadline:
        stop_point()
        run.wait(1 << 30, min(WAIT_SLICE_S, max(0.0, deadline - time.monotonic())), urgent=False)


def warm_up(ms) -> None:
    """The cases' runs first (their page waits for their ends), then the lessons' (a lesson page
    needs only its first steps, which a visit asks for first anyway); while the store's worker
    records them, this thread replays the first slice and then measures the studies (each
    holding the engine lock, which the worker takes one step at a time).

    It yields to visitors: while some session draws a page, this thread waits at its next
    ``stop_point`` (between two parts, never holding the engine lock) and the store's worker
    computes no step ahead (store/server_cache.py: ``VISITORS``), so a page opened meanwhile has
    the two cores and the GIL to itself. It keeps the normal OS priority: its studies hold the
    engine lock, which a visitor's page and the run store's worker wait for (at a low priority,
    on a loaded machine, a study held it for minutes and the exit waited past its bound)."""
    with yielding():
        _warm_up(ms)


def _warm_up(ms) -> None:
    for name in PAGE_MODULES:
        stop_point()
        importlib.import_module(name)
    from paged_kv_lab.content import lessons
    from paged_kv_lab.content.casebook import cases as all_cases
    from paged_kv_lab.ui.casebook_page import case_lessons
    from paged_kv_lab.ui.topic_pages import prepare_studies
    from paged_kv_lab.ui.workloads_page import prepare_first_slice

    cases = [x for c in all_cases() for x in case_lessons(c)]
    held = open_ahead(cases + list(lessons().by_id.values()), ms)
    stop_point()
    prepare_first_slice()
    prepare_studies(ms.model)
    for timeline in held:
        wait_to_end(timeline.run, RUN_WAIT_S)


def warm_up_line(ms, lang: str) -> None:
    """The sidebar's line about the warm-up: under way (it looks again every POLL_S s, so it
    changes by itself when the warm-up ends) or done. Nothing when there is none."""
    import streamlit as st

    from paged_kv_lab.text.i18n import tr
    from paged_kv_lab.ui.state import model_key
    from paged_kv_lab.ui.widgets import POLL_S

    if ms.model is None or not enabled():
        return
    key = model_key(ms)

    def line() -> None:
        done = WARM_UPS.ready(key)
        st.caption(tr("page.warm_up.done", lang) if done else tr("page.warm_up.running", lang))

    st.fragment(run_every=None if WARM_UPS.ready(key) else POLL_S)(line)()
