"""What every attention layer of a KV cache group is told about a step (vLLM:
v1/attention/backend.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the tensors come from the worker, which imports torch
    import torch


@dataclass(frozen=True)
class CommonAttentionMetadata:
    """One KV cache group's view of a step, shared by all its layers (vLLM's name and fields).

    Built on the host from :class:`kvcore.worker.gpu.input_batch.InputBatch`;
    :func:`build_paged_step` turns it into the device index tensors the kernel uses.  Invariant:
    ``slot_mapping[t]`` is the slot of packed token t in this group's pool, and
    ``block_table_tensor[i]`` holds request i's table (padded with the null block 0, never read).
    """

    query_start_loc: torch.Tensor  # [num_reqs + 1] int64
    seq_lens: torch.Tensor  # [num_reqs] tokens in the pool after this step
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor  # [num_reqs, max_num_blocks] int64
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64
    causal: bool = True
