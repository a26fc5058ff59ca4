"""Compute once, shared by every session of this server process: ``Shared``.

A ``Shared`` holds values by key. ``get`` computes a missing value in the asking thread (a second
asker waits for the first instead of computing again); ``start`` computes it in a background
thread and returns at once; ``peek`` returns it if it is ready, else None, never waiting.
``ready_or_placeholder`` is the page's side of ``start``: the value when it is ready, else a
visible note that polls and reruns the page once the value is there, so a page script never
waits for a long computation.

At interpreter exit (``stop_background``, an atexit hook) ``STOPPING`` is set and every
background thread ``start`` made is joined (at most STOP_S s in all): the long computations call
``stop_point()`` between their parts (a study, an engine built, a slice of a replay), which raises
``Stopping`` then, so none is left inside a model step (a C++ call) while the interpreter tears
down, which can abort the process (SIGABRT, "terminate called without an active exception").

Invariants: a key is computed by one thread at a time, and once ready its value stays until
``keep`` newer keys push it out (oldest first) or ``get(..., again_after=s)`` replaces a value
older than ``s`` seconds. A computation that raises keeps its error in place of a value (what is
computed here is a function of its key, so asking again would fail again): ``get`` and ``peek``
raise it.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Optional, TypeVar

T = TypeVar("T")
POLL_S = 1.0  # how often a placeholder looks whether its value is ready
STOP_S = 30.0  # how long the exit waits in all for background computations to end

STOPPING = threading.Event()  # set at interpreter exit: background work ends at its next check
_BACKGROUND: set[threading.Thread] = set()  # the threads ``start`` made that still run
_BACKGROUND_LOCK = threading.Lock()


class Stopping(Exception):
    """Raised by ``stop_point`` once the process is exiting."""


def stop_point() -> None:
    """A long computation's place to end early: raises Stopping once the process is exiting."""
    if STOPPING.is_set():
        raise Stopping("the server is shutting down")


@atexit.register
def stop_background(timeout: float = STOP_S) -> list[str]:
    """Set STOPPING and join the background computations (at most ``timeout`` s in all); the
    names of those still running after it."""
    STOPPING.set()
    deadline = time.monotonic() + timeout
    with _BACKGROUND_LOCK:
        threads = list(_BACKGROUND)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


class _Slot:
    __slots__ = ("done", "value", "error", "when")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self.when = 0.0


class Shared(Generic[T]):
    """Values computed once per key for every session (see the module's invariants)."""

    def __init__(self, name: str, keep: Optional[int] = None) -> None:
        self.name, self.keep = name, keep
        self._slots: OrderedDict[Hashable, _Slot] = OrderedDict()
        self._lock = threading.Lock()

    def _claim(self, key: Hashable, again_after: Optional[float] = None) -> tuple[_Slot, bool]:
        """The key's slot, and whether the caller must compute it (a new slot)."""
        with self._lock:
            slot = self._slots.get(key)
            stale = (
                slot is not None
                and again_after is not None
                and slot.done.is_set()
                and time.monotonic() - slot.when >= again_after
            )
            if slot is not None and not stale:
                self._slots.move_to_end(key)
                return slot, False
            slot = self._slots[key] = _Slot()
            self._slots.move_to_end(key)
            return slot, True

    def _fill(self, key: Hashable, slot: _Slot, compute: Callable[[], T]) -> None:
        try:
            stop_point()
            slot.value = compute()
        except Exception as e:  # kept: raised to every asker
            slot.error = e
        finally:
            slot.when = time.monotonic()
            with self._lock:
                while self.keep is not None and len(self._slots) > self.keep:
                    oldest = next(iter(self._slots))
                    if oldest == key:
                        break
                    del self._slots[oldest]
            slot.done.set()

    @staticmethod
    def _value(slot: _Slot) -> T:
        if slot.error is not None:
            raise slot.error
        return slot.value

    def get(
        self, key: Hashable, compute: Callable[[], T], again_after: Optional[float] = None
    ) -> T:
        """The value for ``key``, computed here if no one has (or, with ``again_after``, if the
        last value is older than that many seconds); waits for a computation under way."""
        slot, mine = self._claim(key, again_after)
        if mine:
            self._fill(key, slot, compute)
        slot.done.wait()
        return self._value(slot)

    def start(self, key: Hashable, compute: Callable[[], T]) -> None:
        """Compute ``key`` in a background thread unless it is ready or under way."""
        slot, mine = self._claim(key)
        if mine:
            name = f"shared:{self.name}"
            args = (key, slot, compute)
            # a daemon, so a computation past STOP_S never holds the exit; stop_background
            # joins it first
            thread = threading.Thread(target=self._background, args=args, name=name, daemon=True)
            with _BACKGROUND_LOCK:
                _BACKGROUND.add(thread)
            thread.start()

    def _background(self, key: Hashable, slot: _Slot, compute: Callable[[], T]) -> None:
        try:
            self._fill(key, slot, compute)
        finally:
            with _BACKGROUND_LOCK:
                _BACKGROUND.discard(threading.current_thread())

    def peek(self, key: Hashable) -> Optional[T]:
        """The value if it is ready (its error raised if its computation failed), else None."""
        with self._lock:
            slot = self._slots.get(key)
        if slot is None or not slot.done.is_set():
            return None
        return self._value(slot)

    def wait(self, key: Hashable, timeout: float) -> Optional[T]:
        """``peek``, after waiting up to ``timeout`` s for a computation under way."""
        with self._lock:
            slot = self._slots.get(key)
        if slot is not None:
            slot.done.wait(timeout)
        return self.peek(key)

    def clear(self) -> None:
        """Forget every value (computations under way still hand theirs to their waiters)."""
        with self._lock:
            self._slots.clear()

    def ready(self, key: Hashable) -> bool:
        with self._lock:
            slot = self._slots.get(key)
        return slot is not None and slot.done.is_set()


def ready_or_placeholder(
    shared: Shared[T], key: Hashable, compute: Callable[[], T], note: str
) -> Optional[T]:
    """On a page: the value for ``key`` if it is ready; else start computing it in the background,
    show ``note`` where the value will go, and return None (the note polls every POLL_S s and
    reruns the page when the value is ready, which replaces the note)."""
    import streamlit as st

    shared.start(key, compute)
    value = shared.peek(key)
    if value is None:
        st.fragment(run_every=POLL_S)(_placeholder)(shared, key, note)
    return value


def _placeholder(shared: Shared, key: Hashable, note: str) -> None:
    import streamlit as st

    if shared.ready(key):
        st.rerun()
    st.info(note, icon="⏳")
