"""vLLM 0.34's KV cache events on the wire (vllm.distributed.kv_events, the same file as 0.33's).

The structs below encode to the same msgpack bytes as vLLM's: a batch is an
array ``[ts, events, data_parallel_rank]``; each event is a map whose first key
is ``"type"`` (the class name), then the fields in declaration order, fields
equal to their default (None) left out. The byte layout is documented in the
fixtures' README (shared/fixtures/vllm-kv-events).

``ZmqEventPublisher`` puts batches on ZeroMQ as vLLM does: PUB frames
(topic, 8-byte big-endian seq, payload), a ROUTER replay socket that answers
``[identity, b"", start_seq]`` with every buffered batch from start_seq and an
end marker, and data-parallel rank r on port + r. A publisher not shut down by
interpreter exit is shut down then (its thread is a daemon, in ZeroMQ calls).
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections import deque
from itertools import count
from typing import Any, Optional, Union

import msgspec
import zmq

from kvcore.config.kv_events import KVEventsConfig
from kvcore.core.kv_cache_utils import ExternalBlockHash, maybe_convert_block_hash

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"

# The spec kinds vLLM 0.34 puts in BlockStored.kv_cache_spec_kind (its KVCacheSpecKind).
KV_CACHE_SPEC_KINDS = (
    "full_attention",
    "mla_attention",
    "sliding_window",
    "sliding_window_mla",
    "mamba",
    "chunked_local_attention",
    "sink_full_attention",
    "encoder_only_attention",
    "cross_attention",
    "unknown",
)

END_SEQ = (-1).to_bytes(8, "big", signed=True)  # the replay stream's end marker


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the events: tagged by class name, encoded as a map (not array_like since 0.33)."""


class BlockStored(KVCacheEvent):
    """Full blocks of one request entered one group's prefix cache.

    ``token_ids`` always covers the whole range from the first block after the
    request's already-cached ones to its last full block; with sparse
    sliding-window retention ``block_hashes`` lists only the blocks kept, so the
    two need not line up.
    """

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None
    session_id: Optional[str] = None
    lookahead_token_ids: Optional[list[list[int]]] = None


class BlockRemoved(KVCacheEvent):
    """One cached block lost its hash (one hash per event from the BlockPool)."""

    block_hashes: list[ExternalBlockHash]
    medium: Optional[str]
    group_idx: Optional[int] = None
    locality: Optional[str] = None
    ownership: Optional[str] = None


class AllBlocksCleared(KVCacheEvent):
    """reset_prefix_cache succeeded: every hash of every group is gone."""


KVCacheEventType = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVEventBatch(EventBatch):
    events: list[KVCacheEventType]


# Releases before 0.33 sent each event as an array ["BlockStored", hashes, parent, ...]
# (array_like), with fewer trailing fields. Read them too, into the structs above (0.33's map
# format, which 0.34 keeps).
class _LegacyEvent(msgspec.Struct, array_like=True, tag=True, gc=False):
    pass


class _LegacyBlockStored(_LegacyEvent, tag="BlockStored"):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: Optional[ExternalBlockHash]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int] = None
    medium: Optional[str] = None
    lora_name: Optional[str] = None
    extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
    group_idx: Optional[int] = None


