"""``run_async``: a test's coroutine run to its end on a thread of its own.

A worker's chromium (tests/browser/conftest.py: one per worker, Playwright's sync API) keeps an
event loop running in the worker's main thread for as long as the worker lives, and
``asyncio.run`` refuses to start a second loop in a thread that runs one. A test that talks to a
server over asyncio (the class rooms' WebSocket tests) therefore runs its coroutine here, so it
passes whichever tests ran before it on the same worker."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run(coro)`` on a new thread; its result, or its exception raised here."""
    out: dict[str, Any] = {}

    def main() -> None:
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as e:  # handed to the caller's thread, traceback and all
            out["error"] = e

    t = threading.Thread(target=main, name="test-asyncio", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")
