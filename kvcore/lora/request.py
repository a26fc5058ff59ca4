"""A request's LoRA adapter, as the block manager sees it (vLLM: lora/request.py).

kvcore keeps what the prefix cache and the KV events read: the name and path go into every
block's extra keys (so a base request never hits an adapter's blocks, nor one adapter
another's), the id and name into each ``BlockStored`` event.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """Invariant: ``lora_int_id >= 1`` and ``lora_path`` is not empty (vLLM asserts both)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"id must be > 0, got {self.lora_int_id!r}")
        if not self.lora_path:
            raise ValueError("lora_path cannot be empty")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
