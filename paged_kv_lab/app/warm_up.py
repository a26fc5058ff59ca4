"""The server's warm-up: once a model is loaded, one background thread computes what the pages
show, so that a first visit finds it ready instead of computing it in the page's script.

In order: the page modules are imported (plotly, pandas and the player's assets load once); every
lesson's and case's run (and each case's fixed twin) is opened in the run store and asked for to
its end as background work (the store keeps any session's clicks first); the shipped trace's first
slice is replayed for Real workloads; the topic pages' studies are measured (each holds the engine
lock for its whole run, so they come last). A page that is visited before its part is ready shows
a note that fills in (app/shared.py: ``ready_or_placeholder``), or, for a run, plays the steps
recorded so far.

Once per model, device and dtype per server process. ``PAGED_KV_LAB_WARM_UP=0`` turns it off
(the pages then compute on first need, behind the same notes).
"""

from __future__ import annotations

import importlib
import os

from paged_kv_lab.app.shared import Shared

ENV = "PAGED_KV_LAB_WARM_UP"
CASE_WAIT_S = 600.0  # how long the warm-up waits for the cases' runs before the topic studies
PAGE_MODULES = (
    "paged_kv_lab.app.casebook_page",
    "paged_kv_lab.app.designs_page",
    "paged_kv_lab.app.live_page",
    "paged_kv_lab.app.topic_pages",
    "paged_kv_lab.app.trace_page",
    "paged_kv_lab.app.workloads_page",
)
WARM_UPS: Shared[None] = Shared("warm-up")


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip() not in ("0", "false", "no", "off")


def start_warm_up(ms) -> None:
    """Start the warm-up for the loaded model ``ms`` (a ModelState) unless it ran or runs."""
    if ms.model is None or not enabled():
        return
    from paged_kv_lab.app.state import model_key

    WARM_UPS.start(model_key(ms), lambda: warm_up(ms))


def record_ahead(lessons, ms, wait_s: float = CASE_WAIT_S) -> None:
    """Open each lesson's run as a first visit would (its scenario, no overrides), ask the store
    for every step as background work, then wait up to ``wait_s`` s for each to end. A scenario
    the store refuses is skipped: its page says why."""
    from paged_kv_lab.app.state import build_scenario, open_run

    held = []  # the cursors hold the runs: the store stops computing a run nobody holds
    for lesson in lessons:
        try:
            timeline = open_run(build_scenario(lesson, lesson.scenario, {}, ms), ms)
        except Exception:  # over the budget or refused by the engine: the page tells
            continue
        timeline.run.want(1 << 30)
        held.append(timeline)
    for timeline in held:
        timeline.run.wait(1 << 30, wait_s, urgent=False)


def warm_up(ms) -> None:
    for name in PAGE_MODULES:
        importlib.import_module(name)
    from paged_kv_lab.app.casebook_page import case_lessons
    from paged_kv_lab.app.topic_pages import prepare_studies
    from paged_kv_lab.app.workloads_page import prepare_first_slice
    from paged_kv_lab.lesson import BY_ID
    from paged_kv_lab.lesson.casebook import CASES

    record_ahead(list(BY_ID.values()) + [x for c in CASES for x in case_lessons(c)], ms)
    prepare_first_slice()
    prepare_studies(ms.model)
