"""Everything the sessions of one server process share, in one cache bounded by bytes:
``ServerCache`` (one per process: ``default_cache``), and ``Shared``, one kind of value in it.

What goes in: recorded runs (store/run_store.py: RunStore), the topic pages' studies, memory
profiles,
the shipped trace, Real workloads' replays and sweeps, the fleets (the fleet lesson's and Real
workloads' fleet mode), and the warm-up's mark -- everything but the loaded model (Streamlit's
``st.cache_resource``, app/modelstate.py) and each model's token-decoding LRU (store/token_text.py).
Each entry carries an estimate of its bytes (``estimate_nbytes`` over what it holds, or the
kind's own ``size``); their sum is ``total_bytes``. No Streamlit here.

Invariants, under ``cond`` (one condition for the whole cache; the run store waits on it too):

- ``total_bytes == sum(nbytes of the ready entries)``; an entry being computed counts 0 until its
  value is there (then it is measured) and is never evicted, so a key is computed once: a second
  asker waits for the first instead of computing again.
- Past ``max_bytes`` the least recently used ready entries that are not in use (the kind's
  ``in_use``: a run some session plays or the worker computes, the warm-up's mark) are forgotten,
  oldest first; past ``hard_bytes`` entries in use go too, and their kind is told (``on_evict``:
  a dropped run tells its sessions why no more steps come). The entry just stored is kept.
- A computation that raises keeps its error in place of a value (what is computed is a function
  of its key, so asking again would fail again), unless its kind says otherwise (``keep_errors``).

Visitors first (``Visitors``, the process's ``VISITORS``): while a session draws a page, and for a
grace after, the work done ahead of visitors waits -- a thread inside ``yielding()`` (the warm-up)
at its ``stop_point``s, never while it holds an ``OwnedLock`` (the engine lock), and the run
store's steps computed ahead (store/run_store.py) -- and a page that waits for such work meanwhile
does not count (docs/class-server.md#visitors-first-the-warm-up-yields).

At interpreter exit (``stop_background``, an atexit hook) ``STOPPING`` is set and every
background computation ``start`` made is joined (at most STOP_S s in all): the long computations
call ``stop_point()`` between their parts (a study, an engine built, a slice of a replay), which
raises ``Stopping`` then, so none is left inside a model step (a C++ call) while the interpreter
tears down, which can abort the process (SIGABRT, "terminate called without an active exception").
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import os
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import fields, is_dataclass
from typing import Any, Callable, Generic, Hashable, Iterator, Optional, TypeVar

T = TypeVar("T")
STOP_S = 30.0  # how long the exit waits in all for background computations to end

STOPPING = threading.Event()  # set at interpreter exit: background work ends at its next check
_BACKGROUND: set[threading.Thread] = set()  # the threads ``start`` made that still run
_BACKGROUND_LOCK = threading.Lock()


class Stopping(Exception):
    """Raised by ``stop_point`` once the process is exiting."""


def stop_point() -> None:
    """A long computation's place to end early: raises Stopping once the process is exiting. In a
    thread that yields to visitors (``yielding``: the warm-up), also its place to wait while some
    session draws a page (``VISITORS``), at most YIELD_MAX_S s, unless it holds an ``OwnedLock``
    (the engine lock: a visitor's page may wait for it)."""
    if STOPPING.is_set():
        raise Stopping("the server is shutting down")
    if getattr(_LOCAL, "yields", False) and not getattr(_LOCAL, "locks_held", 0):
        VISITORS.wait_idle(YIELD_MAX_S)
        if STOPPING.is_set():
            raise Stopping("the server is shutting down")


# -- visitors first ----------------------------------------------------------------------------
MEASURE_STOP_EVERY = 20_000  # objects a size walked ahead of visitors walks between stop points
YIELD_MAX_S = 10.0  # the longest a yielding thread waits at one stop_point for visitors
# after a page is drawn, the warm-up waits this long more: its browser loads the app's scripts and
# draws what it was sent (on two cores shared with the server, 1.5-2.5 s for a new tab; at 1 s
# the warm-up came back mid-load and a new tab took over 3 s in the full suite's runs)
PAGE_GRACE_S = 3.0
# the run store's steps computed ahead wait less: they are the steps that page's player asks for
# next, and a session waiting a few seconds for a far step (``Timeline.goto``) needs them
AHEAD_GRACE_S = 1.0
_LOCAL = threading.local()  # per thread: drawing (depth), blocked, yields, locks_held


class Visitors:
    """How many sessions are drawing a page now (a script run of the app, inside ``drawing``),
    less those blocked waiting for other work (``blocked``: a value computed elsewhere, a step of a
    run, the engine lock). Work done ahead of visitors waits while that number is above 0
    (``busy``): the warm-up thread at its stop points (``yielding``) and the run store's steps
    computed ahead (store/run_store.py), so a new session's page has the cores (and the GIL).
    A page that waits for such work does not hold it back: it counts as blocked while it waits."""

    def __init__(
        self, grace_s: float = PAGE_GRACE_S, ahead_grace_s: Optional[float] = None
    ) -> None:
        self.cond = threading.Condition()
        self.drawing_now = 0
        self.blocked_now = 0
        self.grace_s = grace_s  # the warm-up's (``wait_idle``)
        # the run store's steps ahead (``busy(ahead=True)``): never longer than the warm-up's
        self.ahead_grace_s = min(AHEAD_GRACE_S, grace_s) if ahead_grace_s is None else ahead_grace_s
        self._last_end = -float("inf")  # time.monotonic() when the last page was drawn

    @property
    def last_drawn(self) -> float:
        """``time.monotonic()`` when the last page was drawn (-inf: none yet)."""
        return self._last_end

    def busy(self, ahead: bool = False) -> bool:
        """Some session draws a page and is not blocked waiting for other work, or one was drawn
        less than ``grace_s`` s ago (``ahead_grace_s`` for the run store's steps ahead: ``ahead``)
        -- its browser draws what it was sent, and asks for more."""
        grace = self.ahead_grace_s if ahead else self.grace_s
        return self.drawing_now - self.blocked_now > 0 or time.monotonic() - self._last_end < grace

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        """A session draws a page in this thread (nested: counted once)."""
        depth = getattr(_LOCAL, "drawing", 0)
        _LOCAL.drawing = depth + 1
        if depth == 0:
            with self.cond:
                self.drawing_now += 1
        try:
            yield
        finally:
            _LOCAL.drawing = depth
            if depth == 0:
                with self.cond:
                    self.drawing_now -= 1
                    self._last_end = time.monotonic()
                    self.cond.notify_all()

    @contextlib.contextmanager
    def blocked(self) -> Iterator[None]:
        """This thread waits for other work meanwhile: while it draws a page, that page does not
        hold back the work done ahead (which may be what it waits for)."""
        counts = getattr(_LOCAL, "drawing", 0) > 0 and not getattr(_LOCAL, "blocked", False)
        if counts:
            _LOCAL.blocked = True
            with self.cond:
                self.blocked_now += 1
                self.cond.notify_all()
        try:
            yield
        finally:
            if counts:
                _LOCAL.blocked = False
                with self.cond:
                    self.blocked_now -= 1

    def wait_idle(self, timeout: float) -> float:
        """Wait until no session is ``busy`` (at most ``timeout`` s; at once when the process is
        exiting); the seconds waited."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        with self.cond:
            while self.busy() and not STOPPING.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                # a short slice: STOPPING is set without this condition
                self.cond.wait(min(left, 0.25))
        return time.monotonic() - t0


VISITORS = Visitors()  # the process's sessions


@contextlib.contextmanager
def yielding() -> Iterator[None]:
    """Work in this thread is done ahead of visitors: its ``stop_point``s wait while they draw."""
    before = getattr(_LOCAL, "yields", False)
    _LOCAL.yields = True
    try:
        yield
    finally:
        _LOCAL.yields = before


_GC_LOCK = threading.Lock()
# threads inside ``collector_paused`` now; whether the collector was on when the first came in
_GC_PAUSED = {"threads": 0, "was_on": True}


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (for the whole process: it has one),
    back on when the last thread inside such a block leaves it, unless it was off before. For a
    short burst of allocation a visitor waits for (a moment of a replay opened: tens of thousands
    of objects unpickled and made): every few hundred new objects start a collection, and the
    oldest generation's walks the server's whole heap (the replays, their histories); together
    a third of that work's time. Only reference cycles are freed later: at the next collection
    after the block."""
    with _GC_LOCK:
        if _GC_PAUSED["threads"] == 0:
            _GC_PAUSED["was_on"] = gc.isenabled()
        _GC_PAUSED["threads"] += 1
        gc.disable()
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_PAUSED["threads"] -= 1
            if _GC_PAUSED["threads"] == 0 and _GC_PAUSED["was_on"]:
                gc.enable()


AHEAD_NICE = 19  # the OS priority of a thread that only works ahead, holding no lock: the lowest


def lower_this_threads_priority(nice: int = AHEAD_NICE) -> bool:
    """Run the calling thread at OS priority ``nice`` (Linux: niceness is per thread); False where
    the platform cannot. Only for a thread that works ahead of visitors and holds no lock a
    visitor waits for (the walk of a stored value's size), and once, for good: it cannot raise
    its priority back unprivileged. Inside the process the GIL is shared whatever the priority
    (``yielding`` is for that); this is for the processes beside the server, above all a browser
    on the same machine loading and drawing a page."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        return False
    return True


class OwnedLock:
    """A lock (``with``, ``acquire``, ``release``, ``locked``) that a yielding thread never waits
    for visitors while holding (``stop_point``), and that a page waiting for it does not count as
    drawing (``Visitors.blocked``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            got = True
        elif not blocking:
            return False
        else:
            with VISITORS.blocked():
                got = self._lock.acquire(True, timeout)
        if got:
            _LOCAL.locks_held = getattr(_LOCAL, "locks_held", 0) + 1
        return got

    def release(self) -> None:
        _LOCAL.locks_held = getattr(_LOCAL, "locks_held", 0) - 1
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _background_thread(target: Callable[..., None], args: tuple, name: str) -> threading.Thread:
    """A background computation's thread: a daemon, so one past STOP_S never holds the exit, and
    listed in ``_BACKGROUND`` while it runs, so ``stop_background`` joins it first."""

    def run() -> None:
        try:
            target(*args)
        finally:
            with _BACKGROUND_LOCK:
                _BACKGROUND.discard(threading.current_thread())

    thread = threading.Thread(target=run, name=name, daemon=True)
    with _BACKGROUND_LOCK:
        _BACKGROUND.add(thread)
    return thread


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


# The one budget (docs/class-server.md). The names are the run store's, which it grew out of.
ENV_BYTES = "PAGED_KV_LAB_RUN_STORE_BYTES"
ENV_HARD_BYTES = "PAGED_KV_LAB_RUN_STORE_HARD_BYTES"
DEFAULT_BYTES = 512 * 10**6


# -- sizes -------------------------------------------------------------------------------------
def estimate_nbytes(obj: Any, _seen: Optional[set] = None, stop_every: int = 0) -> int:
    """Bytes held by a tree of records (dataclasses, tuples, lists, dicts, strings), each object
    counted once. Small ints and interned strings are counted too: an overestimate is safe.
    ``stop_every``: a ``stop_point`` after each that many objects (a walk done ahead of visitors,
    seconds long for a whole replay's log)."""
    seen = set() if _seen is None else _seen
    stack, total, walked = [obj], 0, 0
    while stack:
        walked += 1
        if stop_every and walked % stop_every == 0:
            stop_point()
        o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, (str, bytes, int, float, bool)) or o is None:
            continue
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif is_dataclass(o):
            stack.extend(getattr(o, f.name) for f in fields(o))
            if hasattr(o, "__dict__"):
                # the instance's attribute dict is not in getsizeof(o)
                total += sys.getsizeof(vars(o))
        elif hasattr(o, "__dict__"):
            stack.append(vars(o))
    return total


def _error_nbytes(error: BaseException) -> int:
    return sys.getsizeof(error) + estimate_nbytes(error.args)


# -- the cache ---------------------------------------------------------------------------------
class _Entry:
    __slots__ = ("done", "value", "error", "when", "nbytes", "kind")

    def __init__(self, kind: "Shared") -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None
        self.when = 0.0
        self.nbytes = 0
        self.kind = kind


class ServerCache:
    """Values by (kind, key), computed once, in one LRU bounded by bytes (see the module's
    invariants). Kinds (``Shared``) hold the per-kind rules: size, in use, on evict."""

    def __init__(self, max_bytes: Optional[int] = None, hard_bytes: Optional[int] = None) -> None:
        env = os.environ
        self.max_bytes = int(
            max_bytes if max_bytes is not None else env.get(ENV_BYTES, DEFAULT_BYTES)
        )
        self.hard_bytes = int(
            hard_bytes if hard_bytes is not None else env.get(ENV_HARD_BYTES, 2 * self.max_bytes)
        )
        self.cond = threading.Condition()
        self.total_bytes = 0
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()

    # -- reading (under cond) ------------------------------------------------------------------
    def _ready(self, full: tuple) -> Optional[_Entry]:
        entry = self._entries.get(full)
        return entry if entry is not None and entry.done.is_set() else None

    def __len__(self) -> int:
        with self.cond:
            return len(self._entries)

    def kinds(self) -> dict[str, tuple[int, int]]:
        """Kind name -> (ready entries, their bytes): what the cache holds now."""
        out: dict[str, tuple[int, int]] = {}
        with self.cond:
            for entry in self._entries.values():
                if entry.done.is_set():
                    n, b = out.get(entry.kind.name, (0, 0))
                    out[entry.kind.name] = (n + 1, b + entry.nbytes)
        return out

    # -- computing once ------------------------------------------------------------------------
    def _claim(
        self, kind: "Shared", key: Hashable, again_after: Optional[float] = None
    ) -> tuple[_Entry, bool]:
        """The key's entry, and whether the caller must compute it (a new entry)."""
        full = (kind.ns, key)
        with self.cond:
            entry = self._entries.get(full)
            stale = (
                entry is not None
                and again_after is not None
                and entry.done.is_set()
                and time.monotonic() - entry.when >= again_after
            )
            if entry is not None and not stale:
                self._entries.move_to_end(full)
                return entry, False
            if entry is not None:  # stale: replaced
                self._drop(full, None)
            entry = self._entries[full] = _Entry(kind)
            return entry, True

    def _fill(self, key: Hashable, entry: _Entry, compute: Callable[[], Any]) -> None:
        kind = entry.kind
        full = (kind.ns, key)
        try:
            stop_point()
            value = compute()
            # measured outside the lock (or after it is stored, for a value long to walk)
            nbytes = 0 if kind.measure_later else int(kind.size(value))
            entry.value = value
        except Exception as e:  # kept (or not: the kind says) and raised to every asker
            entry.error, nbytes = e, _error_nbytes(e)
        except BaseException:  # the thread is stopping: its waiters are told
            with self.cond:
                if self._entries.get(full) is entry:
                    del self._entries[full]
            entry.error = RuntimeError(f"{kind.name}: computing {key!r} was interrupted")
            entry.done.set()
            raise
        with self.cond:
            entry.when = time.monotonic()
            mine = self._entries.get(full) is entry  # not forgotten meanwhile (clear)
            if mine and entry.error is not None and not kind.keep_errors:
                del self._entries[full]
            elif mine:
                entry.nbytes = nbytes
                self.total_bytes += nbytes
                if entry.error is None and kind.on_insert is not None:
                    kind.on_insert(entry.value)
                entry.done.set()
                kind._trim(self, full)
                self.evict(keep=full)
                if entry.error is None and kind.measure_later:
                    _background_thread(
                        self._measure, (full, entry), f"shared:{kind.name}:size"
                    ).start()
            entry.done.set()
            self.cond.notify_all()

    def _measure(self, full: tuple, entry: _Entry) -> None:
        """A value's size, walked while its askers already use it (it counts 0 until then)."""
        if STOPPING.is_set():  # the process is exiting: nobody will read the size
            return
        # work ahead of visitors: the lowest OS priority, and it waits while a page is drawn
        lower_this_threads_priority()
        try:
            with yielding():
                size, value = entry.kind.size, entry.value
                if size is estimate_nbytes:
                    nbytes = estimate_nbytes(value, stop_every=MEASURE_STOP_EVERY)
                else:
                    nbytes = int(size(value))
        except Stopping:
            return
        with self.cond:
            if self._entries.get(full) is entry:
                self.total_bytes += nbytes - entry.nbytes
                entry.nbytes = nbytes
                self.evict()

    def get(
        self,
        kind: "Shared",
        key: Hashable,
        compute: Callable[[], T],
        again_after: Optional[float] = None,
    ) -> T:
        entry, mine = self._claim(kind, key, again_after)
        if mine:
            self._fill(key, entry, compute)
        elif not entry.done.is_set():
            with VISITORS.blocked():  # computed elsewhere (perhaps ahead, by the warm-up)
                entry.done.wait()
        return _value(entry)

    def start(self, kind: "Shared", key: Hashable, compute: Callable[[], Any]) -> None:
        entry, mine = self._claim(kind, key)
        if mine:
            _background_thread(self._fill, (key, entry, compute), f"shared:{kind.name}").start()

    def peek(self, kind: "Shared", key: Hashable) -> Any:
        full = (kind.ns, key)
        with self.cond:
            entry = self._ready(full)
            if entry is None:
                return None
            self._entries.move_to_end(full)
        return _value(entry)

    def wait(self, kind: "Shared", key: Hashable, timeout: float) -> Any:
        with self.cond:
            entry = self._entries.get((kind.ns, key))
        if entry is not None and not entry.done.is_set():
            with VISITORS.blocked():
                entry.done.wait(timeout)
        return self.peek(kind, key)

    def ready(self, kind: "Shared", key: Hashable) -> bool:
        with self.cond:
            return self._ready((kind.ns, key)) is not None

    def nbytes(self, kind: "Shared", key: Hashable) -> Optional[int]:
        """The bytes ``key``'s ready value counts for (None if it is not ready)."""
        with self.cond:
            entry = self._ready((kind.ns, key))
            return None if entry is None else entry.nbytes

    def holds(self, kind: "Shared", key: Hashable, value: Any) -> bool:
        """Whether ``value`` is the ready value of ``key`` now."""
        with self.cond:
            entry = self._ready((kind.ns, key))
            return entry is not None and entry.value is value

    def values(self, kind: "Shared") -> list:
        with self.cond:
            return [
                e.value
                for (ns, _), e in self._entries.items()
                if ns == kind.ns and e.done.is_set() and e.error is None
            ]

    def touch(self, kind: "Shared", key: Hashable, value: Any) -> None:
        """``value`` (the ready value of ``key``) was used: it becomes the most recent."""
        full = (kind.ns, key)
        with self.cond:
            entry = self._ready(full)
            if entry is not None and entry.value is value:
                self._entries.move_to_end(full)

    def resize(self, kind: "Shared", key: Hashable, value: Any, nbytes: int) -> None:
        """``value`` (the ready value of ``key``) now holds ``nbytes`` (a run grew or let its
        engine go); the caller evicts when it grew (``evict``)."""
        full = (kind.ns, key)
        with self.cond:
            entry = self._ready(full)
            if entry is not None and entry.value is value:
                self.total_bytes += int(nbytes) - entry.nbytes
                entry.nbytes = int(nbytes)

    # -- forgetting (under cond) ---------------------------------------------------------------
    def _drop(self, full: tuple, hard_total: Optional[int]) -> None:
        entry = self._entries.pop(full)
        if entry.done.is_set():
            self.total_bytes -= entry.nbytes
            if entry.error is None and entry.kind.on_evict is not None:
                entry.kind.on_evict(entry.value, hard_total)

    def evict(self, keep: Optional[tuple] = None) -> None:
        """Forget least recently used entries until the bytes are within ``max_bytes`` (entries
        not in use) and within ``hard_bytes`` (any ready entry); ``keep`` stays."""
        with self.cond:
            for full, entry in list(self._entries.items()):
                if self.total_bytes <= self.max_bytes:
                    break
                if full != keep and entry.done.is_set() and not entry.kind.used(entry):
                    self._drop(full, None)
            for full, entry in list(self._entries.items()):
                if self.total_bytes <= self.hard_bytes:
                    break
                if full != keep and entry.done.is_set():
                    self._drop(full, self.total_bytes)

    def forget(self, kind: "Shared", key: Optional[Hashable] = None) -> None:
        """Forget ``key`` (every key of ``kind`` without one); computations under way still hand
        their values to their waiters."""
        with self.cond:
            for full in [
                f for f in self._entries if f[0] == kind.ns and (key is None or f[1] == key)
            ]:
                self._drop(full, None)


def _value(entry: _Entry) -> Any:
    if entry.error is not None:
        raise entry.error
    return entry.value


_CACHE: Optional[ServerCache] = None
_CACHE_LOCK = threading.Lock()


def default_cache() -> ServerCache:
    """The process-wide cache (its budget from the environment at first use)."""
    global _CACHE
    with _CACHE_LOCK:
        if _CACHE is None:
            _CACHE = ServerCache()
        return _CACHE


# -- one kind of shared value ------------------------------------------------------------------
_SERIAL = itertools.count()


class Shared(Generic[T]):
    """One kind of value every session shares, in a ServerCache (the process's unless
    ``cache``): ``get`` computes a missing value in the asking thread (a second asker waits for
    the first), ``start`` in a background thread and returns at once, ``peek`` returns it if it is
    ready, never waiting. ``get(..., again_after=s)`` replaces a value older than ``s`` seconds.

    ``size(value)``: its bytes (``estimate_nbytes`` unless told); ``in_use(value)``: not evicted
    below the hard limit (``pinned``: always in use); ``on_evict(value, hard_total)``: told when
    it goes (``hard_total``: the cache's bytes when the hard limit made it go, else None);
    ``on_insert(value)``: told when a computed value is stored, under the cache's condition;
    ``keep_errors``: an error stays in place of the value (else the next asker computes again);
    ``measure_later``: the size is walked in a background thread once the value is stored (its
    askers do not wait for it; it counts 0 bytes until then): for values that take seconds to
    walk. ``keep``: at most this many values of the kind besides the byte bound, oldest out
    first. Each instance is its own kind: two of the same name never share values."""

    def __init__(
        self,
        name: str,
        keep: Optional[int] = None,
        *,
        size: Callable[[Any], int] = estimate_nbytes,
        in_use: Optional[Callable[[Any], bool]] = None,
        pinned: bool = False,
        on_evict: Optional[Callable[[Any, Optional[int]], None]] = None,
        on_insert: Optional[Callable[[Any], None]] = None,
        keep_errors: bool = True,
        measure_later: bool = False,
        cache: Optional[ServerCache] = None,
    ) -> None:
        self.name, self.keep = name, keep
        self.ns = (name, next(_SERIAL))
        self.size = size
        self.in_use = (lambda _: True) if pinned else in_use
        self.on_evict, self.on_insert = on_evict, on_insert
        self.keep_errors = keep_errors
        self.measure_later = measure_later
        self._cache = cache

    @property
    def cache(self) -> ServerCache:
        return self._cache if self._cache is not None else default_cache()

    def used(self, entry: _Entry) -> bool:
        return self.in_use is not None and entry.error is None and bool(self.in_use(entry.value))

    def _trim(self, cache: ServerCache, just: tuple) -> None:
        """``keep``: the oldest ready values of this kind past it go (under the cache's cond)."""
        if self.keep is None:
            return
        mine = [f for f, e in cache._entries.items() if f[0] == self.ns and e.done.is_set()]
        for full in mine[: max(0, len(mine) - self.keep)]:
            if full != just:
                cache._drop(full, None)

    def get(
        self, key: Hashable, compute: Callable[[], T], again_after: Optional[float] = None
    ) -> T:
        """The value for ``key``, computed here if no one has (or, with ``again_after``, if the
        last value is older than that many seconds); waits for a computation under way."""
        return self.cache.get(self, key, compute, again_after)

    def start(self, key: Hashable, compute: Callable[[], T]) -> None:
        """Compute ``key`` in a background thread unless it is ready or under way."""
        self.cache.start(self, key, compute)

    def peek(self, key: Hashable) -> Optional[T]:
        """The value if it is ready (its error raised if its computation failed), else None."""
        return self.cache.peek(self, key)

    def wait(self, key: Hashable, timeout: float) -> Optional[T]:
        """``peek``, after waiting up to ``timeout`` s for a computation under way."""
        return self.cache.wait(self, key, timeout)

    def ready(self, key: Hashable) -> bool:
        return self.cache.ready(self, key)

    def clear(self) -> None:
        """Forget every value of this kind (computations under way still hand theirs to their
        waiters)."""
        self.cache.forget(self)

    def values(self) -> list[T]:
        return self.cache.values(self)

    def nbytes(self, key: Hashable) -> Optional[int]:
        """The bytes ``key``'s value counts for in the cache (None if it is not ready)."""
        return self.cache.nbytes(self, key)
