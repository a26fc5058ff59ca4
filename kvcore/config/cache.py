"""The KV cache's sizing settings (vLLM 0.34.0: vllm/config/cache.py, ``CacheConfig``).

kvcore keeps the settings that decide how many blocks the pool gets and whether vLLM 0.34's
extensible KV cache sizes it:

- ``gpu_memory_utilization``: None unless stated (0.34.0 changed the default from 0.9 to None);
  ``resolved_gpu_memory_utilization`` gives 1.0 with the extensible KV cache, else
  ``DEFAULT_GPU_MEMORY_UTILIZATION`` (0.92).
- ``kv_cache_memory_bytes``: the KV cache's bytes as stated (then the utilization is not used).
- ``num_gpu_blocks_override``: the pool's blocks as stated (the lab's ``num_gpu_blocks`` as a
  number).
- ``enable_extensible_kv_cache``: None unless stated; ``resolve_enable_extensible_kv_cache``
  (kvcore/config/vllm.py) settles it as ``VllmConfig`` does.
- ``num_gpu_blocks``: the pool's blocks once sized (``finalize_extensible_kv_cache`` writes it).

vLLM's other fields (block size, cache dtype, prefix caching, Mamba modes, offloading) are the
lab's scenario settings and kvcore's spec objects; they do not live here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional


@dataclass
class CacheConfig:
    """The sizing half of vLLM's ``CacheConfig`` (see the module docstring)."""

    DEFAULT_GPU_MEMORY_UTILIZATION: ClassVar[float] = 0.92

    gpu_memory_utilization: Optional[float] = None
    kv_cache_memory_bytes: Optional[int] = None
    num_gpu_blocks_override: Optional[int] = None
    enable_extensible_kv_cache: Optional[bool] = None
    num_gpu_blocks: Optional[int] = None

    def __post_init__(self) -> None:
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1]; got {u}")

    @property
    def resolved_gpu_memory_utilization(self) -> float:
        """The utilization as stated; unstated, 1.0 with the extensible KV cache (it is sized
        from measured memory, so needs no headroom) and 0.92 without."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        if self.enable_extensible_kv_cache:
            return 1.0
        return self.DEFAULT_GPU_MEMORY_UTILIZATION
