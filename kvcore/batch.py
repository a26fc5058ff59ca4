"""What the engine hands the model runner for one scheduled sequence."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SeqBatchItem:
    request_id: str
    token_ids: list[int]                  # tokens fed this step (prompt chunk, or the last sampled token)
    start_pos: int                        # position of token_ids[0] = tokens already in the pool
    block_tables: tuple[list[int], ...]   # per KV cache group: logical block -> physical block (0 = null)
    sample: bool                          # this step completes the known tokens: sample the next one
