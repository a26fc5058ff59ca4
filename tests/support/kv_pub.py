"""A scripted KV-event publisher for tests: vLLM's frames and replay protocol on 127.0.0.1,
with the power to leave a seq out of the live stream (it stays in the replay buffer)."""

from __future__ import annotations

import base64
import json
import threading
import time

import zmq

from kvcore.distributed.kv_events import END_SEQ
from support.paths import FIXTURES

# real vLLM 0.33.0 frames
FIXTURES = FIXTURES / "vllm-kv-events"


def fixture(name: str) -> tuple[dict, list[tuple[str, int, bytes]]]:
    expected = json.loads((FIXTURES / f"{name}.expected.json").read_text())
    frames = []
    for line in (FIXTURES / f"{name}.frames.jsonl").read_text().splitlines():
        if line.strip():
            f = json.loads(line)
            frames.append((f["topic"], f["seq"], base64.b64decode(f["payload_b64"])))
    return expected, frames


def bind_free(sock: zmq.Socket, port: int = 0) -> int:
    sock.bind(f"tcp://127.0.0.1:{port}")
    return int(sock.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])


class ScriptedPublisher:
    """PUB + ROUTER bound on 127.0.0.1; ``send`` publishes live, everything sent is replayable."""

    def __init__(self, ctx: zmq.Context, pub_port: int = 0, replay_port: int = 0) -> None:
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.pub_port = bind_free(self.pub, pub_port)
        self.replay_port = bind_free(self.router, replay_port)
        self.buffer: list[tuple[bytes, int, bytes]] = []
        self.replay_requests = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.pub_port}"

    @property
    def replay_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    def send(self, topic: str, seq: int, payload: bytes, live: bool = True) -> None:
        with self._lock:
            self.buffer.append((topic.encode(), seq, payload))
            if live:
                self.pub.send_multipart([topic.encode(), seq.to_bytes(8, "big"), payload])

    def send_raw(self, frames: list[bytes]) -> None:
        with self._lock:
            self.pub.send_multipart(frames)

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(50):
                continue
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start = frames
            start_seq = int.from_bytes(start, "big")
            with self._lock:
                self.replay_requests += 1
                for topic, seq, payload in self.buffer:
                    if seq >= start_seq:
                        self.router.send_multipart(
                            [ident, b"", topic, seq.to_bytes(8, "big"), payload]
                        )
                self.router.send_multipart([ident, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.pub.close(0)
        self.router.close(0)


def wait_for(cond, timeout: float = 10.0, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(interval)
    return cond()
