"""A peft adapter's ``adapter_config.json``, read and checked (vLLM: lora/peft_helper.py).

What kvcore serves is plain LoRA: per target module ``y += (x @ A^T @ B^T) * scaling`` with
``scaling = lora_alpha / r`` (rsLoRA: ``lora_alpha / sqrt(r)``), ``r`` and ``lora_alpha``
per module where ``rank_pattern`` / ``alpha_pattern`` name it.  The peft features vLLM 0.34
refuses are refused here too, by the same checks.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import MISSING, dataclass, field, fields
from typing import Optional, Union

from kvcore.config.lora import LoRAConfig

# inits that only choose the first weights: a saved adapter of theirs is a plain LoRA
_PLAIN_INITS = ("gaussian", "eva", "orthogonal", "mica", "lora_ga")


@dataclass
class PEFTHelper:
    """Invariant after construction: ``r >= 1``, every ``rank_pattern`` rank >= 1, and
    ``vllm_lora_scaling_factor`` is the scaling of a module no pattern names."""

    r: int
    lora_alpha: float
    target_modules: Union[list[str], str]
    bias: str = "none"
    modules_to_save: Optional[list[str]] = None
    use_rslora: bool = False
    use_dora: bool = False
    lora_bias: bool = False
    init_lora_weights: Union[bool, str] = True
    alora_invocation_tokens: Optional[list[int]] = None
    layer_replication: Optional[list[list[int]]] = None
    use_bdlora: Optional[dict] = None
    use_qalora: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    vllm_lora_scaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.r, int) or self.r <= 0:
            raise ValueError(f"LoRA rank r must be a positive integer, got {self.r!r}")
        self.rank_pattern = self.rank_pattern or {}
        self.alpha_pattern = self.alpha_pattern or {}
        for key, rank in self.rank_pattern.items():
            if not isinstance(rank, int) or rank <= 0:
                raise ValueError(f"rank_pattern[{key!r}] must be a positive integer, got {rank!r}")
        self.vllm_lora_scaling_factor = self._scaling(self.r, self.lora_alpha)

    def _scaling(self, rank: int, alpha: float) -> float:
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank

    @staticmethod
    def _match_pattern(pattern: dict, name: str):
        # peft's rule: a key matches a suffix of the module name that starts at a dot
        for key, value in pattern.items():
            if re.match(rf"(.*\.)?({key})$", name):
                return value
        return None

    def get_rank_and_scaling(self, module_name: str) -> tuple[int, float]:
        """The rank and scaling peft uses for ``module_name`` (a name in the checkpoint,
        ``base_model.model.`` removed)."""
        if not self.rank_pattern and not self.alpha_pattern:
            return self.r, self.vllm_lora_scaling_factor
        rank = self._match_pattern(self.rank_pattern, module_name)
        rank = self.r if rank is None else rank
        alpha = self._match_pattern(self.alpha_pattern, module_name)
        alpha = self.lora_alpha if alpha is None else alpha
        return rank, self._scaling(rank, alpha)

    @classmethod
    def from_dict(cls, config: dict) -> "PEFTHelper":
        known = {f.name: f for f in fields(cls)}
        required = {
            n for n, f in known.items() if f.default is MISSING and f.default_factory is MISSING
        }
        missing = required - set(config)
        if missing:
            raise ValueError(f"adapter_config.json lacks {sorted(missing)}")
        return cls(**{k: v for k, v in config.items() if k in known})

    @classmethod
    def from_local_dir(cls, lora_path: str) -> "PEFTHelper":
        with open(os.path.join(lora_path, "adapter_config.json"), encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def _validate_features(self) -> list[str]:
        errors = []
        if self.modules_to_save and any(
            m not in ("classifier", "score") for m in self.modules_to_save
        ):
            errors.append(f"modules_to_save {self.modules_to_save} is not supported")
        if self.use_dora:
            errors.append("DoRA is not supported")
        if self.lora_bias:
            errors.append("LoRA bias (lora_bias) is not supported")
        init = self.init_lora_weights
        if isinstance(init, str) and init.lower() not in _PLAIN_INITS:
            errors.append(f"init_lora_weights={init!r} changes the base weights: not supported")
        if self.alora_invocation_tokens:
            errors.append("Activated LoRA (aLoRA) is not supported")
        if self.layer_replication:
            errors.append("layer_replication is not supported")
        if self.use_bdlora:
            errors.append("block-diagonal LoRA is not supported")
        if self.use_qalora:
            errors.append("QALoRA is not supported")
        return errors

    def validate_legal(self, lora_config: LoRAConfig) -> None:
        """ValueError naming every feature the serving side cannot honour."""
        errors = self._validate_features()
        max_rank = max([self.r, *self.rank_pattern.values()])
        if max_rank > lora_config.max_lora_rank:
            errors.append(
                f"LoRA rank {max_rank} is greater than max_lora_rank {lora_config.max_lora_rank}"
            )
        if self.bias != "none":
            errors.append("adapter bias is not supported")
        if errors:
            raise ValueError("; ".join(errors))
