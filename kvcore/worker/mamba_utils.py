"""Linear-attention (gated delta-net) layers on state blocks, as vLLM's align mode keeps them.

A linear-attention layer has no K/V per token: it carries two fixed-size states per request,
the causal convolution's last ``conv_kernel`` inputs and the delta rule's recurrent matrix.
kvcore's Mamba groups hand out blocks for them (:class:`kvcore.core.single_type_kv_cache_manager.
MambaManager`); here each linear layer owns two pools indexed by block id::

    conv_state[block_id]       [conv_dim, conv_kernel]
    recurrent_state[block_id]  [num_v_heads, head_k_dim, head_v_dim]   (float32)

Which block a step reads and writes (vLLM's align mode, ``mamba_utils``' state indices): a
request whose step covers positions ``start .. end - 1`` starts from the state in logical block
``(start - 1) // block_size`` (zeros when ``start == 0``) and leaves its new state in logical block
``(end - 1) // block_size``. The scheduler ends prefill chunks on block boundaries
(``mamba_block_aligned_split``), so the block holding a boundary keeps the state after it: a later
request that hits the prefix up to that boundary resumes from it. The math is transformers' own
``Qwen3_5GatedDeltaNet`` (its torch path), called once per request with a :class:`BlockStateCache`
standing in for its cache; only where the states live is ours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["BlockStateCache", "MambaStatePools", "PagedLinearAttention", "state_block_indices"]


def state_block_indices(start: int, end: int, block_size: int) -> tuple[int | None, int]:
    """(logical block read, logical block written) for a step over positions start..end-1;
    None = start from zeros (nothing computed yet)."""
    return (None if start == 0 else (start - 1) // block_size), (end - 1) // block_size


@dataclass
class MambaStatePools:
    """Per linear layer, its conv and recurrent state pools (``num_blocks`` entries each)."""

    conv: dict[int, torch.Tensor]
    recurrent: dict[int, torch.Tensor]

    @staticmethod
    def allocate(config, layers: Sequence[int], num_blocks: int, dtype, device) -> MambaStatePools:
        if not layers:
            return MambaStatePools(conv={}, recurrent={})
        key_dim = config.linear_key_head_dim * config.linear_num_key_heads
        conv_dim = 2 * key_dim + config.linear_value_head_dim * config.linear_num_value_heads
        conv_shape = (num_blocks, conv_dim, config.linear_conv_kernel_dim)
        rec_shape = (
            num_blocks,
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
        )
        return MambaStatePools(
            conv={i: torch.zeros(conv_shape, dtype=dtype, device=device) for i in layers},
            recurrent={
                i: torch.zeros(rec_shape, dtype=torch.float32, device=device) for i in layers
            },
        )

    def copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """``SchedulerOutput.kv_cache_block_copies``: block src's states into block dst."""
        for pools in (self.conv, self.recurrent):
            for t in pools.values():
                for src, dst in copies:
                    t[dst].copy_(t[src])

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for pools in (self.conv, self.recurrent)
            for t in pools.values()
        )


class BlockStateCache:
    """The part of transformers' cache API a gated delta-net layer calls, for one request and
    one layer: it starts from the given states (or none) and records the layer's new ones."""

    def __init__(self, conv: torch.Tensor | None, recurrent: torch.Tensor | None) -> None:
        self.conv = conv  # [1, conv_dim, kernel] (a private copy: the decode path edits it)
        self.recurrent = recurrent  # [1, Hv, dk, dv]

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.conv

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.recurrent

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def update_conv_state(
        self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs
    ) -> torch.Tensor:
        kernel = int(kwargs["conv_kernel_size"])
        full = (
            conv_states
            if self.conv is None
            else torch.cat([self.conv, conv_states.to(self.conv.dtype)], dim=-1)
        )
        # as transformers' own cache: keep the last `kernel` inputs (zeros on the left)
        padded = torch.nn.functional.pad(full, (max(0, kernel - full.shape[-1]), 0))
        self.conv = padded[..., -kernel:].clone()
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs
    ) -> torch.Tensor:
        self.recurrent = recurrent_states
        return recurrent_states


class PagedLinearAttention(torch.nn.Module):
    """Wraps one transformers gated delta-net layer: splits the step's packed tokens by request,
    runs the layer on each from its state block, and stores the state it ends with."""

    def __init__(self, inner: torch.nn.Module, pools: MambaStatePools) -> None:
        super().__init__()
        self.inner = inner
        self.layer_idx = int(inner.layer_idx)
        self.pools = pools

    def forward(self, hidden_states: torch.Tensor, *args, paged_step=None, **kwargs):
        if paged_step is None:
            raise RuntimeError("a paged linear-attention layer was called without a paged_step")
        md = paged_step.state_metadata[paged_step.layer_group[self.layer_idx]]
        conv_pool = self.pools.conv[self.layer_idx]
        rec_pool = self.pools.recurrent[self.layer_idx]
        outs = []
        for i, (read, write) in enumerate(md.blocks):
            a, b = md.query_start_loc[i], md.query_start_loc[i + 1]
            cache = BlockStateCache(
                None if read is None else conv_pool[read : read + 1].clone(),
                None if read is None else rec_pool[read : read + 1].clone(),
            )
            outs.append(self.inner(hidden_states[:, a:b], cache=cache))
            conv_pool[write].copy_(cache.conv[0])
            rec_pool[write].copy_(cache.recurrent[0])
        return torch.cat(outs, dim=1)


@dataclass(frozen=True)
class StateStepMetadata:
    """Per Mamba group, per step: each request's token range and its (read, write) block ids."""

    query_start_loc: tuple[int, ...]
    blocks: tuple[tuple[int | None, int], ...]


def state_step_metadata(
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    tables: Sequence[Sequence[int]],
    block_size: int,
) -> StateStepMetadata:
    """The physical blocks each request reads and writes (ValueError on a null one)."""
    blocks = []
    for i, (table, end) in enumerate(zip(tables, seq_lens)):
        start = end - (query_start_loc[i + 1] - query_start_loc[i])
        r, w = state_block_indices(start, end, block_size)
        phys_r = None if r is None else int(table[r])
        phys_w = int(table[w]) if w < len(table) else 0
        if phys_r == 0 or phys_w == 0:
            raise ValueError(
                f"request {i} of the step: its state block ({r}, {w}) is the null block "
                f"in table {list(table)}"
            )
        blocks.append((phys_r, phys_w))
    return StateStepMetadata(tuple(int(x) for x in query_start_loc), tuple(blocks))
