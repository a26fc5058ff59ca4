"""The step player mounted in a page: one function, ``player_panel``, for lessons, the playground
and the trace viewer.

The browser holds the recorded steps and steps them itself (player/assets/player.js). Python
streams it only the steps it does not have yet, tells it where to hold for a quiz question and
where to jump (a link's step, a quiz answer), and hears back four state values:
``cursor`` (where the learner is, debounced), ``want`` (Step at the frontier: compute up to here),
``poll`` (the run is still being recorded: send what is new; the browser asks every 0.5 s while its
tab is visible, so the page itself never polls) and ``have`` (the browser lost its copy: send again
from here); all but ``have`` also carry ``n``, the number of steps the browser holds. Invariant kept
by ``PlayerSession``: ``acked`` is the number of steps of ``token``'s run the browser said it holds
(-1: not even the head), and every render sends the head (while ``acked`` < 0) and all steps from
``acked`` on. Streamlit hands the component only the latest render's data, so a render that says
"the same as before, plus step k" may never be seen; sending from what the browser confirmed makes
each render complete by itself.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import streamlit as st

import paged_kv_lab.player as player_pkg
from paged_kv_lab.content.quiz import make_prediction
from paged_kv_lab.player import RunEncoder, player_book, run_payload, static_html
from paged_kv_lab.player.export import asset, module_js
from paged_kv_lab.store.timeline import Timeline
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui import class_panel as classroom
from paged_kv_lab.ui.state import PageState

COMPONENT = "paged_kv_lab.player"
_LOG = logging.getLogger(__name__)
_PLAYERS: dict[int, Any] = {}  # id(component manager) -> the mounted component's callable


def player_component():
    """The player component. Under a running server, player/assets is declared as the component's
    asset_dir (once per server process), so the browser loads player.js / player.css by URL, cached,
    instead of receiving them inline in every rerun. Streamlit 1.67 finds asset_dir only in the
    pyproject.toml of an installed package, which neither this repo's editable install nor the wheel
    exposes; its component manager takes the same manifest directly. Without a running server (bare
    mode) each call gets a fresh manager, so the assets go inline there.

    The manager is Streamlit's private API (pyproject.toml bounds streamlit for it). Where it has
    moved or changed, the assets go inline as in bare mode: the player still shows, each rerun
    only carries its assets again; the server's log says why, once."""
    try:
        from streamlit.runtime import Runtime

        served = Runtime.exists()
    except ImportError as e:
        _private_api_moved(f"{type(e).__name__}: {e}")
        served = False
    if not served:
        return _inline_component()
    try:
        return _served_component()
    except _PRIVATE_API_MOVED as e:
        _private_api_moved(f"{type(e).__name__}: {e}")
        return _inline_component()


def _inline_component():
    return st.components.v2.component(
        COMPONENT, html=asset("player.html"), css=asset("player.css"), js=module_js()
    )


def _served_component():
    """The component whose assets the server serves from player/assets (private API)."""
    from streamlit.components.v2.get_bidi_component_manager import get_bidi_component_manager

    manager = get_bidi_component_manager()
    component = _PLAYERS.get(id(manager))
    if component is None or manager.get_component_asset_root(COMPONENT) is None:
        from streamlit.components.v2.manifest_scanner import ComponentConfig, ComponentManifest

        manager.register_from_manifest(
            ComponentManifest(
                name="paged_kv_lab", version="1", components=[ComponentConfig("player", "assets")]
            ),
            Path(player_pkg.__file__).resolve().parent,
        )
        component = _PLAYERS[id(manager)] = st.components.v2.component(
            COMPONENT, html=asset("player.html"), css="player.css", js="player.js"
        )
    return component


# what a moved or reshaped private module, function or signature raises
_PRIVATE_API_MOVED = (ImportError, AttributeError, TypeError)


@functools.cache  # each distinct error is logged once per process
def _private_api_moved(error: str) -> None:
    _LOG.warning(
        "Streamlit's component manager is not where this app expects it (%s); "
        "the step player's assets are sent inline instead",
        error,
    )


