"""One target module's LoRA weights (vLLM: lora/lora_weights.py)."""

from __future__ import annotations

import torch


class LoRALayerWeights:
    """``lora_a`` [rank, input_dim] and ``lora_b`` [output_dim, rank], as peft stores them.

    Invariant once :meth:`optimize` ran (the loader runs it): ``lora_b`` already holds the
    factor ``scaling`` and ``scaling`` is 1, so the module's delta is ``x @ lora_a.T @ lora_b.T``
    -- vLLM folds the scaling into B the same way."""

    def __init__(
        self,
        module_name: str,
        rank: int,
        lora_alpha: float,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> None:
        if lora_a.dim() != 2 or lora_b.dim() != 2 or lora_a.shape[0] != lora_b.shape[1]:
            raise ValueError(
                f"{module_name}: lora_A {tuple(lora_a.shape)} and lora_B {tuple(lora_b.shape)} "
                "do not chain"
            )
        if lora_a.shape[0] != rank:
            raise ValueError(
                f"{module_name}: rank {lora_a.shape[0]} in the file, {rank} in the config"
            )
        self.module_name = module_name
        self.rank = rank
        self.lora_alpha = lora_alpha
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.scaling = scaling

    def optimize(self) -> "LoRALayerWeights":
        """Fold ``scaling`` into ``lora_b``."""
        if self.scaling != 1:
            self.lora_b = self.lora_b * self.scaling
            self.scaling = 1
        return self

    @property
    def input_dim(self) -> int:
        return int(self.lora_a.shape[1])

    @property
    def output_dim(self) -> int:
        return int(self.lora_b.shape[0])
