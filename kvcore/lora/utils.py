"""What the LoRA code shares (vLLM 0.34.0: lora/utils.py): the reading of a checkpoint key."""

from __future__ import annotations

_PREFIX = "base_model.model."
_A, _B = ".lora_A.weight", ".lora_B.weight"


def parse_fine_tuned_lora_name(name: str) -> tuple[str, bool]:
    """(module name, is lora_A) of one checkpoint key; ValueError for a key that is neither a
    LoRA A nor a LoRA B weight (an embedding LoRA, a bias, a saved whole module).

    vLLM's takes a ``weights_mapper`` too, which renames a model's modules; kvcore's models need
    none."""
    if name.startswith(_PREFIX):
        name = name[len(_PREFIX) :]
    for suffix, is_a in ((_A, True), (_B, False)):
        if name.endswith(suffix):
            return name[: -len(suffix)], is_a
    raise ValueError(f"{name} is not a LoRA weight this engine serves")
