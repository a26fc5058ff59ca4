"""The worker for KV cache groups of different block sizes (engine.sliding_block_multiple).

kvcore's GPUModelRunner lays every layer's K/V out in blocks of one size. Here that size is the
groups' greatest common divisor ``g``, and each block id of the KV cache manager owns ``m``
consecutive worker pages (``m`` = the largest group block size / ``g``): a group whose block
holds ``k * g`` tokens writes block ``b`` into pages ``b * m`` .. ``b * m + k - 1``. So one block
id stands for the same bytes in every group, as one page does in vLLM 0.34, where every group's
page has the same size and a group with fewer bytes per token holds more tokens per page.

Invariant: token ``p`` of a request, in a group of block size ``k * g``, lands in page
``table[p // (k * g)] * m + (p % (k * g)) // g``, offset ``p % g``: the slot it would have
with one block of ``k * g`` tokens. The null block (0) maps to page 0 only.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from kvcore.worker.gpu.model_runner import GPUModelRunner


class GroupPagesRunner(GPUModelRunner):
    """A GPUModelRunner over pages of the greatest common divisor of ``group_block_sizes``."""

    def __init__(
        self, loaded, num_blocks: int, group_block_sizes: Sequence[int], *args, **kwargs
    ) -> None:
        page = math.gcd(*group_block_sizes)
        self.pages_per_block = max(group_block_sizes) // page
        # per KV cache group: how many pages one of its blocks fills
        self.group_pages = tuple(bs // page for bs in group_block_sizes)
        super().__init__(loaded, num_blocks * self.pages_per_block, page, *args, **kwargs)

    def worker_items(self, items):
        m = self.pages_per_block
        items = [
            replace(
                it,
                block_tables=tuple(
                    [b * m + j if b else 0 for b in table for j in range(k)]
                    for table, k in zip(it.block_tables, self.group_pages)
                ),
            )
            for it in items
        ]
        return super().worker_items(items)
