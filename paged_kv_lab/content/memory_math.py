"""The memory math shown in lesson 1, on top of kvcore.model.memory (pure arithmetic)."""

from __future__ import annotations

from dataclasses import dataclass

from kvcore.model.memory import bytes_per_block_dims, dtype_bytes, model_dims

DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn")


@dataclass(frozen=True)
class KVDims:
    layers: int
    kv_heads: int
    head_dim: int


def dims_from_config(config) -> KVDims:
    return KVDims(*model_dims(config))


def bytes_per_block(block_size: int, dims: KVDims, dtype: str = "float32") -> int:
    """block_size x layers x 2 (K and V) x KV heads x head size x dtype bytes."""
    return bytes_per_block_dims(block_size, dims.layers, dims.kv_heads, dims.head_dim, dtype)


def blocks_in_budget(budget_bytes: int, block_bytes: int) -> int:
    return max(0, int(budget_bytes) // max(int(block_bytes), 1))


def formula(block_size: int, dims: KVDims, dtype: str) -> str:
    return (
        f"{block_size} × {dims.layers} × 2 × {dims.kv_heads} × {dims.head_dim} × "
        f"{dtype_bytes(dtype)} = {bytes_per_block(block_size, dims, dtype):,} B"
    )


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"
