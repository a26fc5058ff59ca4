"""LoRA in the model runner (vLLM: v1/worker/lora_model_runner_mixin.py): the target modules of
the runner's model are wrapped once, and before every forward the step's adapters are put in
slots and each packed token is mapped to its request's adapter."""

from __future__ import annotations

from typing import Sequence

import torch

from kvcore.config.lora import LoRAConfig
from kvcore.lora.request import LoRARequest
from kvcore.lora.worker_manager import LRUCacheWorkerLoRAManager
from kvcore.worker.gpu.input_batch import SeqBatchItem


class LoRAModelRunnerMixin:
    """Invariant: ``lora_manager`` is None exactly when the runner serves no LoRA, and then no
    item with a ``lora_request`` is run."""

    lora_manager: LRUCacheWorkerLoRAManager | None = None

    def load_lora_model(
        self,
        model: torch.nn.Module,
        lora_config: LoRAConfig,
        device: torch.device,
        dtype: torch.dtype,
    ) -> torch.nn.Module:
        self.lora_manager = LRUCacheWorkerLoRAManager(lora_config, device, dtype)
        return self.lora_manager.create_lora_manager(model)

    def set_active_loras(self, items: Sequence[SeqBatchItem]) -> None:
        """Before a forward over ``items`` (packed in this order): each token's adapter id."""
        # by id: the slots an adapter lands in are the same on every run
        requests = sorted(
            {it.lora_request for it in items if it.lora_request is not None},
            key=lambda r: r.lora_int_id,
        )
        if self.lora_manager is None:
            if requests:
                names = sorted(r.lora_name for r in requests)
                raise ValueError(f"LoRA requests {names} on a runner without LoRA (enable_lora)")
            return
        mapping = [
            it.lora_request.lora_int_id if it.lora_request is not None else 0
            for it in items
            for _ in it.token_ids
        ]
        self.lora_manager.set_active_adapters(requests, mapping)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load and activate an adapter ahead of its requests (vLLM: adapters given at start);
        ValueError naming it when its folder cannot be served."""
        if self.lora_manager is None:
            raise ValueError(
                f"LoRA {lora_request.lora_name} on a runner without LoRA (enable_lora)"
            )
        return self.lora_manager.add_adapter(lora_request)