UNTIL_KINDS = ("cache_hit", "evicted", "preempted", "window_skipped", "allocated", "finished")
# offered in "run until" only where a lesson focuses on them (hashes finer than the block)
FOCUS_ONLY_KINDS = ("copied", "cached_partial")
_seq = itertools.count(1)


@dataclass
class PlayerSession:
    run: Any = None  # the Timeline the browser was last sent (identity)
    lang: str = ""
    decoded: bool = False
    token: str = ""  # the browser's name for that run
    encoder: RunEncoder | None = None
    acked: int = -1
    goto: dict | None = None  # {"seq", "step"}: the last jump Python asked for
    answered: set[int] = field(default_factory=set)  # steps whose quiz question was answered
    last_have: Any = None
    last_cursor: Any = None  # the last cursor report applied (a stale one is not applied again)
    last_want: Any = None
    last_poll: Any = None


def session(key: str) -> PlayerSession:
    return st.session_state.setdefault(f"player:{key}", PlayerSession())


def request_goto(key: str, step: int) -> None:
    """Make the browser show ``step`` on its next render (and move the Python cursor now)."""
    session(key).goto = {"seq": next(_seq), "step": int(step)}


def page_fragment(func: Callable, page: str) -> Callable:
    """``func`` as a Streamlit fragment whose id is this page's own. Streamlit names a fragment by
    its function and position, so every lesson page's stage had one id; a player on the page being
    left could still report (its cursor, a poll) while the next page loads, and Streamlit then reran
    the new page's fragment as if it were the old one's, its elements at paths the browser had just
    cleared (the browser's page crashed: "Bad delta path index"). With one id per page the stale
    report names no fragment on the new page and is dropped."""

    @functools.wraps(func)
    def stage(*args, **kwargs):
        return func(*args, **kwargs)

    stage.__qualname__ = f"{func.__qualname__}[{page}]"
    return st.fragment(stage)


def recorded_done(run: Timeline) -> bool:
    return bool(run.run.done)


def record_upto(run: Timeline, n: int, seconds: float = 1.0) -> None:
    """Ask the run store for ``n`` records and wait for them at most ``seconds``; the cursor
    stays."""
    if len(run.records) < n and not run.run.done:
        run.run.want(n)
        run.run.wait(n, seconds)


_ENCODERS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_ENCODERS_LOCK = threading.Lock()


def shared_encoder(run: Timeline, lang: str, page: str, **encoder_kw) -> RunEncoder:
    """The encoder of this recorded run for this language and page (its narration), shared by
    every session that plays it, so a step is encoded once per server process; it goes with the
    run."""
    with _ENCODERS_LOCK:
        per_run = _ENCODERS.setdefault(run.run, {})
        # a trace may be viewed without its model
        key = (lang, page, encoder_kw.get("decode") is not None)
        enc = per_run.get(key)
        if enc is None:
            first = run.records[0] if run.initial is None else None
            enc = per_run[key] = RunEncoder(
                run.initial, lang=lang, first_record=first, **encoder_kw
            )
        return enc


def next_hold(
    run: Timeline, cursor: int, answered: set[int], focus: Sequence[str], lang: str, look: int = 8
) -> tuple[int | None, Any]:
    """Quiz mode: the first step at or after ``cursor`` whose next step has an unanswered
    question."""
    for h in range(cursor, cursor + look):
        if h + 1 in answered:
            continue
        record_upto(run, h + 1)
        if len(run.records) <= h:
            return None, None
        snap = run.initial if h == 0 else run.records[h - 1].snapshot
        pred = make_prediction(snap, run.records[h], lang, tuple(focus))
        if pred is not None:
            return h, pred
    return None, None


def _int(v: Any, default: int = 0) -> int:
    """A step number from the browser; anything else (a hostile or broken client) counts as
    ``default``."""
    return v if isinstance(v, int) and not isinstance(v, bool) and abs(v) < 1 << 31 else default


def _component_state(key: str) -> dict:
    value = st.session_state.get(f"pkv:{key}")
    try:
        return dict(value) if value is not None else {}
    except (TypeError, ValueError):
        return {}


