"""Attention metadata for one step (vLLM 0.34.0: v1/worker/gpu/attn_utils.py, where
``build_attn_metadata`` turns a step's batch into what each attention layer is told).

vLLM's model runner first gathers each KV cache group's block table and slot mapping
(``GPUModelRunner.prepare_attn``, ours in :mod:`kvcore.worker.gpu.model_runner`), then
``build_attn_metadata`` makes one :class:`CommonAttentionMetadata` per KV cache group from them
and the batch's lengths. kvcore does the same two steps in the same order.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kvcore.attention.backend import CommonAttentionMetadata


def build_attn_metadata(
    num_reqs: int,
    num_tokens: int,
    query_start_loc: torch.Tensor,
    max_query_len: int,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    block_tables: Sequence[torch.Tensor],
    slot_mappings: torch.Tensor,
) -> list[CommonAttentionMetadata]:
    """One :class:`CommonAttentionMetadata` per KV cache group, in group order (host tensors).

    ``block_tables[g]``: group g's ``[num_reqs, max_num_blocks]`` table; ``slot_mappings[g]``:
    group g's ``[num_tokens]`` slots. The other arguments are shared by every group.

    Where vLLM's signature differs, and why:

    - vLLM takes ``attn_groups`` and ``kv_cache_config`` and returns a dict from layer name to
      the metadata each attention backend's builder makes from the common one. kvcore has one
      attention kernel and no per-backend builders, so it returns the common metadata itself,
      one per group; the kernel finds a layer's group through the runner's ``layer_group``
      (:func:`kvcore.worker.paged_attention.build_paged_step`).
    - vLLM passes ``query_start_loc`` twice, on the GPU and on the host
      (``query_start_loc_gpu``, ``query_start_loc_cpu``); kvcore builds it on the host only.
    - The rest of vLLM's parameters serve what kvcore does not model (CUDA graphs,
      decode context parallelism, micro-batches, fast prefill, per-model extras, multimodal
      document ranges); they are left out, not faked.
    """
    seq_lens = seq_lens[:num_reqs]
    return [
        CommonAttentionMetadata(
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            num_reqs=num_reqs,
            num_actual_tokens=num_tokens,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            block_table_tensor=block_table,
            slot_mapping=slot_mapping,
        )
        for block_table, slot_mapping in zip(block_tables, slot_mappings)
    ]
