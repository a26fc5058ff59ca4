"""Stand-in Hugging Face configs for the models vLLM's core tests name (run under vLLM's Python).

vLLM's ``ModelConfig`` reads the model's config.json from the Hub; this machine is offline, so
the harness points HF_HOME at a cache holding only a config.json per model, built from
transformers' config class with the published sizes. No weights, no tokenizer: the core tests
build configs and schedulers, never a model. Both runs (vLLM alone and with kvcore) use them.

    python standin_models.py HF_HOME
"""

import json
import os
import sys

from transformers import OPTConfig, Qwen3Config

SNAPSHOT = "0" * 40
MODELS = {
    "Qwen/Qwen3-0.6B": (
        Qwen3Config,
        dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            torch_dtype="bfloat16",
            tie_word_embeddings=True,
        ),
        "Qwen3ForCausalLM",
    ),
    "facebook/opt-125m": (OPTConfig, dict(torch_dtype="float16"), "OPTForCausalLM"),
}


def main(hf_home: str) -> None:
    for repo, (cls, kwargs, arch) in MODELS.items():
        base = os.path.join(hf_home, "hub", "models--" + repo.replace("/", "--"))
        snap = os.path.join(base, "snapshots", SNAPSHOT)
        os.makedirs(snap, exist_ok=True)
        os.makedirs(os.path.join(base, "refs"), exist_ok=True)
        with open(os.path.join(base, "refs", "main"), "w") as fh:
            fh.write(SNAPSHOT)
        config = cls(**kwargs).to_dict()
        config["architectures"] = [arch]
        with open(os.path.join(snap, "config.json"), "w") as fh:
            json.dump(config, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