def player_panel(
    state: PageState,
    key: str,
    lang: str,
    *,
    decode=None,
    narrate: Callable | None = None,
    intro: str = "",
    outro: str = "",
    focus: Sequence[str] = (),
    request_ids: Sequence[str] = (),
    url_step: bool = False,
    meta: dict | None = None,
    room: dict | None = None,
    teach: bool = True,
    class_questions: Sequence = (),
) -> None:
    """Mount the player for ``state.run`` and keep ``state.run.cursor`` where the browser is.
    ``url_step``: the browser keeps the link's ``step`` parameter at the player's step; ``meta``:
    more for the head (the panels under the player and their words, ui/panels.py). ``teach``: a
    "Teach this" panel under the player (ui/class_panel.py), whose room the player then leads;
    ``room``: the room a student's player follows (the "Join a class" page);
    ``class_questions``: a lesson's questions prepared for a class."""
    run = state.run
    teaching = classroom.teaching(key) if teach else None
    if teach:
        room = classroom.room_cfg(teaching, run.run, lang)
    ps = session(key)
    if ps.run is not run or ps.lang != lang or ps.decoded != (decode is not None):
        ps.run, ps.lang, ps.token, ps.decoded = run, lang, uuid.uuid4().hex[:12], decode is not None
        ps.encoder = shared_encoder(
            run,
            lang,
            key,
            decode=decode,
            narrate=narrate,
            request_ids=request_ids,
            meta={**player_meta(intro, outro, focus), **(meta or {})},
        )
        ps.acked, ps.answered = -1, set()
        ps.goto = {"seq": next(_seq), "step": run.cursor}
    got = _component_state(key)
    encoded = len(ps.encoder.steps)
    cursor = got.get("cursor")
    if isinstance(cursor, dict) and cursor.get("run") == ps.token and cursor != ps.last_cursor:
        ps.last_cursor = cursor
        ps.acked = max(ps.acked, min(_int(cursor.get("n"), -1), encoded))
        if ps.goto is None:
            run.cursor = max(run.first, min(_int(cursor.get("step"), run.cursor), len(run.records)))
    want = got.get("want")
    if isinstance(want, dict) and want.get("run") == ps.token and want != ps.last_want:
        ps.last_want = want
        ps.acked = max(ps.acked, min(_int(want.get("n"), -1), encoded))
        record_upto(run, min(_int(want.get("step")), len(run.records) + 1))
    poll = got.get("poll")
    if isinstance(poll, dict) and poll.get("run") == ps.token and poll != ps.last_poll:
        ps.last_poll = poll
        ps.acked = max(ps.acked, min(_int(poll.get("n"), -1), encoded))
    have = got.get("have")
    if isinstance(have, dict) and have.get("run") == ps.token and have != ps.last_have:
        ps.last_have = have
        # the browser lost its copy (or part of it)
        ps.acked = min(_int(have.get("n"), -1), encoded)
    if ps.goto is not None:
        record_upto(run, ps.goto["step"])
        run.cursor = max(run.first, min(ps.goto["step"], len(run.records)))

    hold_at = None
    if st.session_state.get(f"quiz:{key}"):
        hold_at, pred = next_hold(run, run.cursor, ps.answered, focus, lang)
        if hold_at is not None and hold_at == run.cursor:
            if state.quiz is None or state.quiz != pred:
                state.quiz, state.quiz_choice = pred, None
        else:
            state.quiz = None
    else:
        state.quiz = None

    done = recorded_done(run)
    steps = ps.encoder.extend(run.records)
    base = max(ps.acked, 0)
    data = {
        "run": ps.token,
        "base": base,
        "head": ps.encoder.head if ps.acked < 0 else None,
        "steps": steps[base:],
        "done": done and len(steps) + run.first == len(run.records),
        "hold_at": hold_at,
        "goto": ps.goto,
        "url_step": url_step,
        "room": room,
    }
    if data["done"] and step_cap(run) is not None:  # only a capped run: the rest stay identical
        data["stop"] = {"steps": step_cap(run)}
    if ps.acked < 0:  # with the head: the wire keys and the player's words (never inside the run)
        data.update(player_book(lang))
    player_component()(
        key=f"pkv:{key}",
        data=data,
        default={"cursor": None, "want": None, "have": None, "poll": None},
        on_cursor_change=_noop,
        on_want_change=_noop,
        on_have_change=_noop,
        on_poll_change=_noop,
        height="content",
    )
    ps.goto = None
    quiz_box(state, key, lang)
    if teach:
        player_kw = {
            "decode": decode,
            "narrate": narrate,
            "intro": intro,
            "outro": outro,
            "focus": focus,
            "request_ids": request_ids,
            "meta": meta,
        }
        classroom.teach_panel(state, key, lang, teaching, player_kw, class_questions)


