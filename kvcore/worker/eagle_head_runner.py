"""The EAGLE-style head's forward passes over the target's hidden states (the speculator's
decisions are in :mod:`kvcore.worker.gpu.spec_decode.eagle.speculator`, the head in
:mod:`kvcore.model.eagle_head`).

The runner asks the target's runner to keep, at each verify step, what its LM head reads at each
logits position (``GPUModelRunner.keep_hidden_states``); a draft pass feeds one of those rows and
the request's last token through the head, then the predicted state and the draft just made, with
the target's own token embedding and LM head.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kvcore.model.eagle_head import EagleHead
from kvcore.worker.gpu.model_runner import GPUModelRunner


class EagleHeadRunner:
    def __init__(self, target: GPUModelRunner, head: EagleHead) -> None:
        self.target = target
        self.head = head
        target.keep_hidden_states()
        self.num_passes = 0  # head passes run so far

    @torch.inference_mode()
    def draft(self, asks: Sequence[tuple[str, int, int, int]]) -> dict[str, list[int]]:
        model = self.target.model
        hidden = self.target.last_hidden_states
        feature = torch.stack([hidden[rid][row] for rid, row, _, _ in asks])
        tokens = torch.tensor([t for _, _, t, _ in asks], dtype=torch.long, device=feature.device)
        out: dict[str, list[int]] = {rid: [] for rid, _, _, _ in asks}
        embed = model.get_input_embeddings()
        for _ in range(max(n for _, _, _, n in asks)):
            self.num_passes += 1
            feature = self.head.next_feature(feature, embed(tokens)).to(feature.dtype)
            tokens = torch.argmax(model.lm_head(feature[None])[0], dim=-1)
            for (rid, _, _, n), token in zip(asks, tokens.tolist()):
                if len(out[rid]) < n:
                    out[rid].append(int(token))
        return out
