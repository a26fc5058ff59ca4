"""Rooms: a class follows a teacher's player, live.

A room is bound to one recorded run (``binding``: what the "Join a class" page needs to mount the
same run; opaque here). The teacher's player sends its cursor over a WebSocket and the room server
sends it on to every student's player at once, with no Streamlit rerun in between: the players
already hold the recorded steps, so a step paints as soon as its frame arrives. One server per
process (``room_server``), on its own port, beside Streamlit's.

Invariants kept by ``RoomHub`` (all its state is touched only on its event loop's thread; other
threads go through ``RoomServer.call``):
- only a connection that said the room's secret (compared in constant time) moves the room, asks
  a question or sees the tally before the reveal; the secret is never sent to a student;
- a room is open while its teacher is connected or left less than ``grace_s`` ago (a room whose
  teacher never connected counts from its creation); a closed room's students are told so;
- at most ``max_rooms`` rooms per server, ``max_students`` students per room and
  ``max_frames_per_s`` frames a second from a student; a refusal names its environment variable;
- a frame that is not a well-formed request (not JSON, no ``op``, an unknown op, a missing,
  mistyped or out-of-range field, a field its op does not take, an op the member's role may not
  send) is answered with a message naming what is wrong and changes nothing; each one counts
  toward ``BAD_FRAMES``, at which the connection is closed (code 1008); before its hello, one
  closes it; a member's name is plain text (control characters dropped, at most ``NAME_CHARS``),
  never markup.
"""

from __future__ import annotations

import asyncio
import atexit
import hmac
import json
import logging
import os
import secrets
import threading
import time
import unicodedata
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Sequence

from paged_kv_lab.run.budget import BudgetError, _env_int, over
from paged_kv_lab.text.i18n import Text, languages, tr

CODE_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I: read aloud and typed
CODE_CHARS = 6
NAME_CHARS = 40
BAD_FRAMES = 50  # a connection that sends this many bad (refused) frames is closed
BAD_FRAMES_CLOSE = 1008  # the WebSocket close code then (policy violation)
# the fields each op takes ("op" itself besides); any other field is refused, named
FIELDS = {
    "hello": ("room", "role", "secret", "name", "lang"),
    "step": ("step",),
    "where": ("step", "follow"),
    "answer": ("choice",),
    "name": ("name",),
    "ping": ("t",),
}
STUDENT_OPS = ("where", "answer", "name")
_LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoomLimits:
    """Bounds of the room server. Each field is set by the environment variable ``ROOM_ENV``
    names."""

    max_rooms: int = 20
    max_students: int = 80  # per room
    grace_s: int = 600  # a room stays open this long after its teacher left
    max_frame_bytes: int = 2048  # one frame from a member
    max_frames_per_s: int = 30  # frames one student may send per second (more are dropped)


ROOM_ENV = {
    "max_rooms": "PAGED_KV_LAB_MAX_ROOMS",
    "max_students": "PAGED_KV_LAB_MAX_ROOM_STUDENTS",
    "grace_s": "PAGED_KV_LAB_ROOM_GRACE_S",
    "max_frame_bytes": "PAGED_KV_LAB_MAX_ROOM_FRAME_BYTES",
    "max_frames_per_s": "PAGED_KV_LAB_MAX_ROOM_FRAMES_PER_S",
}
PORT_ENV = "PAGED_KV_LAB_ROOMS_PORT"  # the room server's port (unset: any free port)


def room_limits(env: Mapping[str, str] | None = None) -> RoomLimits:
    env = os.environ if env is None else env
    base = RoomLimits()
    return replace(base, **{f: _env_int(env, ROOM_ENV[f], getattr(base, f)) for f in ROOM_ENV})


def room_port(env: Mapping[str, str] | None = None) -> int:
    raw = (os.environ if env is None else env).get(PORT_ENV, "").strip()
    return 0 if not raw else _env_int({PORT_ENV: raw}, PORT_ENV, 0)


