"""What the platform decides about the KV cache's shape (vLLM 0.34.0: vllm/platforms/interface.py,
``Platform``); kvcore models one decision: the block size of a hybrid model's shared pool.

vLLM's ``Platform._align_hybrid_block_size(vllm_config, backend_cls)`` reads the sizes from the
config and the attention backend and writes the result back into ``CacheConfig``; kvcore's
``align_hybrid_block_size`` takes those sizes as numbers and returns the result.
"""

from __future__ import annotations

import math
from typing import Optional

from kvcore.utils.math_utils import cdiv


def align_hybrid_block_size(
    block_size: int,
    attn_page_size_1_token: int,
    mamba_page_size: int,
    kernel_block_alignment: int = 16,
    backend_block_alignment: int = 16,
    prefill_checkpoint_alignment: Optional[int] = None,
) -> tuple[int, Optional[int]]:
    """vLLM 0.34's ``Platform._align_hybrid_block_size``: both kinds of blocks live in one pool,
    so an attention page (``block_size`` tokens x ``attn_page_size_1_token`` bytes, all layers
    of one group) must hold a whole Mamba state. The attention block size is raised to the
    smallest multiple of the kernel's block alignment whose page is at least the state, then
    to the backends' common alignment; the state's page is padded up to the attention page.
    -> (block_size, mamba_page_size_padded or None when the pages are already equal). In
    align mode the Mamba block size is this block size too.

    ``block_size`` is where the raising starts: the stated size, else
    ``CacheConfig.DEFAULT_BLOCK_SIZE`` where the attention backends accept it (16 in 0.33, 64 in
    0.34: ``kvcore.model.memory.DEFAULT_BLOCK_SIZE``).
    The kernel alignment is at least ``block_size``, so from 0.34's 64 the result is a multiple
    of 64.

    ``prefill_checkpoint_alignment``: in align mode, the Mamba layers' prefill checkpoint
    alignment (vLLM's ``get_mamba_prefill_checkpoint_alignment``: 64 with FlashInfer's gated
    delta-net prefill, None for a backend that exports no checkpoints); the kernel alignment
    becomes its least common multiple with it. Pass None outside align mode. A block size
    already large enough is kept: the result is never below ``block_size``."""
    if mamba_page_size <= 0:
        return block_size, None
    kernel = max(kernel_block_alignment, block_size)
    kernel = math.lcm(kernel, prefill_checkpoint_alignment or 1)
    attn_block_size = kernel * cdiv(mamba_page_size, kernel * attn_page_size_1_token)
    attn_block_size = backend_block_alignment * cdiv(attn_block_size, backend_block_alignment)
    block_size = max(block_size, attn_block_size)
    attn_page_size = block_size * attn_page_size_1_token
    return block_size, (None if attn_page_size == mamba_page_size else attn_page_size)
