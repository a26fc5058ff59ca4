"""The models the loader loads, by name, and the tiny hybrid model's shape, as plain data (no
torch import): the loader builds its config from them, and a scenario's choices, block size and
pool are resolved from them before (or without) loading the model."""

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

# The models kvcore/model/loader.py loads, the devices and dtypes it loads them on: the one list of
# each (the scenario schema, the app's sidebar, the command lines, the benchmarks and the tests
# derive theirs from these).
MODEL_CHOICES: tuple[str, ...] = ("smollm2", "tiny-random", "tiny-hybrid")
DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda")
DTYPE_CHOICES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# attention layers only: every lesson plays on these (the sidebar's choice); a hybrid model is
# only a lesson's own model
ATTENTION_MODELS: tuple[str, ...] = tuple(m for m in MODEL_CHOICES if m not in HYBRID_SHAPES)
# built from a seed here rather than read from a wheel (``python -m kvcore model save`` writes them)
TINY_MODELS: tuple[str, ...] = tuple(m for m in MODEL_CHOICES if m != "smollm2")


def hybrid_shape(name: str):
    """The named hybrid model's shape as a config-like object (the fields
    :mod:`kvcore.model.memory` reads), or None for a model without linear-attention layers."""
    shape = HYBRID_SHAPES.get(name)
    return None if shape is None else SimpleNamespace(**shape)
