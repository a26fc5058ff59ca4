"""The tiny hybrid model's shape as plain numbers (no torch import): the loader builds its
config from them, and a scenario's block size and pool are resolved from them before (or
without) loading the model."""

from __future__ import annotations

from types import SimpleNamespace

# Qwen3.5's layout (3 gated delta-net layers, then 1 full-attention layer), SmolLM2's attention
# shape (4 q heads / 2 kv heads of 16), 2 key / 4 value heads of 16 in the linear layers, a
# 4-wide causal convolution.
TINY_HYBRID: dict = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "layer_types": ("linear_attention",) * 3 + ("full_attention",),
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}

# the hybrid models a scenario can name, by name
HYBRID_SHAPES: dict[str, dict] = {"tiny-hybrid": TINY_HYBRID}


def hybrid_shape(name: str):
    """The named hybrid model's shape as a config-like object (the fields
    :mod:`kvcore.model.memory` reads), or None for a model without linear-attention layers."""
    shape = HYBRID_SHAPES.get(name)
    return None if shape is None else SimpleNamespace(**shape)
