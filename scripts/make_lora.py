"""Make a small LoRA adapter with peft for SmolLM2 or a tiny test model, the same on every run.

    .venv/bin/python scripts/make_lora.py tiny-random DIR [--seed 0] [--r 8] [--alpha 16]
    .venv/bin/python scripts/make_lora.py smollm2 DIR

It wraps the model in peft's ``LoraConfig`` (rank ``--r``, ``lora_alpha`` ``--alpha``, the
attention and MLP projections as targets, no dropout), then sets every A and B matrix from a
``torch.Generator`` seeded with ``--seed``: peft itself starts B at zero, which makes a fresh
adapter the identity, and an adapter that changes nothing cannot show that the engine applies
it. ``save_pretrained`` writes peft's ordinary adapter folder: ``adapter_config.json`` and
``adapter_model.safetensors``. The engine serves it (``engine.lora_modules``, docs/scenario.md)
and ``PeftModel.from_pretrained(model, DIR)`` loads it.

Nothing is downloaded: the models are the ones ``kvcore.model.load_model`` builds. An adapter
made for ``smollm2`` is a derivative of SmolLM2-135M-Instruct's shapes (Apache-2.0, like the
model); its weights are random, not trained.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# every Llama-family projection kvcore serves LoRA on (kvcore/lora/worker_manager.py)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
B_STD = 0.05  # large enough that SmolLM2's greedy tokens change, small enough to stay fluent


def make_lora(
    model: str,
    folder: str | Path,
    *,
    seed: int = 0,
    r: int = 8,
    lora_alpha: float = 16,
    target_modules: tuple[str, ...] = TARGETS,
) -> Path:
    """Write the adapter to ``folder`` (created); returns it. Same arguments -> same weights."""
    import torch
    from peft import LoraConfig, get_peft_model

    from kvcore.model import load_model
    from kvcore.model.reference import shared_clone

    base = shared_clone(load_model(model, "cpu", "float32").model)  # peft rewires a copy
    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if ".lora_A." in name:
                fan_in = param.shape[1]
                param.copy_(torch.randn(param.shape, generator=gen) / fan_in**0.5)
            elif ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * B_STD)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    from kvcore.model.shapes import ATTENTION_MODELS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=ATTENTION_MODELS)
    p.add_argument("folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--r", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16)
    args = p.parse_args(argv)
    print(make_lora(args.model, args.folder, seed=args.seed, r=args.r, lora_alpha=args.alpha))
    return 0


if __name__ == "__main__":
    sys.exit(main())
