"""Physical block metadata and the free-block queue (vLLM v1: kv_cache_utils)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    """Metadata of one physical KV block.

    ``block_hash`` is the cache key (block hash + group id) and is set only
    while the block is full and registered in the prefix cache;
    ``block_hash_num_tokens`` is then the prefix length the hash covers (the
    end of the block: (index + 1) * block_size), else None. The two link
    fields are owned by FreeKVCacheBlockQueue and are None outside the queue.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[bytes] = None
    block_hash_num_tokens: Optional[int] = None
    prev_free_block: Optional["KVCacheBlock"] = None
    next_free_block: Optional["KVCacheBlock"] = None
    is_null: bool = False

    def reset_hash(self) -> None:
        self.block_hash = None
        self.block_hash_num_tokens = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks between two sentinel nodes.

    Invariant: the blocks between the sentinels are exactly the free blocks,
    each once, head = next to be handed out (and so the next cached block to
    lose its hash), tail = the last; ``num_free_blocks`` is their count.
    Every operation except ``get_all_free_blocks`` is O(1) per block, which is
    why a list or deque is not used: ``remove`` must take a block out of the
    middle when a prefix-cache hit revives it.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail or first is None:
            raise ValueError("No free blocks available")
        self._unlink(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks: only {self.num_free_blocks} free")
        out: list[KVCacheBlock] = []
        curr = self.fake_free_list_head.next_free_block
        for _ in range(n):
            assert curr is not None
            out.append(curr)
            nxt = curr.next_free_block
            curr.prev_free_block = curr.next_free_block = None
            curr = nxt
        if n:
            self.fake_free_list_head.next_free_block = curr
            curr.prev_free_block = self.fake_free_list_head
            self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free_block is None or block.next_free_block is None:
            raise RuntimeError(f"remove() called on {block!r}, which is not in the free queue")
        self._unlink(block)

    def _unlink(self, block: KVCacheBlock) -> None:
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        last = self.fake_free_list_tail.prev_free_block
        n = 0
        for block in blocks:
            last.next_free_block = block
            block.prev_free_block = last
            last = block
            n += 1
        last.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = last
        self.num_free_blocks += n

    def prepend_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Put blocks at the head, keeping their order (blocks[0] becomes the head)."""
        first = self.fake_free_list_head.next_free_block
        prev = self.fake_free_list_head
        n = 0
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
            n += 1
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += n

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out = []
        curr = self.fake_free_list_head.next_free_block
        while curr is not None and curr is not self.fake_free_list_tail:
            out.append(curr)
            curr = curr.next_free_block
        return out
