"""A demo source of KV events: our engine publishing as vLLM does, so the Live vLLM page has
something real to watch without a vLLM server.

``DemoSource`` steps a fleet (fleet/fleet.py: a trace replayed model-free, one replica being
a single server; or a scenario on the real model, :class:`EngineFeed` for one engine,
fleet/model_fleet.py's ``model_fleet`` for several) and puts each replica's KV event batches
on ZeroMQ with kvcore's ``ZmqEventPublisher``, vLLM's wire format byte for byte: replica r is
data-parallel rank r (its PUB on port + r, its replay ROUTER on replay port + r). A host
endpoint such as ``tcp://127.0.0.1:5557`` makes the PUB connect, as vLLM's does, so the watcher
binds it (``--bind``; the Live page's "bind" box); the replay sockets bind on loopback. Batches
go out at ``pace_ms`` apart, in the order the replicas published them.
"""

from __future__ import annotations

import atexit
import socket
import threading
import time
import weakref
from collections import deque
from itertools import islice
from typing import Optional

from kvcore.distributed.kv_events import ZmqEventPublisher, encode_batch

DEFAULT_PACE_MS = 150.0
STOP_AT_EXIT_S = 5.0


def free_port_run(
    count: int, host: str = "127.0.0.1", start: int = 20000, stop: int = 60000
) -> int:
    """The first port p (from ``start``) with p .. p + count - 1 all free to bind on ``host``
    now (another process may still take one before it is used)."""
    p = start
    while p + count <= stop:
        ok = True
        for q in range(p, p + count):
            with socket.socket() as s:
                try:
                    s.bind((host, q))
                except OSError:
                    ok = False
                    p = q + 1
                    break
        if ok:
            return p
    raise OSError(f"no {count} consecutive free ports on {host} in {start}..{stop}")


class DemoSource:
    """A fleet's KV events published live. Invariant: every batch a replica published is sent,
    in its publishing order, on that replica's rank; ``sent`` counts them.

    ``start()`` runs the fleet in a thread (``stop()`` ends it and closes the sockets);
    ``run()`` runs it here. Once the trace is done the publishers stay up (their replay buffers
    answer late watchers) until stopped or ``linger_s`` passed. A source still running at
    interpreter exit is stopped then (its thread, a daemon, ends after the step it is in)."""

    def __init__(
        self,
        fleet,
        endpoint: str,
        replay_endpoint: Optional[str],
        topic: str = "",
        pace_ms: float = DEFAULT_PACE_MS,
        linger_s: float = 600.0,
    ) -> None:
        self.fleet = fleet
        self.pace_s = max(0.0, pace_ms / 1000.0)
        self.linger_s = linger_s
        self.publishers: list[ZmqEventPublisher] = []
        try:
            for r in range(len(fleet.replicas)):
                self.publishers.append(ZmqEventPublisher(r, endpoint, replay_endpoint, topic=topic))
        except Exception:
            self.close()
            raise
        self._queue: deque[tuple[int, bytes]] = deque()
        fleet.add_listener(lambda r, _clock, payload: self._queue.append((r, payload)))
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.sent = 0
        self.error: Optional[str] = None
        self.finished = threading.Event()

    @property
    def endpoints(self) -> list[str]:
        return [p.endpoint for p in self.publishers]

    def start(self) -> "DemoSource":
        self._thread = threading.Thread(target=self._run_safely, daemon=True, name="kv-demo")
        self._thread.start()
        _RUNNING_SOURCES.add(self)
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run_safely(self) -> None:
        try:
            self.run()
        except Exception as e:  # shown by the page; the thread must not die silently
            self.error = f"{type(e).__name__}: {e}"

    def run(self) -> None:
        fleet = self.fleet
        try:
            while not self._stop.is_set() and not fleet.routed_all:
                fleet.step()
                self._send_queued()
            if not self._stop.is_set():
                fleet.finish()
                self._send_queued()
            self.finished.set()
            self._stop.wait(self.linger_s)
        finally:
            self.close()

    def _send_queued(self) -> None:
        while self._queue and not self._stop.is_set():
            r, payload = self._queue.popleft()
            self.publishers[r].publish_payload(payload)
            self.sent += 1
            if self.pace_s:
                self._stop.wait(self.pace_s)

    def stop(self, timeout: float = 3.0) -> None:
        _RUNNING_SOURCES.discard(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.close()

    def close(self) -> None:
        for p in self.publishers:
            p.shutdown()
        self.publishers = []


# Sources still running at interpreter exit are stopped first: a daemon thread torn down in the
# middle of a model step or a ZeroMQ call while the interpreter finalizes can abort the process.
_RUNNING_SOURCES: "weakref.WeakSet[DemoSource]" = weakref.WeakSet()


@atexit.register
def _stop_running_sources() -> None:
    for source in list(_RUNNING_SOURCES):
        source.stop(STOP_AT_EXIT_S)


class EngineFeed:
    """One engine stepping its scenario (arrivals, batching, preemption as in ``kvcore run``),
    read by :class:`DemoSource` as a fleet of one replica, data-parallel rank 0.

    Invariant: each step that queued KV events gives the listeners one payload, the step's
    ``KVEventBatch`` exactly as the engine would publish it (its settings' ``kv_events`` decide
    the hash form), in step order."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.replicas = [engine]
        self._listeners: list = []

    def add_listener(self, fn) -> None:
        """``fn(replica, step, payload)`` for every batch."""
        self._listeners.append(fn)

    @property
    def routed_all(self) -> bool:
        return not self.engine.has_unfinished()

    def step(self) -> None:
        rec = self.engine.step()
        batch = self.engine.last_kv_event_batch
        if batch is not None:
            payload = encode_batch(batch)
            for fn in self._listeners:
                fn(0, rec.step, payload)

    def finish(self) -> None:
        """Nothing waits outside the engine: the last step finished everything."""


def demo_fleet(
    trace=None,
    requests: int = 60,
    replicas: int = 3,
    policy: str = "prefix",
    engine: Optional[dict] = None,
):
    """The fleet the demo button replays: the shipped trace's first ``requests`` requests,
    ``replicas`` replicas with pools small enough to evict (512-token blocks), timestamps
    arrival."""
    from paged_kv_lab.fleet.trace_fleet import trace_fleet
    from paged_kv_lab.workloads import SHIPPED_TRACE
    from paged_kv_lab.workloads.replay import replay_settings
    from paged_kv_lab.workloads.trace_formats import parse_trace

    if trace is None:
        with open(SHIPPED_TRACE, "rb") as f:  # only the lines it replays
            trace = parse_trace(islice(f, requests), "mooncake_synthetic_trace.jsonl")
    settings = replay_settings(
        trace, engine or {"block_size": 512, "num_gpu_blocks": 300}, arrival="timestamps"
    )
    return trace_fleet(trace, settings, replicas, policy)


def wait_until(pred, timeout: float, every: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(every)
    return pred()