class _LegacyBlockRemoved(_LegacyEvent, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: Optional[str] = None
    group_idx: Optional[int] = None


class _LegacyAllBlocksCleared(_LegacyEvent, tag="AllBlocksCleared"):
    pass


class _LegacyBatch(EventBatch):
    events: list[Union[_LegacyBlockStored, _LegacyBlockRemoved, _LegacyAllBlocksCleared]]


_MODERN = {
    _LegacyBlockStored: BlockStored,
    _LegacyBlockRemoved: BlockRemoved,
    _LegacyAllBlocksCleared: AllBlocksCleared,
}

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_legacy_decoder = msgspec.msgpack.Decoder(_LegacyBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """Decode one payload (map events, as 0.33 and 0.34 send them, or older array events); raises
    msgspec.DecodeError (a ValueError) on anything else."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError:
        try:
            old = _legacy_decoder.decode(payload)
        except msgspec.DecodeError:
            pass
        else:
            events = [
                _MODERN[type(e)](**{f: getattr(e, f) for f in e.__struct_fields__})
                for e in old.events
            ]
            return KVEventBatch(ts=old.ts, events=events, data_parallel_rank=old.data_parallel_rank)
        raise


def hash_text(h: ExternalBlockHash) -> str:
    """A wire hash as text: 16 hex digits for a uint64, all bytes in hex otherwise."""
    if isinstance(h, int):
        return f"{h:016x}"
    return bytes(h).hex()


def external_hash_text(block_hash: bytes, use_int_block_hashes: bool = True) -> str:
    """A block hash as its KV event carries it, as text: what an index built from the events
    keys its entries by."""
    return hash_text(maybe_convert_block_hash(block_hash, use_int_block_hashes))


def event_to_dict(ev: KVCacheEventType) -> dict:
    """Every field by name in struct order (defaults as None), hashes as hex text, tuples as
    lists."""
    out: dict[str, Any] = {"type": type(ev).__name__}
    for name in ev.__struct_fields__:
        v = getattr(ev, name)
        if name == "block_hashes":
            v = [hash_text(h) for h in v]
        elif name == "parent_block_hash" and v is not None:
            v = hash_text(v)
        out[name] = msgspec.json.decode(msgspec.json.encode(v))  # tuples become lists
    return out


def offset_endpoint_port(endpoint: Optional[str], data_parallel_rank: int) -> Optional[str]:
    """Data-parallel rank r uses port + r (inproc://x becomes inproc://x_dp<r>); port 0 stays 0."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        base, sep, port = endpoint.rpartition(":")
        if not sep or not port.isdigit():
            return endpoint
        return endpoint if int(port) == 0 else f"{base}:{int(port) + data_parallel_rank}"
    raise ValueError(f"invalid endpoint {endpoint!r}: must contain 'inproc' or 'tcp'")


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM binds its PUB socket for wildcard, ipc and inproc endpoints and connects otherwise."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def bind_socket(sock: zmq.Socket, endpoint: str) -> str:
    """Bind and return the endpoint actually bound (an OS-chosen port filled in)."""
    sock.bind(endpoint)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT) or endpoint


class ZmqEventPublisher:
    """Publishes KVEventBatches on ZeroMQ exactly as vLLM's ZmqEventPublisher does.

    One thread owns both sockets: it sends each queued batch with the next seq
    (0, 1, 2, ... never skipping), keeps the last ``buffer_steps`` payloads and,
    between sends, answers replay requests on the ROUTER socket. ``publish``
    only enqueues, so the engine step never waits on the network.
    """

    SHUTDOWN_TIMEOUT = 1.0

    def __init__(
        self,
        data_parallel_rank: int = 0,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: Optional[str] = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
        context: Optional[zmq.Context] = None,
    ) -> None:
        self.data_parallel_rank = data_parallel_rank
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._ctx = context or zmq.Context.instance()
        self._topic = topic.encode("utf-8")
        self._seq = count()
        self.endpoint = offset_endpoint_port(endpoint, data_parallel_rank)
        self.replay_endpoint = offset_endpoint_port(replay_endpoint, data_parallel_rank)
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._replay: Optional[zmq.Socket] = None
        try:
            if is_bind_endpoint(self.endpoint):
                self.endpoint = bind_socket(self._pub, self.endpoint)
            else:
                self._pub.connect(self.endpoint)
            if self.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                # Room for a whole replay plus its end marker for a slow reader.
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self.replay_endpoint = bind_socket(self._replay, self.replay_endpoint)
        except zmq.ZMQError:
            self._close_sockets()
            raise
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-events-publisher")
        self._thread.start()
        _RUNNING_PUBLISHERS.add(self)

    @classmethod
    def from_config(
        cls, config: KVEventsConfig, data_parallel_rank: int = 0
    ) -> "ZmqEventPublisher":
        return cls(
            data_parallel_rank,
            config.endpoint,
            config.replay_endpoint,
            config.buffer_steps,
            config.hwm,
            config.max_queue_size,
            config.topic,
        )

    def publish(self, batch: EventBatch) -> None:
        if not self._running:
            raise RuntimeError("the publisher is shut down")
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.data_parallel_rank
        self._queue.put(batch)

    def publish_payload(self, payload: bytes) -> None:
        """Send bytes already encoded as a KVEventBatch (replaying a recording)."""
        if not self._running:
            raise RuntimeError("the publisher is shut down")
        self._queue.put(bytes(payload))

    def shutdown(self) -> None:
        """Send what is queued (up to SHUTDOWN_TIMEOUT), stop the thread, close the sockets."""
        if not self._running:
            return
        _RUNNING_PUBLISHERS.discard(self)
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout=self.SHUTDOWN_TIMEOUT + 1.0)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is None:
                break
            payload = item if isinstance(item, bytes) else encode_batch(item)
            seq = next(self._seq)
            seq_bytes = seq.to_bytes(8, "big")
            try:
                self._pub.send_multipart((self._topic, seq_bytes, payload))
            except zmq.ZMQError:
                pass  # PUB never blocks; a closed context ends the thread below
            self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return  # not [identity, b"", start_seq]: vLLM logs and ignores it
        ident, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart(
                    (ident, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((ident, b"", b"", END_SEQ, b""))


# Publishers still running at interpreter exit are shut down then: a daemon thread torn down in
# the middle of a ZeroMQ call while the interpreter finalizes can abort the process.
_RUNNING_PUBLISHERS: "weakref.WeakSet[ZmqEventPublisher]" = weakref.WeakSet()


@atexit.register
def _shut_down_running_publishers() -> None:
    for publisher in list(_RUNNING_PUBLISHERS):
        publisher.shutdown()
