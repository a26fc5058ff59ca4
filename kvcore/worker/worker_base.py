"""What a worker reports after warm-up (vLLM 0.34.0: vllm/v1/worker/worker_base.py).

kvcore keeps only ``CompilationTimes``, the value ``compile_or_warm_up_model`` returns, for its
``num_kv_blocks``: the blocks that fit in the memory the worker measured free after warm-up, with
the extensible KV cache (None without it). ``finalize_extensible_kv_cache``
(kvcore/core/kv_cache_planning.py) takes the smallest over the workers.
"""

from __future__ import annotations

from typing import NamedTuple, Optional


class CompilationTimes(NamedTuple):
    language_model: float = 0.0
    encoder: float = 0.0
    num_kv_blocks: Optional[int] = None
