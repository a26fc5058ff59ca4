"""Every frame the room server refuses counts toward its bad-frame limit (docs/classroom.md,
Safety): a member sending well-formed JSON with wrong fields gets each frame answered with what is
wrong, is closed at BAD_FRAMES (code 1008) exactly as for unparseable frames, and the room and its
other members go on. A real room server on 127.0.0.1, real WebSocket clients; every wait bounded."""

from __future__ import annotations

import asyncio
import json
import time
from itertools import cycle, islice

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from paged_kv_lab.classroom.rooms import BAD_FRAMES, BAD_FRAMES_CLOSE, RoomLimits, RoomServer
from support.aio import run_async
from support.paths import ROOT

WAIT_S = 5.0  # one frame's answer
TEST_S = 60.0  # a whole test

# well-formed JSON a student may send wrongly: (frame, the error's key, what its text names)
WRONG = [
    ({"op": "where", "step": "three", "follow": True}, "rooms.error.field", '"step"'),
    ({"op": "where", "step": 3}, "rooms.error.field", '"follow"'),  # a missing field
    ({"op": "where"}, "rooms.error.field", '"step/follow"'),
    ({"op": "where", "step": 3, "follow": "yes"}, "rooms.error.field", '"follow"'),
    ({"op": "where", "step": -1, "follow": True}, "rooms.error.field", '"step"'),
    ({"op": "where", "step": 2**40, "follow": True}, "rooms.error.field", '"step"'),
    ({"op": "where", "step": 3.0, "follow": True}, "rooms.error.field", '"step"'),
    ({"op": "where", "step": 3, "follow": True, "junk": 1}, "rooms.error.extra", '"junk"'),
    ({"op": "fly", "step": 3}, "rooms.error.op", '"fly"'),
    ({"op": "step", "step": 9}, "rooms.error.not_teacher", "teacher"),
    ({"op": "answer", "choice": 0}, "rooms.error.no_poll", "question"),
    ({"op": "name", "name": ["Eve"]}, "rooms.error.field", '"name"'),
    ({"op": "ping", "t": "now"}, "rooms.error.field", '"t"'),
    ({"op": "hello", "room": "ABCDEF", "role": "teacher"}, "rooms.error.hello_again", "already"),
]
# and frames that do not parse, counted as before
UNPARSED = [("not json", "rooms.error.not_json"), ("[1]", "rooms.error.no_op")]


@pytest.fixture
def server():
    # a high rate limit: these frames come as fast as the client sends them, none dropped for it
    s = RoomServer("127.0.0.1", 0, RoomLimits(max_rooms=2, grace_s=60, max_frames_per_s=10_000))
    yield s
    s.stop()


def _url(server: RoomServer) -> str:
    return f"ws://127.0.0.1:{server.port}/"


async def _recv(ws, op: str, timeout: float = WAIT_S) -> dict:
    """The next frame whose op is ``op`` (others are skipped)."""
    end = time.monotonic() + timeout
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), end - time.monotonic()))
        if msg["op"] == op:
            return msg


async def _join(server, code, role="student", **extra):
    ws = await connect(_url(server), max_queue=None)
    await ws.send(json.dumps({"op": "hello", "room": code, "role": role, **extra}))
    await _recv(ws, "welcome")
    return ws


async def _closed_code(ws) -> int:
    """The close code of a connection the server closes (frames still queued are skipped)."""
    with pytest.raises(ConnectionClosed) as e:
        while True:
            await asyncio.wait_for(ws.recv(), WAIT_S)
    return e.value.rcvd.code if e.value.rcvd is not None else -1


