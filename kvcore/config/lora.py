"""Settings of LoRA serving (vLLM: vllm/config/lora.py), the fields kvcore reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# the ranks vLLM 0.34 accepts for max_lora_rank (its MaxLoRARanks)
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoRAConfig:
    """vLLM's LoRAConfig: same names and defaults.

    Invariants: ``max_lora_rank`` is one of :data:`MAX_LORA_RANKS`; ``max_loras >= 1``;
    ``max_cpu_loras`` is resolved (None -> ``max_loras``) and is never below ``max_loras``.
    ``max_loras`` adapters at most run in one step (the scheduler keeps it so); the worker keeps
    up to ``max_cpu_loras`` loaded adapters and ``max_loras`` of them in its slots."""

    max_lora_rank: int = 16
    max_loras: int = 1
    max_cpu_loras: Optional[int] = None

    def __post_init__(self) -> None:
        if self.max_lora_rank not in MAX_LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {MAX_LORA_RANKS}")
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