def _refusal(what: str, value: int, allowed: int, field_name: str) -> BudgetError:
    env = ROOM_ENV[field_name]
    text = over(Text(f"rooms.what.{what}"), value, allowed, Text("refusal.where.server"), env)
    return BudgetError(text, env, value, allowed)


# -- questions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PollText:
    prompt: str
    options: tuple[str, ...]
    explain: str


@dataclass(frozen=True)
class Poll:
    """A question to the class about step ``step`` (asked while the teacher shows ``step - 1``):
    option ``answer`` is what the engine did at ``step``. ``texts``: its words per language (the
    first is the fallback); ``blocks[i]``: the grid block option i names (a student may click the
    block), for a question about blocks."""

    step: int
    kind: str
    answer: int
    texts: Mapping[str, PollText]
    blocks: tuple[Optional[int], ...] = ()

    @property
    def size(self) -> int:
        return len(next(iter(self.texts.values())).options)

    def render(self, lang: str, revealed: bool) -> dict[str, Any]:
        t = self.texts.get(lang) or next(iter(self.texts.values()))
        out: dict[str, Any] = {
            "step": self.step,
            "kind": self.kind,
            "prompt": t.prompt,
            "options": list(t.options),
            "blocks": list(self.blocks),
        }
        if revealed:
            out.update(answer=self.answer, explain=t.explain)
        return out


# -- rooms ----------------------------------------------------------------------------------
@dataclass(eq=False)
class Member:
    ws: Any
    role: str  # teacher | student
    lang: str = "en"
    name: str = ""
    following: bool = True
    step: int = 0
    answer: Optional[int] = None
    bad: int = 0
    second: int = -1  # the clock's second ``frames`` counts in
    frames: int = 0


@dataclass(eq=False)
class Room:
    code: str
    secret: str
    binding: Any
    created: float
    step: int = 0
    teacher: Optional[Member] = None
    left_at: Optional[float] = None  # when the teacher left (None while connected)
    students: list[Member] = field(default_factory=list)
    poll: Optional[Poll] = None
    revealed: bool = False

    def tally(self) -> list[int]:
        n = self.poll.size if self.poll else 0
        counts = [0] * n
        for s in self.students:
            if s.answer is not None and s.answer < n:
                counts[s.answer] += 1
        return counts


def clean_name(raw: Any) -> str:
    """A member's name as plain text: control and format characters dropped, spaces collapsed,
    at most ``NAME_CHARS`` characters."""
    if not isinstance(raw, str):
        return ""
    kept = "".join(c for c in raw[: NAME_CHARS * 4] if unicodedata.category(c)[0] != "C")
    return " ".join(kept.split())[:NAME_CHARS]


def clean_code(raw: Any) -> str:
    """A typed room code, upper-cased, spaces and dashes dropped ('' where it cannot be one)."""
    if not isinstance(raw, str) or len(raw) > 32:
        return ""
    code = raw.upper().replace(" ", "").replace("-", "")
    ok = len(code) == CODE_CHARS and all(c in CODE_ALPHABET for c in code)
    return code if ok else ""


def _int(v: Any) -> Optional[int]:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 else None


def _field(name: str) -> Text:
    return Text("rooms.error.field", {"field": name})


def _extra(msg: dict) -> Optional[Text]:
    """The refusal of a frame carrying fields its op does not take (at most three named, as plain
    text), or None."""
    allowed = FIELDS.get(msg["op"], ())
    extra = [k for k in msg if k != "op" and k not in allowed]
    if not extra:
        return None
    named = ", ".join(f'"{clean_name(k)}"' for k in extra[:3]) + (", …" if len(extra) > 3 else "")
    return Text(
        "rooms.error.extra",
        {"op": msg["op"], "fields": named, "allowed": ", ".join(("op", *allowed))},
    )


