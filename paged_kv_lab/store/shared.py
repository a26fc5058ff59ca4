"""Compute once, shared by every session of this server process: ``Shared``.

A ``Shared`` holds values by key. ``get`` computes a missing value in the asking thread (a second
asker waits for the first instead of computing again); ``start`` computes it in a background
thread and returns at once; ``peek`` returns it if it is ready, else None, never waiting.
``ready_or_placeholder`` is the page's side of ``start``: the value when it is ready, else a
visible note that polls and reruns the page once the value is there, so a page script never
waits for a long computation.

Invariants: a key is computed by one thread at a time, and once ready its value stays until
``keep`` newer keys push it out (oldest first) or ``get(..., again_after=s)`` replaces a value
older than ``s`` seconds. A computation that raises keeps its error in place of a value (what is
computed here is a function of its key, so asking again would fail again): ``get`` and ``peek``
raise it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Generic, Hashable, Optional, TypeVar

T = TypeVar("T")
POLL_S = 1.0  # how often a placeholder looks whether its value is ready


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
            threading.Thread(target=self._fill, args=args, name=name, daemon=True).start()

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
