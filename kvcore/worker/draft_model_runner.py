"""The draft model's forward pass for self-speculative decoding (early exit).

The draft is the target model cut short: its embedding, its first ``L`` decoder layers, then its
final norm and LM head. It shares every weight with the target (nothing is copied) but not its
K/V: each draft layer has a paged pool of its own, shaped like the target's, and is reached
through the *same* block tables and slot mapping. That is how vLLM lays out a draft model's
attention layers in the KV cache config: extra layers in the target's KV cache group, so one
block id names a slot in every layer, target and draft alike.

:class:`kvcore.worker.gpu.spec_decode.standalone_ar.speculator.StandaloneARSpeculator`
decides what the draft reads and where it writes (positions, tokens, how many passes); this
module only runs the forward, with the same inputs, metadata and kernel as
:class:`kvcore.worker.gpu.model_runner.GPUModelRunner`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kvcore.worker.gpu.attn_utils import build_attn_metadata
from kvcore.worker.gpu.input_batch import InputBatch, SeqBatchItem
from kvcore.worker.gpu.model_runner import GPUModelRunner
from kvcore.worker.paged_attention import build_paged_step, pool_views_of


class DraftModelRunner:
    """The target's first ``num_layers`` layers + final norm + LM head, over pools of its own.

    Invariants: ``1 <= num_layers <= target.num_layers``; ``kv_caches`` has one pool per draft
    layer, each the shape of a target pool (so the target's block ids address it); draft layer
    i reads and writes through the KV cache group of target layer i.
    """

    def __init__(self, target: GPUModelRunner, num_layers: int) -> None:
        if not 1 <= num_layers <= target.num_layers:
            raise ValueError(
                f"the draft model keeps 1 to {target.num_layers} of the target's layers; "
                f"got {num_layers}"
            )
        self.target = target
        self.num_layers = int(num_layers)
        self.layer_group = list(target.layer_group[: self.num_layers])
        with torch.inference_mode():
            self.kv_caches: list[torch.Tensor] = [
                torch.zeros_like(target.kv_caches[i]) for i in range(self.num_layers)
            ]
        self._pool_views = pool_views_of(self.kv_caches)
        self.last_inputs: InputBatch | None = None  # the last draft pass's inputs (tests, UI)

    @property
    def kv_cache_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.kv_caches)

    def read_block(self, layer: int, block_id: int) -> torch.Tensor:
        """A copy of one block of one draft layer: [2 (K,V), num_kv_heads, block_size, head_dim]."""
        return self.kv_caches[layer][block_id].detach().clone()

    @torch.inference_mode()
    def execute(self, items: Sequence[SeqBatchItem]) -> dict[str, int]:
        """One draft pass: write every item's K/V into the draft pools, and return the draft's
        greedy token after the last token of each item with ``sample=True``."""
        if not items:
            return {}
        t = self.target
        # the target's inputs and tables (a model with state-block groups runs no drafter)
        inputs = t.prepare_inputs(items)
        self.last_inputs = inputs
        t.set_active_loras(items)  # the draft runs the target's (wrapped) layers
        block_tables, slot_mappings = t.prepare_attn(inputs)
        step = build_paged_step(
            build_attn_metadata(  # as vLLM's speculators build theirs (spec_decode/speculator.py)
                num_reqs=inputs.num_reqs,
                num_tokens=inputs.num_actual_tokens,
                query_start_loc=torch.tensor(inputs.query_start_loc, dtype=torch.long),
                max_query_len=inputs.max_query_len,
                seq_lens=torch.tensor(inputs.seq_lens, dtype=torch.long),
                max_seq_len=inputs.max_seq_len,
                block_tables=block_tables,
                slot_mappings=slot_mappings,
            ),
            t.group_sliding_window,
            self.kv_caches,
            self.layer_group,
            t.block_size,
            t.num_kv_heads,
            t.num_heads // t.num_kv_heads,
            t.device,
            t.dtype,
            self._pool_views,
        )
        body = t.model.model  # the target's paged clone: same weights, paged attention
        ids = torch.tensor([inputs.input_ids], dtype=torch.long, device=t.device)
        positions = torch.tensor([inputs.positions], dtype=torch.long, device=t.device)
        hidden = body.embed_tokens(ids)
        rope = body.rotary_emb(hidden, position_ids=positions)
        for layer in body.layers[: self.num_layers]:
            hidden = layer(
                hidden,
                attention_mask=None,
                position_ids=positions,
                position_embeddings=rope,
                paged_step=step,
            )
        if not inputs.sample_req_ids:
            return {}  # a prefill chunk: its draft K/V is written, nothing to propose yet
        keep = torch.tensor(inputs.logits_indices, dtype=torch.long, device=t.device)
        logits = t.model.lm_head(body.norm(hidden[:, keep]))[0]
        return dict(zip(inputs.sample_req_ids, torch.argmax(logits, dim=-1).tolist()))
