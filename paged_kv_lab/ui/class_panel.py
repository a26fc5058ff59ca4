"""A class follows the teacher (docs/classroom.md): "Teach this" beside every player, the "Join a
class" page, and questions to the class about the next step.

The rooms themselves and their protocol are classroom/rooms.py (one room server per process, on its
own port); here is only what a Streamlit page needs: making a room for the run a player shows,
the teacher's panel (the student link, its QR code and short code, the question to ask), and the
student's page, which mounts the same recorded run in a player that follows the room.

A session teaches at most one room at a time (``TEACHING`` in its state); the teacher's secret
lives in that state and in the teacher's URL (``teach``), never on a student's screen.
"""

from __future__ import annotations

import io
import logging
import socket
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence
from urllib.parse import quote, urlsplit

import streamlit as st

from paged_kv_lab.classroom.rooms import Poll, PollText, clean_code, clean_name, room_server
from paged_kv_lab.content.quiz import Question, class_questions
from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.run.budget import BudgetError
from paged_kv_lab.store.recorded_run import RecordedRun
from paged_kv_lab.text.i18n import Text, languages, tr

TEACHING = "_room_teaching"  # session state: {"code", "secret", "key"} of the room taught
JOIN_SLUG = "join_a_class"
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoomRun:
    """What a room is bound to: the recorded run a player showed and what that player was given
    besides the run (its words are the teacher's language: a student sees the run as the teacher
    does; the room's own words are each member's)."""

    run: RecordedRun
    key: str
    lang: str
    player_kw: dict = field(default_factory=dict)
    questions: tuple = ()  # a lesson's prepared questions (lesson.catalog.PreparedQuestion)


@dataclass(frozen=True)
class PoolRoomRun:
    """A room bound to a replayed moment of Real workloads: the large-pool player's window
    (``payload``: every frame, pool_payload; ``token``: the window's name). A room step is a
    frame's index in the window; no questions (the window keeps frames, not step records)."""

    payload: dict
    token: str
    key: str
    lang: str
    run: None = None


def _server():
    return room_server(st.get_option("server.address") or None)


# -- questions ------------------------------------------------------------------------------
def _poll(qid: str, q: Question, step: int) -> Poll:
    texts = {}
    for lang in languages():
        p = q.render(lang)
        texts[lang] = PollText(p.prompt, p.options, p.explain)
    blocks = tuple(
        o.fields.get("block") if isinstance(o, Text) and o.key == "quiz.option.block" else None
        for o in q.options
    )
    return Poll(step, qid, q.answer, texts, blocks if any(b is not None for b in blocks) else ())


def polls_at(snap: Snapshot, rec: StepRecord, step: int) -> dict[str, Poll]:
    """Every question the class can be asked about step ``step`` (recorded as ``rec``; ``snap``
    the state before it), by question id (lesson/quiz.py): the answer is what the engine did."""
    out = {}
    for qid, ask in class_questions().items():
        q = ask(snap, rec)
        if q is not None:
            out[qid] = _poll(qid, q, step)
    return out


# -- the teacher ----------------------------------------------------------------------------
def teaching(key: str) -> Optional[dict]:
    """The room this session teaches from the player ``key`` (restored from the URL's ``teach``
    after a reload), or None. Starts no room server where no room was made."""
    t = st.session_state.get(TEACHING)
    if t is None and st.query_params.get("teach"):
        code, _, secret = str(st.query_params.get("teach", "")).partition(".")
        if code and secret:
            room = _server().call(_server().hub.teacher_room, code, secret)
            if room is not None and room.binding.key == key:
                t = st.session_state[TEACHING] = {"code": room.code, "secret": secret, "key": key}
    if t is None or t["key"] != key:
        return None
    room = _server().call(_server().hub.teacher_room, t["code"], t["secret"])
    if room is None:  # expired
        st.session_state.pop(TEACHING, None)
        return None
    return {**t, "room": room}


def teach_param() -> dict[str, str]:
    """The teacher's URL parameter while this session teaches (a page writing its URL keeps it)."""
    t = st.session_state.get(TEACHING)
    return {"teach": f"{t['code']}.{t['secret']}"} if t else {}


def _bound_to(room, run: Any) -> bool:
    b = room.binding
    return b.token == run if isinstance(b, PoolRoomRun) else b.run is run


def room_cfg(t: Optional[dict], run: Any, lang: str) -> Optional[dict]:
    """The player's room settings for the teacher (None while the player shows another run than
    the room's, a RecordedRun or a pool window's token: the class keeps the room's run)."""
    if t is None or not _bound_to(t["room"], run):
        return None
    return {
        "port": _server().port,
        "code": t["code"],
        "role": "teacher",
        "secret": t["secret"],
        "lang": lang,
    }


