"""The worker's side of LoRA: adapters loaded from their requests' paths on first use, and put
in slots before each forward (vLLM: lora/worker_manager.py)."""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from kvcore.config.lora import LoRAConfig
from kvcore.lora.lora_model import LoRAModel
from kvcore.lora.model_manager import LRUCacheLoRAModelManager
from kvcore.lora.peft_helper import PEFTHelper
from kvcore.lora.request import LoRARequest

# the Llama-family linear layers an adapter may target (vLLM's packed qkv_proj / gate_up_proj
# name the same weights)
SUPPORTED_LORA_MODULES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)


class LRUCacheWorkerLoRAManager:
    """Invariant: ``_adapter_manager`` exists once :meth:`create_lora_manager` ran, and every id
    it registered came from a :class:`LoRARequest` whose folder loaded and validated."""

    def __init__(self, lora_config: LoRAConfig, device: torch.device, dtype: torch.dtype) -> None:
        self.lora_config = lora_config
        self.device = device
        self.dtype = dtype
        self._adapter_manager: LRUCacheLoRAModelManager | None = None

    def create_lora_manager(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap ``model``'s target modules (in place) and return it."""
        self._adapter_manager = LRUCacheLoRAModelManager(
            model, SUPPORTED_LORA_MODULES, self.lora_config, self.device
        )
        return model

    @property
    def adapter_manager(self) -> LRUCacheLoRAModelManager:
        if self._adapter_manager is None:
            raise RuntimeError("create_lora_manager has not run")
        return self._adapter_manager

    def _load_adapter(self, lora_request: LoRARequest) -> LoRAModel:
        """ValueError naming the adapter when its folder cannot be served."""
        try:
            peft_helper = PEFTHelper.from_local_dir(lora_request.lora_path)
            peft_helper.validate_legal(self.lora_config)
            return LoRAModel.from_local_checkpoint(
                lora_request.lora_path,
                SUPPORTED_LORA_MODULES,
                peft_helper,
                lora_model_id=lora_request.lora_int_id,
                device=self.device,
                dtype=self.dtype,
            )
        except (OSError, ValueError, TypeError) as e:
            raise ValueError(
                f"loading LoRA {lora_request.lora_name} from {lora_request.lora_path}: {e}"
            ) from e

    def add_adapter(self, lora_request: LoRARequest) -> bool:
        """Load (first time) and activate the request's adapter; True if it was loaded now."""
        manager = self.adapter_manager
        loaded = lora_request.lora_int_id not in manager.list_adapters()
        if loaded:
            manager.add_adapter(self._load_adapter(lora_request))
        else:
            manager.add_adapter(manager.list_adapters()[lora_request.lora_int_id])
        manager.activate_adapter(lora_request.lora_int_id)
        return loaded

    def _apply_adapters(self, lora_requests: Iterable[LoRARequest]) -> None:
        by_id = {r.lora_int_id: r for r in lora_requests if r}
        if len(by_id) > self.adapter_manager.lora_slots:
            raise RuntimeError(
                f"{len(by_id)} LoRAs in one step, more than the {self.adapter_manager.lora_slots} "
                "slots (max_loras)"
            )
        for request in by_id.values():
            self.add_adapter(request)

    def set_active_adapters(
        self, lora_requests: Iterable[LoRARequest], token_lora_mapping: Sequence[int]
    ) -> None:
        self._apply_adapters(lora_requests)
        self.adapter_manager.set_adapter_mapping(token_lora_mapping)
