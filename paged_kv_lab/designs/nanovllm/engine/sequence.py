"""nano-vllm's ``Sequence`` (``nanovllm/engine/sequence.py``), the part the block manager reads.

A sequence is its token ids (prompt, then generated tokens) and its block table; ``block(i)``
is the i-th ``block_size`` slice of the tokens, the last one possibly partial. At bb823b3
``num_cached_tokens`` counts the tokens whose K/V is computed (hits, then each step's
``num_scheduled_tokens``); at 2f352ae only the hits at allocation.
"""

from __future__ import annotations

from collections.abc import Sequence as Tokens


class Sequence:
    """Token ids and the ids of the KV blocks that hold them, in order.

    Invariant once allocated: ``len(block_table) == num_blocks``.
    """

    def __init__(self, token_ids: Tokens[int], block_size: int = 256, seq_id: str | None = None):
        self.seq_id = seq_id
        self.block_size = block_size
        self.token_ids = list(token_ids)
        self.num_tokens = len(self.token_ids)
        self.num_prompt_tokens = self.num_tokens
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0
        self.block_table: list[int] = []

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def num_blocks(self) -> int:
        return (self.num_tokens + self.block_size - 1) // self.block_size

    @property
    def num_cached_blocks(self) -> int:
        return self.num_cached_tokens // self.block_size

    def block(self, i: int) -> list[int]:
        if not 0 <= i < self.num_blocks:
            raise IndexError(f"block {i} of a sequence with {self.num_blocks} blocks")
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.num_tokens += 1
