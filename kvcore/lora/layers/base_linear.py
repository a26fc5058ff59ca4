"""A linear layer with LoRA slots (vLLM: lora/layers/base_linear.py)."""

from __future__ import annotations

import torch

from kvcore.lora.punica_wrapper.punica_base import PunicaWrapperBase


class BaseLinearLayerWithLoRA(torch.nn.Module):
    """Stands in for one target module: the base layer's output, plus the adapter of each row.

    ``lora_a[i]`` [rank, in] / ``lora_b[i]`` [out, rank] hold slot i's weights, at the adapter's
    own rank (vLLM pre-allocates ``max_loras`` stacks padded to ``max_lora_rank``; the product is
    the same).  Invariant: a slot has an entry in both dicts or in neither, and has one exactly
    when the adapter in it targets this module."""

    def __init__(self, base_layer: torch.nn.Module, punica_wrapper: PunicaWrapperBase) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.punica_wrapper = punica_wrapper
        out_features, in_features = base_layer.weight.shape
        self.input_size, self.output_size = int(in_features), int(out_features)
        self.lora_a: dict[int, torch.Tensor] = {}
        self.lora_b: dict[int, torch.Tensor] = {}

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    def reset_lora(self, index: int) -> None:
        self.lora_a.pop(index, None)
        self.lora_b.pop(index, None)

    def set_lora(self, index: int, lora_a: torch.Tensor, lora_b: torch.Tensor) -> None:
        """Slot ``index`` takes A [rank, in] and B [out, rank] (B with its scaling)."""
        if lora_a.shape[1] != self.input_size or lora_b.shape[0] != self.output_size:
            raise ValueError(
                f"LoRA A {tuple(lora_a.shape)} / B {tuple(lora_b.shape)} do not fit a "
                f"{self.input_size} -> {self.output_size} layer"
            )
        self.lora_a[index] = lora_a
        self.lora_b[index] = lora_b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)
        return self.punica_wrapper.add_lora_linear(y, x, self.lora_a, self.lora_b)
