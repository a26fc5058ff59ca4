"""The model folder a model-free vLLM Scheduler is built from, removed when done.

vLLM's ``ModelConfig`` reads a Hugging Face ``config.json`` from a folder; a differential that
drives vLLM's Scheduler without a model needs only that file: a one-layer Llama without weights
(``skip_tokenizer_init`` spares the tokenizer). ``tiny_model_folder`` writes it in a temporary
folder and removes the folder when the ``with`` block ends, however it ends, so runs leave
nothing in /tmp. Runs under vLLM's interpreter (bench/bench_replay.py and bench/pd_vs_vllm.py
build their ``VllmConfig`` inside the block).
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
