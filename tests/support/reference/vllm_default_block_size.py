"""vLLM 0.34.0's side of tests/lab/test_hybrid_block_size.py's attention-only check, run by the
vLLM scratch environment's Python: the block size an attention-only model gets when
``--block-size`` is not given, on a GPU (``CacheConfig.DEFAULT_BLOCK_SIZE`` through the
FlashAttention backend's preference, phase 1 of ``Platform.update_block_size_for_backend``) and on
vLLM's CPU platform (128 through the CPU attention backend's, ``CpuPlatform``'s own phase 1).
Writes ``{"gpu": n, "cpu": n}`` as JSON; stdin is ignored."""

import json

from vllm.config.cache import CacheConfig
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

print(
    json.dumps(
        {
            "gpu": FlashAttentionBackend.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE),
            "cpu": CPUAttentionBackend.get_preferred_block_size(128),
        }
    )
)
