"""A Streamlit session without a browser: its WebSocket (``/_stcore/stream``) on a running server,
the script run a browser's first visit asks for, and the messages the server sends back, read as
Streamlit's own protobufs. Many such sessions cost a test little (no chromium page each), so it
can open thirty at once and time, for each, when the server has sent what a page needs: the text
of an element, or the player component with its head (the recorded run's start), which is what
the browser draws the player from."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Optional
from urllib.parse import urlsplit

PLAYER = "paged_kv_lab.player"  # the player component's name (ui/player_component.py)


@dataclass
class Visit:
    """What one session got: seconds from the connection until the page's first element, until
    the player with its head, and every text the page sent (markdown, captions, titles)."""

    first_element_s: Optional[float] = None
    player_s: Optional[float] = None
    texts: list[str] = field(default_factory=list)
    error: Optional[str] = None


def _texts(element) -> list[str]:
    kind = element.WhichOneof("type")
    if kind in ("markdown", "heading", "alert", "text", "caption"):
        body = getattr(element, kind)
        return [getattr(body, "body", "")]
    return []


def _player_with_head(element) -> bool:
    """``element`` is the player component and its data carries the run's head."""
    if element.WhichOneof("type") != "bidi_component":
        return False
    comp = element.bidi_component
    if PLAYER not in comp.component_name:
        return False
    kind = comp.WhichOneof("data")
    raw = comp.json if kind == "json" else comp.mixed.json if kind == "mixed" else ""
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("head") is not None


async def visit(url: str, page: str, query: str = "", timeout: float = 60.0) -> Visit:
    """Open ``page`` (its URL path, "" for the home page) with ``query`` as a new session of the
    server at ``url`` and read what it sends until its first script run ends with the player
    (or without one), at most ``timeout`` s."""
    out = Visit()
    try:
        await asyncio.wait_for(_read(url, page, query, timeout, out, time.monotonic()), timeout)
    except (asyncio.TimeoutError, OSError) as e:
        out.error = f"{type(e).__name__}: {e}"
    return out


async def _read(url: str, page: str, query: str, timeout: float, out: Visit, t0: float) -> None:
    from streamlit.proto.BackMsg_pb2 import BackMsg
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from websockets.asyncio.client import connect

    parts = urlsplit(url)
    async with connect(
        f"ws://{parts.netloc}/_stcore/stream",
        subprotocols=["streamlit"],
        max_size=None,
        open_timeout=timeout,
    ) as ws:
        back = BackMsg()
        back.rerun_script.query_string = query
        back.rerun_script.page_name = page
        await ws.send(back.SerializeToString())
        while True:
            msg = ForwardMsg()
            msg.ParseFromString(await ws.recv())
            kind = msg.WhichOneof("type")
            if kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
                element = msg.delta.new_element
                if out.first_element_s is None:
                    out.first_element_s = time.monotonic() - t0
                out.texts += _texts(element)
                if out.player_s is None and _player_with_head(element):
                    out.player_s = time.monotonic() - t0
            elif kind == "script_finished" and out.first_element_s is not None:
                return


async def visit_all(url: str, page: str, query: str, n: int, timeout: float) -> list[Visit]:
    """``n`` sessions opening the same page at once."""
    return list(await asyncio.gather(*(visit(url, page, query, timeout) for _ in range(n))))
