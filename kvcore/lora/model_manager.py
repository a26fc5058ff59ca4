"""The adapters a worker holds, and the slots the forward reads (vLLM: lora/model_manager.py).

Two levels, both least-recently-used, as vLLM's ``LRUCacheLoRAModelManager``: up to
``max_cpu_loras`` loaded adapters (``_registered_adapters``), and ``max_loras`` slots in the
target modules (``lora_index_to_id``: slot -> adapter id, the lowest free slot taken first) that
the step's adapters must occupy.  Activating an
adapter into full slots evicts the least recently used one; the scheduler never puts more than
``max_loras`` adapters in one step, so a step's adapters all fit.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch

from kvcore.config.lora import LoRAConfig
from kvcore.lora.layers.base_linear import BaseLinearLayerWithLoRA
from kvcore.lora.lora_model import LoRAModel
from kvcore.lora.punica_wrapper.punica_base import PunicaWrapperBase


class LRUCacheLoRAModelManager:
    """Invariants: ``lora_index_to_id`` maps slots ``0 .. max_loras - 1`` (a free slot has no
    entry) to distinct ids, exactly those of ``_active_adapters``; ``len(_registered_adapters) <=
    max_cpu_loras``; ``modules`` maps each wrapped target module's name to its wrapper."""

    def __init__(
        self,
        model: torch.nn.Module,
        supported_lora_modules: Sequence[str],
        lora_config: LoRAConfig,
        device: torch.device,
    ) -> None:
        self.model = model
        self.supported_lora_modules = tuple(supported_lora_modules)
        self.lora_config = lora_config
        self.device = device
        self.lora_slots = lora_config.max_loras
        self.capacity = lora_config.max_cpu_loras
        self.lora_index_to_id: dict[int, int] = {}
        self._registered_adapters: OrderedDict[int, LoRAModel] = OrderedDict()
        self._active_adapters: OrderedDict[int, None] = OrderedDict()
        self.punica_wrapper = PunicaWrapperBase(device)
        self.modules: dict[str, BaseLinearLayerWithLoRA] = {}
        self._create_lora_modules()

    def _create_lora_modules(self) -> None:
        targets = [
            (name, module)
            for name, module in self.model.named_modules()
            if name.rpartition(".")[2] in self.supported_lora_modules
            and getattr(module, "weight", None) is not None
            and module.weight.dim() == 2
        ]
        for name, module in targets:
            parent_name, _, child = name.rpartition(".")
            parent = self.model.get_submodule(parent_name)
            wrapped = BaseLinearLayerWithLoRA(module, self.punica_wrapper)
            setattr(parent, child, wrapped)
            self.modules[name] = wrapped

    def list_adapters(self) -> dict[int, LoRAModel]:
        return dict(self._registered_adapters)

    def add_adapter(self, lora: LoRAModel) -> bool:
        """Register ``lora`` (evicting the least recently used one when full); True if new."""
        if lora.id in self._registered_adapters:
            self._registered_adapters.move_to_end(lora.id)
            return False
        if len(self._registered_adapters) >= self.capacity:
            self.remove_oldest_adapter()
        self._registered_adapters[lora.id] = lora
        return True

    def remove_oldest_adapter(self) -> bool:
        if not self._registered_adapters:
            return False
        oldest = next(iter(self._registered_adapters))
        self.remove_adapter(oldest)
        return True

    def remove_adapter(self, adapter_id: int) -> bool:
        self.deactivate_adapter(adapter_id)
        return self._registered_adapters.pop(adapter_id, None) is not None

    def deactivate_adapter(self, adapter_id: int) -> bool:
        if adapter_id not in self._active_adapters:
            return False
        del self._active_adapters[adapter_id]
        index = self._slot_of(adapter_id)
        del self.lora_index_to_id[index]
        for module in self.modules.values():
            module.reset_lora(index)
        return True

    def activate_adapter(self, lora_id: int) -> bool:
        """Put a registered adapter in a slot (the least recently used one if none is free);
        True if it was not in one already."""
        if lora_id in self._active_adapters:
            self._active_adapters.move_to_end(lora_id)
            return False
        if len(self._active_adapters) >= self.lora_slots:
            self.deactivate_adapter(next(iter(self._active_adapters)))
        index = next(
            i for i in range(len(self.lora_index_to_id) + 1) if i not in self.lora_index_to_id
        )
        lora = self._registered_adapters[lora_id]
        for name, module in self.modules.items():
            weights = lora.get_lora(name)
            if weights is None:
                module.reset_lora(index)
            else:
                module.set_lora(index, weights.lora_a, weights.lora_b)
        self.lora_index_to_id[index] = lora_id
        self._active_adapters[lora_id] = None
        return True

    def _slot_of(self, adapter_id: int) -> int:
        return next(i for i, a in self.lora_index_to_id.items() if a == adapter_id)

    def set_adapter_mapping(self, token_lora_mapping: Sequence[int]) -> None:
        """Each packed token's adapter id (0: none) becomes its slot for the punica wrapper."""
        slot = {a: i for i, a in self.lora_index_to_id.items()}
        self.punica_wrapper.update_metadata([slot[i] if i > 0 else -1 for i in token_lora_mapping])