class RoomHub:
    """The rooms of one server and the protocol its members speak (docs/classroom.md).

    Frames are JSON objects with an ``op``. A member's first frame is ``hello``
    (``{"op": "hello", "room", "role": "student"|"teacher", "secret"?, "name"?, "lang"?}``); then a
    teacher sends ``step`` (``{"op": "step", "step"}``), a student ``where``
    (``{"op": "where", "step", "follow"}``), ``answer`` (``{"op": "answer", "choice"}``) and
    ``name`` (``{"op": "name", "name"}``); any member may send ``ping`` (``{"op": "ping", "t"?}``,
    answered by ``pong`` with the same ``t``). An op takes exactly its fields (``FIELDS``). The
    server sends ``welcome``, ``step``, ``poll``, ``reveal``, ``class`` (to the teacher: how many
    follow and wander, the tally), ``pong``, ``error`` (``key``, ``text``, ``env``) and
    ``closed``."""

    def __init__(
        self, limits: RoomLimits | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.limits = limits or room_limits()
        self.clock = clock
        self.rooms: dict[str, Room] = {}

    # -- called through RoomServer.call (on the loop) ------------------------------------
    def create(self, binding: Any, step: int = 0) -> Room:
        """A new room bound to ``binding``. Raises BudgetError (naming PAGED_KV_LAB_MAX_ROOMS)
        when the server holds its maximum of open rooms."""
        self.sweep()
        if len(self.rooms) >= self.limits.max_rooms:
            raise _refusal("rooms", len(self.rooms) + 1, self.limits.max_rooms, "max_rooms")
        code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_CHARS))
        while code in self.rooms:
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_CHARS))
        now = self.clock()
        room = Room(code, secrets.token_urlsafe(24), binding, now, step=step, left_at=now)
        self.rooms[code] = room
        return room

    def lookup(self, code: Any) -> Optional[Room]:
        self.sweep()
        return self.rooms.get(clean_code(code))

    def teacher_room(self, code: Any, secret: Any) -> Optional[Room]:
        """The room whose code and secret these are (None: no such room, or the wrong secret)."""
        room = self.lookup(code)
        return room if room is not None and self._is_secret(room, secret) else None

    @staticmethod
    def _is_secret(room: Room, secret: Any) -> bool:
        if not isinstance(secret, str) or len(secret) > 256:
            return False
        return hmac.compare_digest(secret.encode(), room.secret.encode())

    def ask(self, code: str, secret: str, poll: Optional[Poll]) -> bool:
        """The teacher's question to the class (None withdraws it); False for a wrong secret."""
        room = self.teacher_room(code, secret)
        if room is None:
            return False
        room.poll, room.revealed = poll, False
        for s in room.students:
            s.answer = None
        for m in room.students:
            self._send(m, {"op": "poll", "poll": poll.render(m.lang, False) if poll else None})
        self._tell_teacher(room)
        return True

    def end(self, code: str, secret: str) -> bool:
        """The teacher ends the class now (False for a wrong secret)."""
        room = self.teacher_room(code, secret)
        if room is None:
            return False
        del self.rooms[room.code]
        self._close(room)
        return True

    def _close(self, room: Room) -> None:
        """Tell a closed room's members, then hang up on them."""
        for m in room.students:
            self._send(m, {"op": "closed", "text": tr("rooms.closed", m.lang)})
        if room.teacher is not None:
            self._send(room.teacher, {"op": "closed", "text": tr("rooms.ended", room.teacher.lang)})
        for m in [*room.students, *([room.teacher] if room.teacher else [])]:
            asyncio.ensure_future(m.ws.close())

    def sweep(self) -> None:
        """Close every room whose teacher left more than ``grace_s`` ago."""
        now = self.clock()
        for code, room in list(self.rooms.items()):
            if room.teacher is None and now - (room.left_at or now) > self.limits.grace_s:
                del self.rooms[code]
                self._close(room)

    # -- the protocol --------------------------------------------------------------------
    async def handler(self, ws) -> None:
        """One member's connection, from hello to goodbye."""
        member: Optional[Member] = None
        room: Optional[Room] = None
        try:
            async for raw in ws:
                msg = self._parse(ws, raw, member)
                if member is None:  # the first frame: a hello, else the connection ends
                    if msg is not None:
                        room, member = self._hello(ws, msg)
                    if member is None:
                        return
                    continue
                if msg is not None:
                    if member.role == "student" and self._too_fast(member):
                        continue  # dropped for its rate, not for what it says: not counted
                    refusal = self._dispatch(room, member, msg)
                    if refusal is None:
                        continue
                    self._error(member.ws, member.lang, refusal)
                # refused, for whatever reason (_parse or _dispatch said which): counted
                member.bad += 1
                if member.bad >= BAD_FRAMES:
                    await ws.close(BAD_FRAMES_CLOSE, f"{BAD_FRAMES} bad frames")
                    return
        except Exception:  # a broken connection (or a bug a frame found) ends only itself
            _LOG.warning("a room connection ended on an error", exc_info=True)
        finally:
            if room is not None and member is not None:
                self._leave(room, member)

    def _too_fast(self, m: Member) -> bool:
        """Past ``max_frames_per_s`` frames this second: dropped (the first one dropped is
        answered, naming the variable). Students only: a teacher holding → down moves the room
        at the key's repeat rate."""
        now = int(self.clock())
        if now != m.second:
            m.second, m.frames = now, 0
        m.frames += 1
        limit = self.limits.max_frames_per_s
        if m.frames == limit + 1:
            refusal = _refusal("rate", m.frames, limit, "max_frames_per_s")
            self._send_ws(
                m.ws,
                {
                    "op": "error",
                    "key": "rooms.what.rate",
                    "text": tr(refusal.text, m.lang),
                    "env": refusal.limit,
                },
            )
        return m.frames > limit

    def _error(self, ws, lang: str, text: Text, env: str = "") -> None:
        said = tr(text, lang)
        self._send_ws(ws, {"op": "error", "key": text.key, "text": said, "env": env})

    def _parse(self, ws, raw: Any, member: Optional[Member]) -> Optional[dict]:
        lang = member.lang if member else "en"
        if not isinstance(raw, str):
            self._error(ws, lang, Text("rooms.error.binary"))
            return None
        if len(raw.encode()) > self.limits.max_frame_bytes:
            env = ROOM_ENV["max_frame_bytes"]
            text = over(
                Text("rooms.what.frame"),
                len(raw.encode()),
                self.limits.max_frame_bytes,
                Text("refusal.where.server"),
                env,
            )
            self._send_ws(
                ws, {"op": "error", "key": "rooms.what.frame", "text": tr(text, lang), "env": env}
            )
            return None
        try:
            msg = json.loads(raw)
        except ValueError:
            self._error(ws, lang, Text("rooms.error.not_json"))
            return None
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            self._error(ws, lang, Text("rooms.error.no_op"))
            return None
        return msg

    def _hello(self, ws, msg: dict) -> tuple[Optional[Room], Optional[Member]]:
        lang = msg.get("lang") if msg.get("lang") in languages() else "en"
        if msg["op"] != "hello":
            self._error(ws, lang, Text("rooms.error.hello_first"))
            return None, None
        extra = _extra(msg)
        if extra is not None:
            self._error(ws, lang, extra)
            return None, None
        room = self.lookup(msg.get("room"))
        if room is None:
            self._error(ws, lang, Text("rooms.error.no_room"))
            return None, None
        role = msg.get("role")
        if role == "teacher":
            if not self._is_secret(room, msg.get("secret")):
                self._error(ws, lang, Text("rooms.error.secret"))
                return None, None
            old = room.teacher
            member = Member(ws, "teacher", lang, step=room.step)
            room.teacher, room.left_at = member, None
            if old is not None:
                self._send(old, {"op": "closed", "text": tr("rooms.replaced", old.lang)})
                asyncio.ensure_future(old.ws.close())
        elif role == "student":
            if len(room.students) >= self.limits.max_students:
                env = ROOM_ENV["max_students"]
                limit = self.limits.max_students
                refusal = _refusal("students", len(room.students) + 1, limit, "max_students")
                self._send_ws(
                    ws,
                    {
                        "op": "error",
                        "key": "rooms.what.students",
                        "text": tr(refusal.text, lang),
                        "env": env,
                    },
                )
                return None, None
            member = Member(ws, "student", lang, clean_name(msg.get("name")), step=room.step)
            room.students.append(member)
        else:
            self._error(ws, lang, Text("rooms.error.role"))
            return None, None
        welcome = {"op": "welcome", "role": member.role, "room": room.code, "step": room.step}
        if room.poll is not None:
            welcome["poll"] = room.poll.render(lang, room.revealed)
        self._send(member, welcome)
        self._tell_teacher(room)
        return room, member

    def _dispatch(self, room: Room, m: Member, msg: dict) -> Optional[Text]:
        """Carry out one frame of a member; its refusal (what is wrong with it) if it is refused,
        else None."""
        op = msg["op"]
        if self.rooms.get(room.code) is not room:
            self._send(m, {"op": "closed", "text": tr("rooms.closed", m.lang)})
            return None
        if op in ("step", "ask") and m.role != "teacher":
            return Text("rooms.error.not_teacher")
        if op in STUDENT_OPS and m.role != "student":
            return Text("rooms.error.not_student", {"op": op})
        if op == "hello":
            return Text("rooms.error.hello_again")
        if op not in FIELDS:
            return Text("rooms.error.op", {"op": clean_name(op)})
        extra = _extra(msg)
        if extra is not None:
            return extra
        if op == "ping":
            t = msg.get("t")
            if t is not None and _int(t) is None:
                return _field("t")
            self._send(m, {"op": "pong", "t": t})
        elif op == "step":
            step = _int(msg.get("step"))
            if step is None:
                return _field("step")
            self._teacher_step(room, step)
        elif op == "where":
            step, follow = _int(msg.get("step")), msg.get("follow")
            ok = {"step": step is not None, "follow": isinstance(follow, bool)}
            wrong = [f for f in ("step", "follow") if not ok[f]]
            if wrong:
                return _field("/".join(wrong))
            m.step, m.following = step, follow
            self._tell_teacher(room)
        elif op == "name":
            if not isinstance(msg.get("name"), str):
                return _field("name")
            m.name = clean_name(msg["name"])
            self._tell_teacher(room)
        else:  # answer
            choice = _int(msg.get("choice"))
            if room.poll is None or room.revealed:
                return Text("rooms.error.no_poll")
            if choice is None or choice >= room.poll.size:
                return _field("choice")
            m.answer = choice
            self._tell_teacher(room)
        return None

    def _teacher_step(self, room: Room, step: int) -> None:
        """Every student's player hears the step at once; reaching the polled step reveals it
        (each student is told their answer and whether it was right); leaving a revealed step
        clears the question."""
        room.step = step
        self._broadcast([s.ws for s in room.students], json.dumps({"op": "step", "step": step}))
        poll = room.poll
        if poll is not None and not room.revealed and step >= poll.step:
            room.revealed = True
            tally = room.tally()
            for s in room.students:
                out = poll.render(s.lang, True)
                out.update(choice=s.answer, right=s.answer == poll.answer, tally=tally)
                self._send(s, {"op": "reveal", "poll": out})
        elif poll is not None and room.revealed and step != poll.step:
            room.poll, room.revealed = None, False
            for s in room.students:
                s.answer = None
            self._broadcast([s.ws for s in room.students], json.dumps({"op": "poll", "poll": None}))
        self._tell_teacher(room)

    def _tell_teacher(self, room: Room) -> None:
        t = room.teacher
        if t is None:
            return
        follow = sum(1 for s in room.students if s.following)
        out: dict[str, Any] = {
            "op": "class",
            "students": len(room.students),
            "follow": follow,
            "wander": len(room.students) - follow,
            "names": [s.name for s in room.students if s.name][:NAME_CHARS],
            "poll": room.poll.render(t.lang, room.revealed) if room.poll else None,
        }
        if room.poll is not None:
            out["tally"] = room.tally()
            out["answered"] = sum(1 for s in room.students if s.answer is not None)
        self._send(t, out)

    def _leave(self, room: Room, m: Member) -> None:
        if m.role == "teacher":
            if room.teacher is m:
                room.teacher, room.left_at = None, self.clock()
        elif m in room.students:
            room.students.remove(m)
            self._tell_teacher(room)

    # -- sending (never waits for a slow member) -------------------------------------------
    def _send(self, m: Member, obj: dict) -> None:
        self._send_ws(m.ws, obj)

    @staticmethod
    def _send_ws(ws, obj: dict) -> None:
        if ws is not None:
            RoomHub._broadcast([ws], json.dumps(obj, ensure_ascii=False))

    @staticmethod
    def _broadcast(conns: Sequence[Any], frame: str) -> None:
        from websockets.asyncio.server import broadcast

        # a member that reads nothing (its buffer past SLOW_BYTES) is skipped, not buffered for
        broadcast([c for c in conns if _buffered(c) < SLOW_BYTES], frame)


