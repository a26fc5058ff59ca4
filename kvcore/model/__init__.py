"""The model side of the engine: loading and memory profiling (the runner and paged attention are in
:mod:`kvcore.worker`).

Only this package imports torch/transformers.  Attributes are imported lazily, so
``kvcore.model.memory`` (pure arithmetic) can be used without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # loader
    "load_model": "loader",
    "LoadedModel": "loader",
    "ModelNotAvailable": "gguf_cache",
    "DeviceNotAvailable": "loader",
    "MODEL_CHOICES": "shapes",
    "DEVICE_CHOICES": "shapes",
    "DTYPE_CHOICES": "shapes",
    "ATTENTION_MODELS": "shapes",
    "TINY_MODELS": "shapes",
    "ByteTokenizer": "byte_tokenizer",
    "reference_model": "reference",
    "resolve_device": "loader",
    "smollm2_available": "gguf_cache",
    "smollm2_gguf_path": "gguf_cache",
    "smollm2_cache_dir": "gguf_cache",
    "ensure_smollm2_converted": "gguf_cache",
    "cache_root": "gguf_cache",
    "tiny_random_config": "loader",
    # memory profiling -> num_gpu_blocks
    "profile_model": "profile",
    "MemoryProfile": "memory",
    "num_gpu_blocks_from_profile": "memory",
    # memory (torch-free)
    "bytes_per_block": "memory",
    "bytes_per_block_dims": "memory",
    "blocks_for_budget": "memory",
    "blocks_for_budget_dims": "memory",
    "dtype_bytes": "memory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'kvcore.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
