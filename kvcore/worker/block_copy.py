"""Whole-block K/V copies between two engines' pools (vLLM: the NIXL worker's READ of remote
blocks; distributed/kv_transfer/kv_connector/v1/nixl/pull_worker.py)."""

from __future__ import annotations

from typing import Sequence

import torch


def copy_blocks(
    src_caches: Sequence[torch.Tensor],
    dst_caches: Sequence[torch.Tensor],
    src_block_ids: Sequence[int],
    dst_block_ids: Sequence[int],
) -> None:
    """In every layer, block ``dst_block_ids[i]`` of ``dst_caches`` receives block
    ``src_block_ids[i]`` of ``src_caches`` (both laid out ``[num_blocks, ...]`` alike)."""
    if len(src_block_ids) != len(dst_block_ids):
        raise ValueError("a copy pairs each source block with one destination block")
    if not dst_block_ids:
        return
    with torch.inference_mode():
        for src, dst in zip(src_caches, dst_caches):
            s = torch.tensor(list(src_block_ids), dtype=torch.long, device=src.device)
            d = torch.tensor(list(dst_block_ids), dtype=torch.long, device=dst.device)
            dst.index_copy_(0, d, src.index_select(0, s).to(dst.device))
