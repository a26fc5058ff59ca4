"""Which rows of a step take which adapter (vLLM: lora/punica_wrapper/punica_base.py).

vLLM's punica wrapper keeps, per step, each token's adapter slot and runs batched kernels
(shrink: ``x @ A^T``, expand: ``... @ B^T``) over all slots at once.  Here the same mapping is
kept and the same two products run per slot, on that slot's rows only: a row with no adapter
(slot -1) is never touched, so a base request's numbers are exactly the base model's.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch


class PunicaWrapperBase:
    """Invariant after :meth:`update_metadata`: ``slot_rows`` lists each slot used in the step
    once, with the packed token rows that take it (ascending); rows of slot -1 appear nowhere."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.token_lora_indices: tuple[int, ...] = ()
        self.slot_rows: list[tuple[int, torch.Tensor]] = []

    def update_metadata(self, token_lora_indices: Sequence[int]) -> None:
        """``token_lora_indices[t]``: the slot of packed token t's adapter, -1 for none."""
        self.token_lora_indices = tuple(int(i) for i in token_lora_indices)
        rows: dict[int, list[int]] = {}
        for t, slot in enumerate(self.token_lora_indices):
            if slot >= 0:
                rows.setdefault(slot, []).append(t)
        self.slot_rows = [
            (slot, torch.tensor(r, dtype=torch.long, device=self.device))
            for slot, r in sorted(rows.items())
        ]

    def add_lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a: Mapping[int, torch.Tensor],
        lora_b: Mapping[int, torch.Tensor],
    ) -> torch.Tensor:
        """``y`` plus, on each adapter's rows, ``x @ lora_a[slot]^T @ lora_b[slot]^T`` (B holds
        the scaling).  ``x`` [..., T, in], ``y`` [..., T, out]; a slot this module has no
        weights for adds nothing."""
        used = [(s, r) for s, r in self.slot_rows if s in lora_a]
        if not used:
            return y
        if x.shape[-2] != len(self.token_lora_indices):
            raise RuntimeError(
                f"the LoRA mapping covers {len(self.token_lora_indices)} tokens, "
                f"the layer got {x.shape[-2]}"
            )
        x2 = x.reshape(-1, x.shape[-1])
        out = y.reshape(-1, y.shape[-1])
        for slot, rows in used:
            xs = x2.index_select(0, rows)
            delta = (xs @ lora_a[slot].t()) @ lora_b[slot].t()
            out = out.index_add(0, rows, delta.to(out.dtype))
        return out.view(y.shape)