def _noop() -> None:
    pass


def on_quiz_answer(state: PageState, key: str) -> None:
    choice = st.session_state.get(key)
    if state.quiz is not None and choice is not None:
        state.quiz_choice = list(state.quiz.options).index(choice)


def on_quiz_reveal(state: PageState, key: str) -> None:
    """Answered (or skipped): release the hold and show the step the question was about."""
    ps = session(key)
    step = state.run.cursor + 1
    ps.answered.add(step)
    state.quiz, state.quiz_choice = None, None
    request_goto(key, step)


def quiz_box(state: PageState, k: str, lang: str) -> None:
    q = state.quiz
    if q is None:
        return
    with st.container(border=True):
        st.markdown(f"#### 🎓 {tr('quiz_title', lang)}")
        key = f"quiz_choice:{k}"
        st.radio(q.prompt, list(q.options), index=None, key=key, horizontal=True)
        c1, c2, c3 = st.columns(3)
        c1.button(
            tr("quiz_answer", lang),
            key=f"quiz_ans:{k}",
            on_click=on_quiz_answer,
            args=(state, key),
            disabled=state.quiz_choice is not None,
        )
        c2.button(
            tr("quiz_reveal", lang),
            key=f"quiz_rev:{k}",
            on_click=on_quiz_reveal,
            args=(state, k),
            type="primary",
        )
        c3.button(
            tr("quiz_skip", lang), key=f"quiz_skip:{k}", on_click=on_quiz_reveal, args=(state, k)
        )
        if state.quiz_choice is not None:
            if state.quiz_choice == q.answer:
                st.success(f"{tr('quiz_right', lang)} {q.explain}")
            else:
                st.error(f"{tr('quiz_wrong', lang, answer=q.options[q.answer])} {q.explain}")


def step_cap(run: Timeline) -> int | None:
    """The step cap (PAGED_KV_LAB_MAX_RUN_STEPS) ``run`` stopped at with requests unfinished."""
    return getattr(run.run, "capped_at", None)


def step_cap_note(run: Timeline, lang: str) -> None:
    """On the page, under the player: why a capped run ends with requests unfinished."""
    if step_cap(run) is not None and recorded_done(run):
        st.warning(tr("player.step_cap", lang, steps=step_cap(run)))


def player_meta(intro: str = "", outro: str = "", focus: Sequence[str] = ()) -> dict:
    """The page's words for the player: intro (step 0), outro (the end), Run-until kinds (focus
    first)."""
    return {
        "intro": intro,
        "outro": outro,
        "until_kinds": list(
            dict.fromkeys(
                [*(k for k in focus if k in UNTIL_KINDS + FOCUS_ONLY_KINDS), *UNTIL_KINDS]
            )
        ),
    }


def export_html(
    run: Timeline,
    lang: str,
    title: str,
    *,
    intro: str = "",
    outro: str = "",
    focus: Sequence[str] = (),
    meta: dict | None = None,
    back: tuple[str, str] | None = None,
    **encoder_kw,
) -> str:
    """The recorded run (all steps recorded so far) as one self-contained HTML file (``back``: a
    link above the player, as static_html takes it)."""
    records = list(run.records)
    done = recorded_done(run) and len(records) == len(run.records)
    payload = run_payload(
        run.initial,
        records,
        done=done,
        lang=lang,
        meta={**player_meta(intro, outro, focus), **(meta or {})},
        **encoder_kw,
    )
    if done and step_cap(run) is not None:
        payload["stop"] = {"steps": step_cap(run)}
    return static_html(payload, title=title, back=back)
