"""nano-vllm's ``BlockManager`` (``nanovllm/engine/block_manager.py``, commit 2f352ae).

The whole prefix cache is one dict from a full block's chained xxh64 hash to a block id, plus
the block's token ids to rule out a hash collision. Free ids wait in a deque: allocation takes
the leftmost, release appends on the right, and a freed block keeps its hash and tokens (so it
can still be hit) until its id is taken again. Unlike vLLM there is no free-block queue that
evicts cached blocks least-recently-freed first from a separate map: here the deque order is the
eviction order, and a hit on a free block pulls it out of the deque wherever it stands.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable

import xxhash

from paged_kv_lab.designs import events as ev
from paged_kv_lab.designs.nanovllm.engine.sequence import Sequence


class Block:
    """One KV block: who uses it (``ref_count``) and, once full, its hash and token ids."""

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash = -1
        self.token_ids: list[int] = []

    def update(self, hash: int, token_ids: list[int]) -> None:
        self.hash = hash
        self.token_ids = token_ids

    def reset(self) -> None:
        self.ref_count = 1
        self.hash = -1
        self.token_ids = []


class BlockManager:
    """nano-vllm's KV block table.

    Invariants: every id is in exactly one of ``free_block_ids`` and ``used_block_ids``; a used
    block has ``ref_count > 0``, a free one 0; ``hash_to_block_id[h]`` is the block most recently
    given hash ``h`` (it may since have been reset, which the token-id check catches).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        non_cache_token_ids: list[int] | None = None,
        observer: Callable[[ev.DesignEvent], None] | None = None,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks and block_size must be at least 1 (got {num_blocks}, {block_size})"
            )
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()
        self.non_cache_token_ids = set(non_cache_token_ids or [])
        self.observer = observer

    @classmethod
    def compute_hash(cls, token_ids: list[int], prefix: int = -1) -> int:
        """xxh64 over the previous block's hash (8 bytes, little-endian; none for the first
        block) and the token ids as int64s: the chain makes a block's hash name its prefix."""
        h = xxhash.xxh64()
        if prefix != -1:
            h.update(prefix.to_bytes(8, "little"))
        h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
        return h.intdigest()

    def _emit(self, event: ev.DesignEvent) -> None:
        if self.observer is not None:
            self.observer(event)

    def _allocate_block(self, block_id: int) -> Block:
        block = self.blocks[block_id]
        assert block.ref_count == 0
        block.reset()
        self.free_block_ids.remove(block_id)
        self.used_block_ids.add(block_id)
        return block

    def _deallocate_block(self, block_id: int) -> None:
        assert self.blocks[block_id].ref_count == 0
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def can_allocate(self, seq: Sequence) -> bool:
        # Counts every block as new, hits included: nano-vllm reserves for the worst case.
        return len(self.free_block_ids) >= seq.num_blocks

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` its block table: shared blocks for the leading full blocks whose chained
        hash and tokens are known, fresh ones from the deque's left for the rest."""
        assert not seq.block_table
        h, cache_miss = -1, False
        for i in range(seq.num_blocks):
            token_ids = seq.block(i)
            reason = "after_miss" if cache_miss else ""
            if any(t in self.non_cache_token_ids for t in token_ids):
                cache_miss, reason = True, reason or "non_cache_token"
            h = self.compute_hash(token_ids, h) if len(token_ids) == self.block_size else -1
            block_id = self.hash_to_block_id.get(h, -1)
            if block_id == -1 or self.blocks[block_id].token_ids != token_ids:
                if not reason and h == -1:
                    reason = "partial"
                elif not reason and block_id == -1:
                    reason = "absent"
                elif not reason:
                    # One token-id check covers both: a stale entry (the block was reused since
                    # and holds another hash) and a true collision (same hash, other tokens).
                    stale = self.blocks[block_id].hash != h
                    reason = "stale" if stale else "collision"
                cache_miss = True
            if cache_miss:
                block_id = self.free_block_ids[0]
                evicted_hash = self.blocks[block_id].hash != -1
                block = self._allocate_block(block_id)
                self._emit(
                    ev.BlockMiss(
                        request_id=seq.seq_id,
                        index=i,
                        block_id=block_id,
                        reason=reason,
                        evicted_hash=evicted_hash,
                    )
                )
            else:
                seq.num_cached_tokens += self.block_size
                revived = block_id not in self.used_block_ids
                if revived:
                    block = self._allocate_block(block_id)
                else:
                    block = self.blocks[block_id]
                    block.ref_count += 1
                self._emit(
                    ev.BlockHit(request_id=seq.seq_id, index=i, block_id=block_id, revived=revived)
                )
            if h != -1:
                block.update(h, token_ids)
                self.hash_to_block_id[h] = block_id
            seq.block_table.append(block_id)

    def deallocate(self, seq: Sequence) -> None:
        """Drop ``seq``'s references, last block first, so its tail reaches the free deque
        before its head (and is reused first)."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._deallocate_block(block_id)
            self._emit(
                ev.BlockReleased(
                    request_id=seq.seq_id, block_id=block_id, ref_count=block.ref_count
                )
            )
        seq.num_cached_tokens = 0
        seq.block_table.clear()

    def can_append(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= (len(seq) % self.block_size == 1)

    def may_append(self, seq: Sequence) -> None:
        """After ``seq`` grew by one token: take a new block if the token opened one, or hash
        the last block if the token filled it."""
        block_table = seq.block_table
        last_block = self.blocks[block_table[-1]]
        if len(seq) % self.block_size == 1:
            assert last_block.hash != -1
            block_id = self.free_block_ids[0]
            self._allocate_block(block_id)
            block_table.append(block_id)
            self._emit(ev.BlockAppended(request_id=seq.seq_id, block_id=block_id))
        elif len(seq) % self.block_size == 0:
            assert last_block.hash == -1
            token_ids = seq.block(seq.num_blocks - 1)
            prefix = self.blocks[block_table[-2]].hash if len(block_table) > 1 else -1
            h = self.compute_hash(token_ids, prefix)
            last_block.update(h, token_ids)
            self.hash_to_block_id[h] = last_block.block_id
            self._emit(
                ev.BlockSealed(request_id=seq.seq_id, block_id=last_block.block_id, block_hash=h)
            )
        else:
            assert last_block.hash == -1
