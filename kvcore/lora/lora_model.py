"""A whole adapter's weights, read from a peft adapter folder (vLLM: lora/lora_model.py).

The folder is peft's own format: ``adapter_config.json`` (:class:`PEFTHelper`) and
``adapter_model.safetensors`` with keys ``base_model.model.<module>.lora_A.weight`` /
``.lora_B.weight``.  Nothing of peft is needed to read it.
"""

from __future__ import annotations

import os
from typing import Sequence

import torch
from safetensors.torch import load_file

from kvcore.lora.lora_weights import LoRALayerWeights
from kvcore.lora.peft_helper import PEFTHelper
from kvcore.lora.utils import parse_fine_tuned_lora_name


class LoRAModel:
    """Invariant: every entry of ``loras`` is optimized (scaling folded into B) and its module's
    last name is one of the expected target modules."""

    def __init__(self, lora_model_id: int, rank: int, loras: dict[str, LoRALayerWeights]) -> None:
        self.id = lora_model_id
        self.rank = rank
        self.loras = loras

    def get_lora(self, module_name: str) -> LoRALayerWeights | None:
        return self.loras.get(module_name)

    @classmethod
    def from_local_checkpoint(
        cls,
        lora_dir: str,
        expected_lora_modules: Sequence[str],
        peft_helper: PEFTHelper,
        *,
        lora_model_id: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> "LoRAModel":
        path = os.path.join(lora_dir, "adapter_model.safetensors")
        if not os.path.isfile(path):
            raise ValueError(f"{lora_dir} has no adapter_model.safetensors")
        tensors = load_file(path, device="cpu")
        pairs: dict[str, dict[bool, torch.Tensor]] = {}
        for key, tensor in tensors.items():
            module, is_a = parse_fine_tuned_lora_name(key)
            pairs.setdefault(module, {})[is_a] = tensor
        unexpected = sorted(
            m for m in pairs if m.rpartition(".")[2] not in set(expected_lora_modules)
        )
        if unexpected:
            raise ValueError(
                f"{lora_dir}: target modules {unexpected} are not among "
                f"{list(expected_lora_modules)}"
            )
        loras = {}
        for module, ab in pairs.items():
            if set(ab) != {True, False}:
                raise ValueError(f"{lora_dir}: {module} lacks its lora_A or lora_B weight")
            rank, scaling = peft_helper.get_rank_and_scaling(module)
            loras[module] = LoRALayerWeights(
                module,
                rank,
                peft_helper.lora_alpha,
                ab[True].to(device=device, dtype=dtype),
                ab[False].to(device=device, dtype=dtype),
                scaling,
            ).optimize()
        return cls(lora_model_id, peft_helper.r, loras)
