"""The router's global index: which replica holds which block hash, built only from KV events.

Each replica's pool publishes its KV events as vLLM 0.34 does (one ``KVEventBatch`` per step
that queued events, kvcore/distributed/kv_events.py). The index takes the batch, or its msgpack
encoding as on the wire decoded with the watcher's decoder, and applies it to that replica's
``PrefixCacheIndex`` (watch/prefix_index.py), the same code that rebuilds a real vLLM server's
cache on the Live vLLM page, keeping no token ids (the router never reads them). It never
looks inside a replica.

``kv_event_lag_ms``: a payload published at clock t is applied once the router's clock reaches
t + lag, so a lagging index can be seen routing on stale knowledge.
"""

from __future__ import annotations

from collections import deque
from typing import Optional, Sequence, Union

from kvcore.distributed.kv_events import MEDIUM_GPU, KVEventBatch, decode_batch
from paged_kv_lab.watch.prefix_index import HashBudget, PrefixCacheIndex

# One full-attention group: group 0 (the engine's only group in a model-free replay).
GROUP = "0"
MAX_INDEX_HASHES = 1 << 24  # the router's index across all replicas


class GlobalIndex:
    """Per replica, its prefix cache as its KV events tell it.

    Invariant: a replica's entries are exactly what applying, in publishing order, every payload
    it published at least ``lag_ns`` before the last ``deliver(now)`` gives."""

    def __init__(self, num_replicas: int, lag_ns: int = 0) -> None:
        budget = HashBudget(MAX_INDEX_HASHES)
        # The router matches prompts by hash alone: its entries keep no token ids.
        self.replicas = [PrefixCacheIndex(budget, keep_tokens=False) for _ in range(num_replicas)]
        self.lag_ns = lag_ns
        self._pending: deque[tuple[int, int, bytes]] = deque()
        self.batches = 0
        self.events = 0

    def publish(self, replica: int, clock_ns: int, payload: Union[bytes, KVEventBatch]) -> None:
        """A replica published ``payload`` at ``clock_ns``: a KVEventBatch, or its encoding as
        on the wire (decoded when it is applied)."""
        self._pending.append((clock_ns + self.lag_ns, replica, payload))

    def deliver(self, now_ns: Optional[int] = None) -> int:
        """Apply every payload due by ``now_ns`` (None: all); returns how many were applied.
        Payloads are due in publishing order per replica (each replica's clock only grows)."""
        applied = 0
        keep: deque = deque()
        while self._pending:
            item = self._pending.popleft()
            due, replica, payload = item
            if now_ns is not None and due > now_ns:
                keep.append(item)
                continue
            batch = decode_batch(payload) if isinstance(payload, bytes) else payload
            idx = self.replicas[replica]
            for ev in batch.events:
                idx.apply(ev)
            self.batches += 1
            self.events += len(batch.events)
            applied += 1
        self._pending = keep
        return applied

    def blocks(self, replica: int) -> dict:
        """The hashes the index holds for ``replica`` on the GPU (hash text -> entry)."""
        return self.replicas[replica].tiers.get((MEDIUM_GPU, GROUP), {})

    def overlap(self, replica: int, block_hashes: Sequence[str]) -> int:
        """How many leading blocks of a prompt (its hashes as text) the replica holds."""
        held = self.blocks(replica)
        n = 0
        for h in block_hashes:
            if h not in held:
                break
            n += 1
        return n

    def holders(self) -> dict[str, list[int]]:
        """Every hash the index knows, with the replicas that hold it (for drawing the index)."""
        out: dict[str, list[int]] = {}
        for i in range(len(self.replicas)):
            for h in self.blocks(i):
                out.setdefault(h, []).append(i)
        return out
