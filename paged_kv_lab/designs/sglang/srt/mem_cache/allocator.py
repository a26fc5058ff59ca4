"""The token-slot pool under SGLang's radix tree (``sglang/srt/mem_cache/allocator/``), reduced
to what decides hits and evictions: how many slots are free.

SGLang hands out KV slots in pages of ``page_size`` tokens; slot ``s`` lies in page
``s // page_size`` and page 0 is never handed out (SGLang keeps it as padding). Which free page
comes next does not change any cache decision, so this pool keeps a plain FIFO of free pages
(SGLang sorts its free list lazily, which only renames slots).
"""

from __future__ import annotations

from collections import deque


class PagedTokenToKVPoolAllocator:
    """``size`` token slots in pages of ``page_size``.

    Invariant: every page 1..num_pages is either in ``free_pages`` or held by exactly one owner
    (a request's row or a tree node), and ``available_size()`` is free pages times page size.
    """

    def __init__(self, size: int, page_size: int = 1):
        if page_size < 1 or size < page_size:
            raise ValueError(
                f"the pool needs at least one page: size {size} tokens, page_size {page_size}"
            )
        self.size = size
        self.page_size = page_size
        self.num_pages = size // page_size
        self.free_pages: deque[int] = deque(range(1, self.num_pages + 1))

    def available_size(self) -> int:
        return len(self.free_pages) * self.page_size

    def alloc(self, need_size: int) -> list[int] | None:
        """Slots for ``need_size`` tokens in whole fresh pages, or None when too few are free."""
        num_pages = -(-need_size // self.page_size)
        if num_pages > len(self.free_pages):
            return None
        ps = self.page_size
        pages = [self.free_pages.popleft() for _ in range(num_pages)]
        return [p * ps + i for p in pages for i in range(ps)][:need_size]

    def free_segment(self, values, start_pos: int = 0) -> None:
        """Give back the pages of ``values`` (each page once, in the order first seen)."""
        seen: dict[int, None] = {}
        for v in values:
            seen.setdefault(v // self.page_size, None)
        self.free_pages.extend(seen)