def _start(binding: RoomRun | PoolRoomRun, step: int, lang: str) -> None:
    server = _server()
    try:
        room = server.call(server.hub.create, binding, step)
    except BudgetError as e:
        st.session_state["_room_error"] = tr(e.text, lang)
        return
    st.session_state[TEACHING] = {"code": room.code, "secret": room.secret, "key": binding.key}
    st.query_params.update(teach_param())  # a reload of this page teaches on


def _end(t: dict) -> None:
    server = _server()
    server.call(server.hub.end, t["code"], t["secret"])
    st.session_state.pop(TEACHING, None)
    st.query_params.pop("teach", None)


def polls_after(run, step: int) -> dict[str, Poll]:
    """The questions about step ``step + 1`` of ``run`` (a Timeline), once it is recorded (waits
    a second at most); none where it is not."""
    from paged_kv_lab.ui.player_component import record_upto

    record_upto(run, step + 1)
    if step < run.first or step >= len(run.records):
        return {}
    snap = run.initial if step == 0 else run.records[step - 1].snapshot
    return polls_at(snap, run.records[step], step + 1)


def _ask_now(t: dict, run, qid: str, lang: str) -> None:
    """Ask question ``qid`` about the step after the one the teacher's player shows now (it may
    have moved since the panel was drawn: the question is computed again for where it is)."""
    server = _server()
    step = server.call(lambda: t["room"].step)
    poll = polls_after(run, step).get(qid)
    if poll is None:
        st.session_state["_room_error"] = tr("rooms.no_question", lang, step=step + 1)
        return
    _ask(t, poll)


def _ask(t: dict, poll: Optional[Poll]) -> None:
    server = _server()
    server.call(server.hub.ask, t["code"], t["secret"], poll)


def join_url(code: str) -> str:
    """The student link: this app as the teacher's browser reached it, on the Join page."""
    try:
        u = urlsplit(st.context.url or "")
        origin = f"{u.scheme}://{u.netloc}" if u.scheme and u.netloc else ""
    except Exception:
        origin = ""
    base = (st.get_option("server.baseUrlPath") or "").strip("/")
    path = f"/{base}/{JOIN_SLUG}" if base else f"/{JOIN_SLUG}"
    return f"{origin}{path}?room={quote(code)}"


def lan_address() -> Optional[str]:
    """This machine's address on its network (no packet is sent: a UDP socket only picks the
    route), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return None


def qr_png(text: str) -> Optional[bytes]:
    """``text`` as a QR code (PNG), or None where segno is not installed."""
    try:
        import segno
    except ImportError:
        return None
    buf = io.BytesIO()
    segno.make(text, error="m").save(buf, kind="png", scale=6, border=2)
    return buf.getvalue()


def teach_panel(
    state,
    key: str,
    lang: str,
    t: Optional[dict],
    player_kw: dict,
    questions: Sequence = (),
) -> None:
    """Under a player: "Teach this" (start a class on this run), and while teaching, the student
    link, its QR code, the short code, how to end it, and the question to ask about the next
    step."""
    run = state.run
    with st.expander(f"🎓 {tr('rooms.teach', lang)}", expanded=t is not None):
        err = st.session_state.pop("_room_error", None)
        if err:
            st.error(err)
        if t is None:
            st.caption(tr("rooms.teach_help", lang))
            binding = RoomRun(run.run, key, lang, dict(player_kw), tuple(questions))
            st.button(
                tr("rooms.start", lang),
                key=f"room_start:{key}",
                on_click=_start,
                args=(binding, run.cursor, lang),
                type="primary",
            )
            return
        if not _bound_to(t["room"], run.run):
            st.warning(tr("rooms.other_run", lang))
        room_info(t, lang)
        ask_controls(state, key, lang, t)
        st.button(tr("rooms.end", lang), key=f"room_end:{key}", on_click=_end, args=(t,))


def teach_pool_panel(key: str, lang: str, t: Optional[dict], token: str, payload) -> None:
    """ "Teach this" under the large-pool player (Real workloads): a class follows its frames.
    ``payload()`` is the window's whole pool payload, built when a room is made."""
    with st.expander(f"🎓 {tr('rooms.teach', lang)}", expanded=t is not None):
        err = st.session_state.pop("_room_error", None)
        if err:
            st.error(err)
        if t is None:
            st.caption(tr("rooms.teach_help_pool", lang))
            st.button(
                tr("rooms.start", lang),
                key=f"room_start:{key}",
                on_click=lambda: _start(PoolRoomRun(payload(), token, key, lang), 0, lang),
                type="primary",
            )
            return
        if not _bound_to(t["room"], token):
            st.warning(tr("rooms.other_run", lang))
        room_info(t, lang)
        st.button(tr("rooms.end", lang), key=f"room_end:{key}", on_click=_end, args=(t,))


