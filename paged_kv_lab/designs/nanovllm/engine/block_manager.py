"""nano-vllm's ``BlockManager`` (``nanovllm/engine/block_manager.py``) at commit bb823b3 (HEAD)
or 2f352ae (``commit=``; the differences: paged_kv_lab/designs/nanovllm/__init__.py).

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

from paged_kv_lab.designs import design_events as ev
from paged_kv_lab.designs.nanovllm import HEAD, OLD, check_commit
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
    block has ``ref_count > 0``, a free one 0. At HEAD ``hash_to_block_id[h]`` names a block
    whose hash is ``h``; at 2f352ae it names the block most recently given hash ``h``, which
    may since have been reset (the token-id check catches it).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        non_cache_token_ids: list[int] | None = None,
        observer: Callable[[ev.DesignEvent], None] | None = None,
        commit: str = HEAD,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks and block_size must be at least 1 (got {num_blocks}, {block_size})"
            )
        self.commit = check_commit(commit)
        if non_cache_token_ids and self.commit != OLD:
            raise ValueError(f"non_cache_token_ids exists at nano-vllm {OLD} only")
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

    def _allocate_block(self) -> int:
        """The free deque's leftmost id, reset for a new owner."""
        block_id = self.free_block_ids.popleft()
        block = self.blocks[block_id]
        assert block.ref_count == 0
        # HEAD (f64d821): the table forgets the block, so no entry ever names a reused block.
        if self.commit == HEAD and self.hash_to_block_id.get(block.hash, -1) == block_id:
            del self.hash_to_block_id[block.hash]
        block.reset()
        self.used_block_ids.add(block_id)
        return block_id

    def _deallocate_block(self, block_id: int) -> None:
        assert self.blocks[block_id].ref_count == 0
        self.used_block_ids.remove(block_id)
        self.free_block_ids.append(block_id)

    def _lookup(self, token_ids: list[int], h: int) -> tuple[int, str]:
        """The block ``hash_to_block_id`` gives for chained hash ``h`` if it holds
        ``token_ids`` (-1 if not), with why not: absent, stale or collision."""
        block_id = self.hash_to_block_id.get(h, -1)
        if block_id == -1:
            return -1, "absent"
        if self.blocks[block_id].token_ids != token_ids:
            # A stale entry (the block was reused and holds another hash) or a true collision
            # (same hash, other tokens): one token-id check rejects both.
            return -1, "stale" if self.blocks[block_id].hash != h else "collision"
        return block_id, ""

    def can_allocate(self, seq: Sequence) -> int | bool:
        """HEAD: the number of leading blocks that hit (the last block is never looked up), or
        -1 when the free deque cannot hold the rest and the revived free blocks.
        2f352ae: whether the deque holds one block per block of ``seq``, hits included."""
        if self.commit == OLD:
            return len(self.free_block_ids) >= seq.num_blocks
        h, num_cached_blocks, num_new_blocks = -1, 0, seq.num_blocks
        for i in range(seq.num_blocks - 1):
            h = self.compute_hash(seq.block(i), h)
            block_id, _ = self._lookup(seq.block(i), h)
            if block_id == -1:
                break
            num_cached_blocks += 1
            if block_id in self.used_block_ids:
                num_new_blocks -= 1
        if len(self.free_block_ids) < num_new_blocks:
            return -1
        return num_cached_blocks

    def allocate(self, seq: Sequence, num_cached_blocks: int | None = None) -> None:
        """Give ``seq`` its block table: shared blocks for the leading blocks that hit, fresh
        ones from the deque's left for the rest. HEAD takes ``can_allocate``'s count; 2f352ae
        looks every block up here (the last too) and hashes the full ones at once."""
        assert not seq.block_table
        assert (num_cached_blocks is None) == (self.commit == OLD)
        h, hits, missed = -1, 0, False
        for i in range(seq.num_blocks):
            token_ids = seq.block(i)
            full = len(token_ids) == self.block_size
            if self.commit == HEAD:
                why = "last"  # can_allocate never looks the last block up, full or not
                if i < num_cached_blocks or (not missed and i < seq.num_blocks - 1):
                    h = self.compute_hash(token_ids, h)
                    block_id, why = self._lookup(token_ids, h)
                assert (i < num_cached_blocks) == (not why)
            else:
                why = "non_cache_token" if self.non_cache_token_ids.intersection(token_ids) else ""
                h = self.compute_hash(token_ids, h) if full else -1
                block_id, found = self._lookup(token_ids, h) if full else (-1, "partial")
                why = why or found
            if not why and not missed:
                hits += 1
                revived = block_id not in self.used_block_ids
                # 2f352ae only: a stale entry whose reused block holds the same token ids after
                # another prefix passes the token check (the block's own hash differs).
                wrong_prefix = self.blocks[block_id].hash != h
                if revived:
                    self.blocks[block_id].ref_count = 1
                    self.free_block_ids.remove(block_id)
                    self.used_block_ids.add(block_id)
                else:
                    self.blocks[block_id].ref_count += 1
                self._emit(
                    ev.BlockHit(
                        request_id=seq.seq_id,
                        index=i,
                        block_id=block_id,
                        revived=revived,
                        wrong_prefix=wrong_prefix,
                    )
                )
            else:
                evicted_hash = self.blocks[self.free_block_ids[0]].hash != -1
                block_id = self._allocate_block()
                self._emit(
                    ev.BlockMiss(
                        request_id=seq.seq_id,
                        index=i,
                        block_id=block_id,
                        reason="after_miss" if missed else why,
                        evicted_hash=evicted_hash,
                    )
                )
                missed = True
            if self.commit == OLD and full:
                self.blocks[block_id].update(h, token_ids)
                self.hash_to_block_id[h] = block_id
            seq.block_table.append(block_id)
        seq.num_cached_tokens += hits * self.block_size

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
        """Before a decode step: take a new block if ``seq``'s newest token opened one; at
        2f352ae also hash the last block if that token filled it (HEAD: ``hash_blocks``)."""
        block_table = seq.block_table
        last_block = self.blocks[block_table[-1]]
        if len(seq) % self.block_size == 1:
            assert self.commit == HEAD or last_block.hash != -1
            block_table.append(self._allocate_block())
            self._emit(ev.BlockAppended(request_id=seq.seq_id, block_id=block_table[-1]))
        elif self.commit == OLD:
            assert last_block.hash == -1
            if len(seq) % self.block_size == 0:
                prefix = self.blocks[block_table[-2]].hash if len(block_table) > 1 else -1
                self._seal(seq, last_block, seq.block(seq.num_blocks - 1), prefix)

    def hash_blocks(self, seq: Sequence) -> None:
        """HEAD, after a step: hash the blocks that the step's ``num_scheduled_tokens`` filled
        (their K/V now computed), chained from the block before them."""
        assert self.commit == HEAD, f"nano-vllm {OLD} has no hash_blocks"
        start = seq.num_cached_tokens // self.block_size
        end = (seq.num_cached_tokens + seq.num_scheduled_tokens) // self.block_size
        if start == end:
            return
        h = self.blocks[seq.block_table[start - 1]].hash if start > 0 else -1
        for i in range(start, end):
            h = self._seal(seq, self.blocks[seq.block_table[i]], seq.block(i), h)

    def _seal(self, seq: Sequence, block: Block, token_ids: list[int], prefix: int) -> int:
        h = self.compute_hash(token_ids, prefix)
        block.update(h, token_ids)
        self.hash_to_block_id[h] = block.block_id
        self._emit(ev.BlockSealed(request_id=seq.seq_id, block_id=block.block_id, block_hash=h))
        return h