SLOW_BYTES = 1 << 20


def _buffered(conn) -> int:
    transport = getattr(conn, "transport", None)
    return transport.get_write_buffer_size() if transport is not None else 0


class RoomServer:
    """A RoomHub served over WebSocket on ``host:port`` from a thread of its own (port 0: any free
    port; ``port`` is then the one bound). ``stop()`` ends it; a server still running at
    interpreter exit is stopped then (its thread is a daemon, joined by ``stop``)."""

    def __init__(self, host: Optional[str], port: int = 0, limits: RoomLimits | None = None):
        self.hub = RoomHub(limits)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self.port = 0
        self._thread = threading.Thread(
            target=self._run, args=(host, port), name="paged-kv-lab-rooms", daemon=True
        )
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        _RUNNING_SERVERS.add(self)

    def _run(self, host: Optional[str], port: int) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve(host, port))
        except BaseException as e:  # the port is taken, or the host unknown: the caller hears it
            self._error = e
            self._ready.set()

    async def _serve(self, host: Optional[str], port: int) -> None:
        from websockets.asyncio.server import serve

        limits = self.hub.limits
        self._stop = asyncio.Event()
        # frames up to 4x the limit are read and refused with a message; larger ones close the link
        async with serve(
            self.hub.handler, host or None, port, max_size=4 * limits.max_frame_bytes
        ) as server:
            self.server = server
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            while not self._stop.is_set():
                try:
                    await asyncio.wait_for(self._stop.wait(), min(5, limits.grace_s))
                except asyncio.TimeoutError:
                    self.hub.sweep()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the server and its connections, and end its thread (waiting up to ``timeout``
        s). Stopping a stopped server does nothing."""
        _RUNNING_SERVERS.discard(self)
        if not self._thread.is_alive():
            return
        try:
            self.loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:  # its loop is closed: the thread is ending
            pass
        self._thread.join(timeout)

    def call(self, fn: Callable[..., Any], *args, timeout: float = 5.0) -> Any:
        """``fn(*args)`` run on the server's loop (where the rooms live), its result here."""

        async def run():
            return fn(*args)

        fut: Future = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return fut.result(timeout)


_SERVER: Optional[RoomServer] = None
_SERVER_LOCK = threading.Lock()
# Servers still running at interpreter exit are stopped then: a daemon thread torn down inside
# its event loop's C call while the interpreter finalizes can abort the process.
_RUNNING_SERVERS: "weakref.WeakSet[RoomServer]" = weakref.WeakSet()
STOP_AT_EXIT_S = 5.0


@atexit.register
def _stop_running_servers() -> None:
    for server in list(_RUNNING_SERVERS):
        server.stop(STOP_AT_EXIT_S)


def room_server(host: Optional[str] = None) -> RoomServer:
    """This process's room server, started on first use (PAGED_KV_LAB_ROOMS_PORT, else any free
    port; ``host`` as the app's own server binds, None: every interface)."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None:
            _SERVER = RoomServer(host, room_port())
        return _SERVER
