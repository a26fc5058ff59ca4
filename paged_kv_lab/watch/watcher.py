"""Watch a vLLM server's prefix cache through its KV events (ZeroMQ + msgpack).

``KVEventWatcher`` subscribes to one publisher per data-parallel rank, puts
each rank's batches in seq order (replaying gaps from the server's ROUTER
socket, clearing on a restart) and applies them to that rank's
``PrefixCacheIndex`` (watch/prefix_index.py).

Nothing here imports a UI. Everything a socket delivers is untrusted: wrong
frame counts, bad seqs, oversized or undecodable payloads are counted in
``WatchStats`` and skipped; memory is bounded by ``max_hashes`` and the
history and log lengths.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import tempfile
import threading
import time
import weakref
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import msgspec
import zmq

from kvcore.distributed.kv_events import (
    END_SEQ,
    MEDIUM_GPU,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    offset_endpoint_port,
)
from paged_kv_lab.watch.prefix_index import (
    MAX_HASHES,
    CacheEntry,
    HashBudget,
    PrefixCacheIndex,
    describe_batch,
)

MAX_PAYLOAD_BYTES = 8 << 20  # larger payloads are counted as oversized and dropped
HISTORY_SECONDS = 600  # per-second rates and cached-block counts kept
LOG_LINES = 500
REPLAY_TIMEOUT_S = 3.0
IDLE_REPLAY_S = 1.0  # idle this long: ask for a replay to catch a trailing batch
MAX_PENDING = 1000  # live batches held while a gap is being replayed...
MAX_PENDING_BYTES = 64 << 20  # ...and their bytes (beyond: dropped, the replay brings them)
OVERSIZED = b"\x00oversized"  # stands in for a payload over the size cap


@dataclass
class WatchStats:
    """Counters a user can read to trust (or not) what is shown."""

    batches: int = 0
    events: int = 0
    replayed_batches: int = 0
    duplicates: int = 0
    gaps: int = 0
    lost_batches: int = 0  # seqs neither the live stream nor the replay buffer had
    restarts: int = 0
    garbage_messages: int = 0  # wrong frame counts, bad seq frames, undecodable payloads
    oversized_messages: int = 0
    hashes_over_cap: int = 0


@dataclass
class RankView:
    rank: int
    endpoint: str
    replay_endpoint: Optional[str]
    next_seq: Optional[int]
    state: dict
    media: list
    group_info: dict


@dataclass
class WatchSnapshot:
    """A copy of the watcher's state at one moment (safe to read from any thread)."""

    connected: bool
    ranks: list[RankView]
    stats: WatchStats
    history: list[dict]
    log: list[str]
    error: Optional[str] = None

    def dump(self) -> dict:
        """``--dump-state``: the lowest rank's GPU tier at the top (the fixtures' shape), every rank
        below."""
        top = self.ranks[0].state if self.ranks else {"groups": {}}
        return {
            "groups": top["groups"],
            "ranks": {
                str(r.rank): {
                    "next_seq": r.next_seq,
                    "media": r.media,
                    "group_info": r.group_info,
                    "state": r.state,
                }
                for r in self.ranks
            },
            "stats": asdict(self.stats),
        }


class _Rank:
    """One publisher: its sockets, the next seq it owes us, and its rebuilt cache."""

    def __init__(
        self, rank: int, endpoint: str, replay_endpoint: Optional[str], budget: HashBudget
    ) -> None:
        self.rank = rank
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.index = PrefixCacheIndex(budget)
        self.next_seq: Optional[int] = None  # None: nothing applied yet
        self.digests: dict[int, bytes] = {}  # seq -> payload digest, for duplicate vs restart
        self.pending: dict[int, bytes] = {}  # live batches ahead of a gap
        self.pending_bytes = 0
        self.replay_sent_at: Optional[float] = None
        self.last_message_at = time.monotonic()
        self.sub: Optional[zmq.Socket] = None
        self.dealer: Optional[zmq.Socket] = None


# Watchers still running at interpreter exit are stopped first (their threads are daemons).
_RUNNING_WATCHERS: "weakref.WeakSet[KVEventWatcher]" = weakref.WeakSet()


@atexit.register
def _stop_running_watchers() -> None:
    for w in list(_RUNNING_WATCHERS):
        w.stop()