def room_info(t: dict, lang: str) -> None:
    """The student link, its QR code, the short code, and the warnings a teacher needs."""
    link = join_url(t["code"])
    c1, c2 = st.columns([3, 1])
    with c1:
        st.markdown(tr("rooms.link", lang))
        st.code(link, language=None)
        st.markdown(tr("rooms.code", lang, code=f"`{t['code']}`"))
        host = urlsplit(link).hostname or ""
        if host in ("localhost", "127.0.0.1", "::1", ""):
            lan = lan_address()
            st.caption(tr("rooms.localhost", lang, address=lan or "?"))
        st.caption(tr("rooms.secret_note", lang))
    with c2:
        png = qr_png(link)
        if png is not None:
            st.image(png, caption=tr("rooms.qr", lang))
        else:
            st.caption(tr("rooms.no_qr", lang))


def ask_controls(state, key: str, lang: str, t: dict) -> None:
    """Pick a question about the step after the teacher's (the room's step) and ask it."""
    run, room = state.run, t["room"]
    if not _bound_to(room, run.run):
        return
    step = room.step  # the teacher's player's step, as the room heard it (not debounced)
    polls = polls_after(run, step)
    prepared = [q.ask for q in room.binding.questions if q.step == step and q.ask in polls]
    order = list(dict.fromkeys([*prepared, *polls]))
    if not order:
        st.caption(tr("rooms.no_question", lang, step=step + 1))
        return
    labels = {qid: polls[qid].render(lang, False)["prompt"] for qid in order}
    c1, c2, c3 = st.columns([4, 1, 1], vertical_alignment="bottom")
    pick = c1.selectbox(
        tr("rooms.ask_label", lang, step=step + 1),
        order,
        format_func=lambda q: ("★ " if q in prepared else "") + labels[q],
        key=f"room_q:{key}:{step}",
    )
    c2.button(
        tr("rooms.ask", lang), key=f"room_ask:{key}", on_click=_ask_now, args=(t, run, pick, lang)
    )
    c3.button(tr("rooms.withdraw", lang), key=f"room_unask:{key}", on_click=_ask, args=(t, None))


# -- the student ----------------------------------------------------------------------------
def render_join_page() -> None:
    """ "Join a class": a code (or the link's ``room``) and a name, then the class's run in a
    player that follows the teacher."""
    from paged_kv_lab.store.timeline import Timeline
    from paged_kv_lab.ui.lesson_page import current_lang
    from paged_kv_lab.ui.player_component import page_fragment, player_panel
    from paged_kv_lab.ui.state import PageState, init_globals_from_url

    init_globals_from_url()
    lang = current_lang()
    st.title(f"🙋 {tr('page.join.title', lang)}")
    st.caption(tr("rooms.join_help", lang))
    linked = clean_code(st.query_params.get("room", ""))
    if linked and "room_code" not in st.session_state:
        st.session_state["room_code"] = linked
    c1, c2 = st.columns(2)
    code = clean_code(c1.text_input(tr("rooms.code_label", lang), key="room_code", max_chars=12))
    name = clean_name(c2.text_input(tr("rooms.name_label", lang), key="room_name", max_chars=40))
    if not code:
        if st.session_state.get("room_code"):
            st.error(tr("rooms.error.no_room", lang))
        return
    server = _server()
    room = server.call(server.hub.lookup, code)
    if room is None:
        st.error(tr("rooms.error.no_room", lang))
        return
    if st.query_params.get("room") != code:
        st.query_params["room"] = code
    cfg = {"port": server.port, "code": code, "role": "student", "name": name, "lang": lang}
    b = room.binding
    if isinstance(b, PoolRoomRun):
        from paged_kv_lab.ui.workloads_page import pool_component

        pool_component()(key=f"pool:room-{code}", data={**b.payload, "room": cfg}, height="content")
        st.caption(tr("rooms.student_keys", lang))
        return
    tl = st.session_state.get(f"room_tl:{code}")
    if tl is None or tl.run is not b.run:
        tl = st.session_state[f"room_tl:{code}"] = Timeline(b.run)
    state = st.session_state.setdefault(f"room_state:{code}", PageState())
    state.run = tl

    def stage() -> None:
        player_panel(state, f"room-{code}", b.lang, room=cfg, teach=False, **b.player_kw)
        st.caption(tr("rooms.student_keys", lang))

    page_fragment(stage, JOIN_SLUG)()
