"""What the engine hands the model runner for one step, and the step's inputs in vLLM's names.

The engine gives one :class:`SeqBatchItem` per scheduled request;
``GPUModelRunner.prepare_inputs`` (:mod:`kvcore.worker.gpu.model_runner`, a method there as in
vLLM 0.34.0) turns them into :class:`InputBatch`: the flat arrays vLLM's method builds into its
``InputBatch`` (this file's path in vLLM: v1/worker/gpu/input_batch.py):
``input_ids``, ``positions``, ``query_start_loc``, ``seq_lens``, ``logits_indices``. vLLM keeps
each KV cache group's ``block_table`` and ``slot_mapping`` apart, in ``BlockTables``
(v1/worker/gpu/block_table.py); kvcore carries them in the same record. Plain ints, no torch:
the runner makes its tensors from exactly these values, and the step record keeps them, so what
a page shows is what the model used. (0.33.0's v1/worker/gpu_input_batch.py, which 0.34.0
removed, had an ``InputBatch`` that was the persistent batch kept across steps, not one step's
inputs.)

A token at position ``p`` of a request is written to slot
``block_table[p // block_size] * block_size + p % block_size`` of its group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from kvcore.lora.request import LoRARequest


@dataclass(frozen=True)
class SeqBatchItem:
    request_id: str
    token_ids: list[int]  # tokens fed this step (prompt chunk, or the last sampled token)
    start_pos: int  # position of token_ids[0] = tokens already in the pool
    # per KV cache group: logical block -> physical block (0 = null)
    block_tables: tuple[list[int], ...]
    sample: bool  # this step completes the known tokens: sample the next one
    num_draft_tokens: int = 0  # the last ones of token_ids are drafts: logits after each
    lora_request: Optional[LoRARequest] = None  # the request's adapter; None: the base model
    # one entry per token of token_ids: the raw bytes of the embedding row fed in its place (a
    # prompt_embeds row, or a multimodal item's row at its placeholder), or None: the token's own
    # embedding. None for the whole item: every token is embedded from its id.
    embeds: Optional[tuple[Optional[bytes], ...]] = None


@dataclass(frozen=True)
class InputBatch:
    """One step's model inputs, packed along one token axis in the order of ``req_ids``.

    Invariants: request i's tokens are ``query_start_loc[i]:query_start_loc[i+1]``; their
    positions run from ``seq_lens[i] - query_len`` to ``seq_lens[i] - 1``;
    ``slot_mapping[g][t] == block_table[g][i][positions[t] // block_size] * block_size
    + positions[t] % block_size`` for the request i owning token t; ``logits_indices`` are the
    last tokens of the requests that sample this step (``sample_req_ids``, same order) — a
    request with d drafts has its last d + 1 tokens there, its id repeated d + 1 times.
    """

    block_size: int
    req_ids: tuple[str, ...]
    input_ids: tuple[int, ...]  # [num_tokens]
    positions: tuple[int, ...]  # [num_tokens]
    query_start_loc: tuple[int, ...]  # [num_reqs + 1]
    seq_lens: tuple[int, ...]  # [num_reqs]: tokens in the pool after the step
    logits_indices: tuple[int, ...]  # [num_sampled]
    sample_req_ids: tuple[str, ...]  # [num_sampled]
    block_table: tuple[tuple[tuple[int, ...], ...], ...]  # [group][req] -> physical block ids
    slot_mapping: tuple[tuple[int, ...], ...]  # [group][token] -> slot in the pool

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @property
    def num_actual_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def max_query_len(self) -> int:
        return max(
            (b - a for a, b in zip(self.query_start_loc, self.query_start_loc[1:])), default=0
        )

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens, default=0)

    def slots_of(self, request_id: str, group: int = 0) -> tuple[int, ...]:
        """The slots request ``request_id``'s scheduled tokens were written to, in ``group``."""
        i = self.req_ids.index(request_id)
        return self.slot_mapping[group][self.query_start_loc[i] : self.query_start_loc[i + 1]]

    def positions_of(self, request_id: str) -> tuple[int, ...]:
        i = self.req_ids.index(request_id)
        return self.positions[self.query_start_loc[i] : self.query_start_loc[i + 1]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "req_ids": list(self.req_ids),
            "input_ids": list(self.input_ids),
            "positions": list(self.positions),
            "query_start_loc": list(self.query_start_loc),
            "seq_lens": list(self.seq_lens),
            "logits_indices": list(self.logits_indices),
            "sample_req_ids": list(self.sample_req_ids),
            "block_table": [[list(row) for row in g] for g in self.block_table],
            "slot_mapping": [list(g) for g in self.slot_mapping],
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "InputBatch":
        return InputBatch(
            block_size=int(d["block_size"]),
            req_ids=tuple(d["req_ids"]),
            input_ids=tuple(d["input_ids"]),
            positions=tuple(d["positions"]),
            query_start_loc=tuple(d["query_start_loc"]),
            seq_lens=tuple(d["seq_lens"]),
            logits_indices=tuple(d["logits_indices"]),
            sample_req_ids=tuple(d["sample_req_ids"]),
            block_table=tuple(tuple(tuple(row) for row in g) for g in d["block_table"]),
            slot_mapping=tuple(tuple(g) for g in d["slot_mapping"]),
        )


def rows_fed(request, start: int, end: int) -> Optional[tuple[Optional[bytes], ...]]:
    """The rows fed in place of token embeddings at positions [start, end) of ``request`` (vLLM's
    runner: ``inputs_embeds`` from ``prompt_embeds`` where ``is_token_ids`` is False, and the
    multimodal embeddings scattered where ``is_mm_embed`` is True); None when every position
    there is embedded from its token id. A multimodal item's rows are its ``data``, one per
    placeholder position (None: the item has no rows, only its identifier)."""
    embeds = request.prompt_embeds
    if embeds is None and not request.mm_features:
        return None
    rows: list[Optional[bytes]] = [None] * (end - start)
    if embeds is not None:
        for p in range(start, min(end, len(embeds))):
            rows[p - start] = embeds[p]
    for feature in request.mm_features:
        if feature.data is None:
            continue  # an item with no rows (a model-free run): its identifier is all it has
        offset, length = feature.mm_position.offset, feature.mm_position.length
        for p in range(max(start, offset), min(end, offset + length)):
            rows[p - start] = feature.data[p - offset]
    return tuple(rows) if any(r is not None for r in rows) else None


def first_visible_block(start_pos: int, block_size: int, window: int | None) -> int:
    """The first logical block any of a step's queries may read (0 without a window)."""
    return 0 if window is None else max(0, start_pos - window + 1) // block_size