class KVEventWatcher:
    """Subscribes to KV events of ``data_parallel_size`` ranks and keeps their prefix caches.

    ``bind`` makes the SUB sockets bind (for a vLLM whose PUB connects, i.e. an
    endpoint that is a host address); otherwise they connect. Replay sockets
    always connect (vLLM binds them). Use ``start()``/``stop()`` for a background
    thread or ``run()`` in the calling thread; ``snapshot()`` is thread-safe.
    ``on_batch(rank, seq, batch, replayed)`` is called in the watcher thread.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: Optional[str] = None,
        topic: str = "",
        bind: bool = False,
        data_parallel_size: int = 1,
        *,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        max_hashes: int = MAX_HASHES,
        on_batch: Optional[Callable[[int, int, KVEventBatch, bool], None]] = None,
        context: Optional[zmq.Context] = None,
    ) -> None:
        if not isinstance(endpoint, str) or not endpoint.startswith(
            ("tcp://", "ipc://", "inproc://")
        ):
            raise ValueError(
                f"endpoint must be tcp://HOST:PORT, ipc://PATH or inproc://NAME; got {endpoint!r}"
            )
        if replay_endpoint is not None and not replay_endpoint.startswith(
            ("tcp://", "ipc://", "inproc://")
        ):
            raise ValueError(
                f"replay endpoint must be tcp://, ipc:// or inproc://; got {replay_endpoint!r}"
            )
        if not 1 <= data_parallel_size <= 64:
            raise ValueError(f"data_parallel_size must be 1..64; got {data_parallel_size!r}")
        self.topic = topic
        self.bind = bind
        self.max_payload_bytes = max_payload_bytes
        self.on_batch = on_batch
        self._ctx = context or zmq.Context.instance()
        self._budget = HashBudget(max_hashes)
        self.ranks = [
            _Rank(
                r,
                offset_endpoint_port(endpoint, r),
                offset_endpoint_port(replay_endpoint, r),
                self._budget,
            )
            for r in range(data_parallel_size)
        ]
        self.stats = WatchStats()
        self._history: deque[dict] = deque(maxlen=HISTORY_SECONDS)
        self._log: deque[str] = deque(maxlen=LOG_LINES)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.connected = threading.Event()
        self.error: Optional[str] = None
        self._bucket_start = int(time.time())
        self._bucket = {"stored": 0, "removed": 0, "cleared": 0}

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> "KVEventWatcher":
        self._thread = threading.Thread(
            target=self._run_safely, daemon=True, name="kv-events-watcher"
        )
        self._thread.start()
        _RUNNING_WATCHERS.add(self)
        return self

    def stop(self, timeout: float = 3.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run_safely(self) -> None:
        try:
            self.run()
        except Exception as e:  # a socket error must end this watcher, not the server
            self.error = f"{type(e).__name__}: {e}"

    def run(
        self, duration: Optional[float] = None, on_idle: Optional[Callable[[], None]] = None
    ) -> None:
        """Watch until stop() (or ``duration`` seconds); sockets live and die in this thread."""
        deadline = None if duration is None else time.monotonic() + duration
        poller = zmq.Poller()
        try:
            for r in self.ranks:
                r.sub = self._ctx.socket(zmq.SUB)
                r.sub.setsockopt(zmq.LINGER, 0)
                r.sub.setsockopt(zmq.RCVHWM, 100_000)
                # A hard ceiling in libzmq (it drops the connection); below it, payloads over
                # max_payload_bytes are read, counted and dropped by _receive.
                r.sub.setsockopt(zmq.MAXMSGSIZE, 8 * self.max_payload_bytes)
                r.sub.setsockopt_string(zmq.SUBSCRIBE, self.topic)
                if self.bind:
                    r.sub.bind(r.endpoint)
                    r.endpoint = r.sub.getsockopt_string(zmq.LAST_ENDPOINT) or r.endpoint
                else:
                    r.sub.connect(r.endpoint)
                poller.register(r.sub, zmq.POLLIN)
                if r.replay_endpoint is not None:
                    r.dealer = self._ctx.socket(zmq.DEALER)
                    r.dealer.setsockopt(zmq.LINGER, 0)
                    r.dealer.setsockopt(zmq.MAXMSGSIZE, 8 * self.max_payload_bytes)
                    r.dealer.connect(r.replay_endpoint)
                    poller.register(r.dealer, zmq.POLLIN)
            time.sleep(0.2)  # let the subscription reach the publisher before asking for a replay
            for r in self.ranks:
                self._request_replay(r, 0)
            self.connected.set()
            self._log_line(
                f"connected to {', '.join(r.endpoint for r in self.ranks)}"
                + (" (bound)" if self.bind else "")
            )
            while not self._stop.is_set() and (deadline is None or time.monotonic() < deadline):
                ready = dict(poller.poll(100))
                for r in self.ranks:
                    if r.sub in ready:
                        self._drain(r, r.sub, replayed=False)
                    if r.dealer is not None and r.dealer in ready:
                        self._drain(r, r.dealer, replayed=True)
                    self._maybe_retry_replay(r)
                self._roll_history()
                if on_idle is not None:
                    on_idle()
        finally:
            for r in self.ranks:
                for s in (r.sub, r.dealer):
                    if s is not None:
                        s.close(linger=0)
                r.sub = r.dealer = None

    # -- receiving -----------------------------------------------------------------------
    def _drain(self, r: _Rank, sock: zmq.Socket, replayed: bool) -> None:
        for _ in range(1000):  # bounded per poll round, so other ranks get their turn
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
            r.last_message_at = time.monotonic()
            if replayed:
                if len(frames) != 4 or frames[0] != b"":
                    self._count_garbage("replay message with the wrong frames")
                    continue
                frames = frames[1:]
                if frames[1] == END_SEQ:
                    self._replay_done(r)
                    continue
            if len(frames) != 3:
                self._count_garbage(f"message with {len(frames)} frames (expected 3)")
                continue
            _topic, seq_bytes, payload = frames
            if len(seq_bytes) != 8:
                self._count_garbage(f"seq frame of {len(seq_bytes)} bytes (expected 8)")
                continue
            self._receive(r, int.from_bytes(seq_bytes, "big"), payload, replayed)

    def _receive(self, r: _Rank, seq: int, payload: bytes, replayed: bool) -> None:
        if len(payload) > self.max_payload_bytes:
            # Counted and dropped here, but its seq still takes its turn (and is used up), so a
            # huge batch is neither kept in memory nor asked for again.
            with self._lock:
                self.stats.oversized_messages += 1
            self._log_line(
                f"rank {r.rank} seq {seq}: dropped a {len(payload)}-byte payload "
                f"(limit {self.max_payload_bytes})"
            )
            payload = OVERSIZED
        if r.next_seq is None:
            # With a replay socket we start from the server's whole buffer (seq 0 on);
            # without one, from whatever arrives first.
            r.next_seq = 0 if r.replay_endpoint is not None else seq
        if seq < r.next_seq:
            digest = r.digests.get(seq)
            if digest is not None and digest == _digest(payload):
                with self._lock:
                    self.stats.duplicates += 1
                return
            self._restart(r, seq)
        if seq > r.next_seq:
            if r.replay_endpoint is None:
                self._lost(r, seq - r.next_seq)
                r.next_seq = seq
            elif replayed:
                self._lost(r, seq - r.next_seq)  # older than the server's replay buffer
                r.next_seq = seq
            else:
                if (
                    len(r.pending) < MAX_PENDING
                    and r.pending_bytes + len(payload) <= MAX_PENDING_BYTES
                ):
                    r.pending[seq] = payload
                    r.pending_bytes += len(payload)
                if r.replay_sent_at is None:
                    with self._lock:
                        self.stats.gaps += 1
                    self._log_line(
                        f"rank {r.rank}: gap before seq {seq} (expected {r.next_seq}); replaying"
                    )
                    self._request_replay(r, r.next_seq)
                return
        self._apply(r, seq, payload, replayed)
        self._apply_pending(r)

    def _apply(self, r: _Rank, seq: int, payload: bytes, replayed: bool) -> None:
        r.next_seq = seq + 1  # the sender never sends this seq again, good or bad
        r.digests[seq] = _digest(payload)
        if len(r.digests) > 20_000:
            for old in sorted(r.digests)[:10_000]:
                del r.digests[old]
        if payload is OVERSIZED:
            return
        try:
            batch = decode_batch(payload)
        except (msgspec.DecodeError, ValueError):
            self._count_garbage(f"rank {r.rank} seq {seq}: payload is not a KVEventBatch")
            return
        with self._lock:
            before = self._budget.refused
            for ev in batch.events:
                r.index.apply(ev)
                if isinstance(ev, BlockStored):
                    self._bucket["stored"] += len(ev.block_hashes)
                elif isinstance(ev, BlockRemoved):
                    self._bucket["removed"] += len(ev.block_hashes)
                else:
                    self._bucket["cleared"] += 1
            self.stats.hashes_over_cap += self._budget.refused - before
            self.stats.batches += 1
            self.stats.events += len(batch.events)
            if replayed:
                self.stats.replayed_batches += 1
        self._log_line(describe_batch(r.rank, seq, batch, replayed))
        if self.on_batch is not None:
            self.on_batch(r.rank, seq, batch, replayed)

    def _apply_pending(self, r: _Rank) -> None:
        for seq in [s for s in r.pending if s < r.next_seq]:
            r.pending_bytes -= len(r.pending.pop(seq))
        while r.next_seq in r.pending:
            seq = r.next_seq
            payload = r.pending.pop(seq)
            r.pending_bytes -= len(payload)
            self._apply(r, seq, payload, replayed=False)

    def _replay_done(self, r: _Rank) -> None:
        r.replay_sent_at = None
        self._apply_pending(r)
        if r.pending:  # the server no longer has what lies before them
            first = min(r.pending)
            self._lost(r, first - r.next_seq)
            r.next_seq = first
            self._apply_pending(r)

    def _maybe_retry_replay(self, r: _Rank) -> None:
        if r.dealer is None:
            return
        now = time.monotonic()
        if r.replay_sent_at is not None:
            if now - r.replay_sent_at > REPLAY_TIMEOUT_S:
                r.replay_sent_at = None  # no answer: ask again on the next idle tick
            return
        if now - r.last_message_at > IDLE_REPLAY_S:
            self._request_replay(r, r.next_seq or 0)
            r.last_message_at = now

    def _request_replay(self, r: _Rank, start_seq: int) -> None:
        if r.dealer is None:
            return
        try:
            r.dealer.send_multipart([b"", start_seq.to_bytes(8, "big")], zmq.NOBLOCK)
            r.replay_sent_at = time.monotonic()
        except zmq.Again:
            pass

    def _restart(self, r: _Rank, seq: int) -> None:
        with self._lock:
            self.stats.restarts += 1
            r.index.clear()
        r.digests.clear()
        r.pending.clear()
        r.pending_bytes = 0
        self._log_line(
            f"rank {r.rank}: seq went back to {seq} (expected {r.next_seq}): "
            "the publisher restarted, state cleared"
        )
        r.next_seq = seq
        if seq > 0 and r.dealer is not None:
            r.next_seq = 0
            self._request_replay(r, 0)

    def _lost(self, r: _Rank, n: int) -> None:
        with self._lock:
            self.stats.lost_batches += n
        self._log_line(
            f"rank {r.rank}: {n} batch(es) lost before seq {r.next_seq + n}: "
            "the cache shown may miss them"
        )

    def _count_garbage(self, why: str) -> None:
        with self._lock:
            self.stats.garbage_messages += 1
        self._log_line(f"skipped: {why}")

    # -- reading -------------------------------------------------------------------------
    def _log_line(self, line: str) -> None:
        with self._lock:
            self._log.append(f"{time.strftime('%H:%M:%S')} {line}")

    def _roll_history(self) -> None:
        now = int(time.time())
        if now == self._bucket_start:
            return
        with self._lock:
            cached = {}
            for r in self.ranks:
                for (medium, group), n in r.index.num_blocks().items():
                    cached[f"rank {r.rank} {medium} group {group}"] = n
            self._history.append({"t": self._bucket_start, **self._bucket, "cached": cached})
            self._bucket_start = now
            self._bucket = {"stored": 0, "removed": 0, "cleared": 0}

    def snapshot(self, with_state: bool = True) -> WatchSnapshot:
        """A copy of everything; ``with_state=False`` leaves out the (large) per-rank GPU state."""
        with self._lock:
            ranks = [
                RankView(
                    r.rank,
                    r.endpoint,
                    r.replay_endpoint,
                    r.next_seq,
                    r.index.state(MEDIUM_GPU) if with_state else {"groups": {}},
                    r.index.media(),
                    {g: asdict(i) for g, i in r.index.group_info.items()},
                )
                for r in self.ranks
            ]
            return WatchSnapshot(
                self.connected.is_set() and self.running_or_inline(),
                ranks,
                WatchStats(**asdict(self.stats)),
                list(self._history),
                list(self._log),
                self.error,
            )

    def running_or_inline(self) -> bool:
        return self._thread is None or self._thread.is_alive()

    def tiers(self, rank: int = 0) -> list[tuple[str, str]]:
        """The (medium, group) pairs this rank holds blocks in."""
        with self._lock:
            return sorted(self.ranks[rank].index.tiers)

    def entries(
        self, rank: int = 0, medium: str = MEDIUM_GPU, group: str = "0"
    ) -> dict[str, CacheEntry]:
        """A copy of one tier's entries."""
        with self._lock:
            tier = self.ranks[rank].index.tiers.get((medium, group), {})
            return {h: CacheEntry(**asdict(e)) for h, e in tier.items()}


def write_json_atomic(path: str, obj: dict) -> None:
    """Write JSON to a temp file next to ``path`` and rename it over: readers never see half a
    file."""
    target = os.path.abspath(path)
    fd, tmp = tempfile.mkstemp(prefix=".kv-state-", suffix=".json", dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _digest(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=8).digest()