def test_wrong_fields_count_toward_the_limit_and_the_class_goes_on(server):
    room = server.call(server.hub.create, "binding")

    async def main():
        teacher = await _join(server, room.code, "teacher", secret=room.secret)
        good = await _join(server, room.code, name="Ann")
        bad = await _join(server, room.code, name="Eve")
        frames = list(islice(cycle(WRONG), BAD_FRAMES))
        for i, (frame, key, names) in enumerate(frames, start=1):
            await bad.send(json.dumps(frame))
            err = await _recv(bad, "error")
            assert err["key"] == key and names in err["text"], (frame, err)
            if i % 10 == 0:  # meanwhile the class follows its teacher
                await teacher.send(json.dumps({"op": "step", "step": i}))
                assert (await _recv(good, "step"))["step"] == i
            if i == BAD_FRAMES - 1:  # one short of the limit: still a member, still answered
                await bad.send(json.dumps({"op": "ping", "t": 7}))
                assert (await _recv(bad, "pong"))["t"] == 7
        # the last refused frame closed the connection, as unparseable frames do
        assert await _closed_code(bad) == BAD_FRAMES_CLOSE
        await teacher.send(json.dumps({"op": "step", "step": 99}))
        assert (await _recv(good, "step"))["step"] == 99
        cls = await _recv(teacher, "class")
        while cls["students"] != 1:
            cls = await _recv(teacher, "class")
        assert cls["names"] == ["Ann"] and cls["follow"] == 1
        await good.send(json.dumps({"op": "where", "step": 5, "follow": False}))
        cls = await _recv(teacher, "class")
        while cls["wander"] != 1:
            cls = await _recv(teacher, "class")
        for ws in (teacher, good):
            await ws.close()

    run_async(asyncio.wait_for(main(), TEST_S))
    assert server.call(lambda: server.hub.rooms[room.code].step) == 99


def test_parsed_and_unparsed_bad_frames_share_one_count(server):
    """Half the limit unparseable, half wrong fields: closed at the limit, not later."""
    room = server.call(server.hub.create, "binding")

    async def main():
        bad = await _join(server, room.code)
        half = BAD_FRAMES // 2
        mixed = list(islice(cycle(UNPARSED), half)) + [
            (json.dumps(f), k) for f, k, _ in islice(cycle(WRONG), BAD_FRAMES - half)
        ]
        for frame, key in mixed:
            await bad.send(frame)
            assert (await _recv(bad, "error"))["key"] == key
        assert await _closed_code(bad) == BAD_FRAMES_CLOSE

    run_async(asyncio.wait_for(main(), TEST_S))


def test_a_teachers_bad_frames_count_too_and_the_room_stays(server):
    """A teacher's refused frames (a student's op, an unknown op, a bad step) count as well; the
    room stays open for the teacher's next connection, its students still in it."""
    room = server.call(server.hub.create, "binding")

    async def main():
        teacher = await _join(server, room.code, "teacher", secret=room.secret)
        student = await _join(server, room.code)
        wrong = [
            ({"op": "where", "step": 1, "follow": True}, "rooms.error.not_student"),
            ({"op": "step", "step": "next"}, "rooms.error.field"),
            ({"op": "step", "step": 1, "secret": room.secret}, "rooms.error.extra"),
            ({"op": "ask"}, "rooms.error.op"),
        ]
        for frame, key in islice(cycle(wrong), BAD_FRAMES):
            await teacher.send(json.dumps(frame))
            err = await _recv(teacher, "error")
            assert err["key"] == key and err["text"]
            assert room.secret not in err["text"]
        assert await _closed_code(teacher) == BAD_FRAMES_CLOSE
        again = await _join(server, room.code, "teacher", secret=room.secret)
        await again.send(json.dumps({"op": "step", "step": 4}))
        assert (await _recv(student, "step"))["step"] == 4
        for ws in (again, student):
            await ws.close()

    run_async(asyncio.wait_for(main(), TEST_S))


def test_the_docs_say_the_limit_and_its_close_code():
    text = " ".join((ROOT / "docs" / "classroom.md").read_text(encoding="utf-8").split())
    said = f"a connection that sends {BAD_FRAMES} is closed (WebSocket code {BAD_FRAMES_CLOSE})"
    assert said in text and "Every one of them counts" in text
