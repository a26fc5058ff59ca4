"""KV-cache memory arithmetic (pure Python: no torch import, so pages can call it freely).

One *block* holds ``block_size`` tokens of K and V for every decoder layer:

    bytes_per_block = block_size * num_layers * 2 (K and V) * num_kv_heads * head_dim * dtype_bytes

e.g. SmolLM2-135M (30 layers, 3 KV heads, head_dim 64) in float32 with 16-token blocks:
16 * 30 * 2 * 3 * 64 * 4 = 737,280 bytes (720 KiB) per block.
"""

from __future__ import annotations

from typing import Any

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2,
    "float16": 2, "fp16": 2, "half": 2,
    "float64": 8, "double": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "int8": 1, "uint8": 1,
}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as ``"float32"``, ``torch.float32`` or an int (already bytes)."""
    if isinstance(dtype, int):
        if dtype <= 0:
            raise ValueError(f"dtype bytes must be positive, got {dtype}")
        return dtype
    itemsize = getattr(dtype, "itemsize", None)  # torch.dtype has .itemsize
    if isinstance(itemsize, int) and not isinstance(dtype, str):
        return itemsize
    name = str(dtype).removeprefix("torch.")
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}") from None


def bytes_per_block_dims(block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                         dtype: Any = "float32") -> int:
    """The int-only variant: bytes of one KV block across all layers."""
    for name, v in (("block_size", block_size), ("num_layers", num_layers),
                    ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if int(v) <= 0:
            raise ValueError(f"{name} must be positive, got {v}")
    return int(block_size) * int(num_layers) * 2 * int(num_kv_heads) * int(head_dim) * dtype_bytes(dtype)


def model_dims(config: Any) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a transformers config (or anything with those fields)."""
    n_layers = int(config.num_hidden_layers)
    n_heads = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return n_layers, n_kv, int(head_dim)


def bytes_per_block(config: Any, block_size: int, dtype: Any = "float32") -> int:
    """Bytes of one KV block (``block_size`` tokens, all layers, K and V)."""
    n_layers, n_kv, head_dim = model_dims(config)
    return bytes_per_block_dims(block_size, n_layers, n_kv, head_dim, dtype)


def blocks_for_budget_dims(block_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                           dtype: Any, budget_bytes: int) -> int:
    """How many whole blocks fit in ``budget_bytes`` (int-only variant)."""
    if budget_bytes < 0:
        raise ValueError("budget_bytes must be >= 0")
    return int(budget_bytes) // bytes_per_block_dims(block_size, num_layers, num_kv_heads, head_dim, dtype)


def blocks_for_budget(config: Any, block_size: int, dtype: Any, budget_bytes: int) -> int:
    """How many whole blocks fit in ``budget_bytes``."""
    if budget_bytes < 0:
        raise ValueError("budget_bytes must be >= 0")
    return int(budget_bytes) // bytes_per_block(config, block_size, dtype)
