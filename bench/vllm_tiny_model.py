"""The model folder a model-free vLLM Scheduler is built from, removed when done.

vLLM's ``ModelConfig`` reads a Hugging Face ``config.json`` from a folder; a differential that
drives vLLM's Scheduler without a model needs only that file: a one-layer Llama without weights
(``skip_tokenizer_init`` spares the tokenizer). ``tiny_model_folder`` writes it in a temporary
folder and removes the folder when the ``with`` block ends, however it ends, so runs leave
nothing in /tmp. ``one_layer_scheduler`` builds vLLM's ``Scheduler`` over one full-attention
group of that model from a ``VllmConfig``. Runs under vLLM's interpreter (bench/bench_replay.py
and bench/pd_vs_vllm.py build their ``VllmConfig`` inside the block).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def tiny_model_folder(max_model_len: int, prefix: str = "vllm-tiny-") -> Iterator[str]:
    """A temporary folder holding a one-layer Llama ``config.json`` whose
    ``max_position_embeddings`` is ``max_model_len``; gone after the block."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
            json.dump(
                {
                    "architectures": ["LlamaForCausalLM"],
                    "model_type": "llama",
                    "hidden_size": 64,
                    "intermediate_size": 128,
                    "num_attention_heads": 2,
                    "num_key_value_heads": 1,
                    "num_hidden_layers": 1,
                    "vocab_size": 1000,
                    "max_position_embeddings": max_model_len,
                    "torch_dtype": "float32",
                },
                f,
            )
        yield folder


def one_layer_scheduler(config, num_blocks: int, block_size: int):
    """vLLM's own ``Scheduler`` for ``config`` (a ``VllmConfig`` over ``tiny_model_folder``) with
    ``num_blocks`` blocks of ``block_size`` tokens in the model's one full-attention group."""
    import torch
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)],
    )
    return Scheduler(
        config,
        kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
        log_stats=True,
    )
