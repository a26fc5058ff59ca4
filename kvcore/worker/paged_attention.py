"""Paged attention: K/V live in fixed-size blocks, reached through each request's block table.

The function :func:`paged_attention_forward` is registered in transformers'
``AttentionInterface`` under :data:`ATTN_NAME`; a model switched to it with
``model.set_attn_implementation(ATTN_NAME)`` calls it in every decoder layer with

- ``query``  ``[1, Hq,  T, D]`` after RoPE (all the step's tokens packed along T),
- ``key`` / ``value`` ``[1, Hkv, T, D]`` (the step's *new* tokens only),
- ``module.layer_idx``, ``scaling``, and every extra keyword given to ``model(...)``:
  the runner passes ``paged_step=<PagedStep>`` that way (no global state),

and expects ``[1, T, Hq, D]`` back.  (Checked on transformers 5.23: a custom name that is
not in ``AttentionMaskInterface`` also makes the model skip building a 4-D mask.)

Storage, one tensor per decoder layer, allocated once (the layout of vLLM's
``[num_blocks, 2, num_kv_heads, block_size, head_dim]`` kv-cache tensor)::

    pool[block_id, 0 = K | 1 = V, kv_head, offset_in_block, :]

A token at position ``pos`` of a request lives in slot ``block_id * block_size + offset``
with ``block_id = block_table[pos // block_size]`` and ``offset = pos % block_size``.

Per layer the function (1) writes the step's new K/V into the pool through the runner's
``slot_mapping`` (as vLLM's ``reshape_and_cache`` does), then (2) gathers, for every sequence at
once (one padded gather, no loop over sequences or tokens), the blocks its queries may see, and (3)
runs causal, grouped-query attention with ``scaled_dot_product_attention`` under a boolean mask.
On a sliding-window layer a query at position p sees keys p-W+1 .. p (transformers'
convention), and only the blocks from ``(start - W + 1) // block_size`` on are gathered:
table entries before that are outside every query's window -- the block manager replaces
them with the null block 0, and they are never read.  Padding columns of the gather
repeat the sequence's own last block and are masked, so block 0 is never read at all.

Everything that depends only on the batch (indices, masks) is computed once per step in
:func:`build_paged_step`, from each group's :class:`CommonAttentionMetadata`, and shared by
all layers of that group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from kvcore.attention.backend import CommonAttentionMetadata

ATTN_NAME = "kvlab_paged"


@dataclass
class GroupStep:
    """Per KV cache group, per step: where to write, what to gather, and the mask."""

    sliding_window: int | None
    write_rows: torch.Tensor  # [Hkv*T] rows of pool.view(-1, D) receiving the new K
    write_rows_v: torch.Tensor  # the same for V (K's rows + Hkv*bs)
    gather_rows: torch.Tensor  # [S*2*Hkv*NB] rows of pool.view(-1, bs, D) to gather
    num_ctx_blocks: int  # NB: gathered blocks per sequence (padded)
    mask: torch.Tensor  # [S, 1, G*Qm, NB*bs] additive: 0 = may attend, -inf = masked
    # per sequence, the physical blocks read (for displays/tests)
    gathered_block_ids: list[list[int]]


@dataclass
class PagedStep:
    """Everything a layer needs for one forward; passed to ``model(...)`` as ``paged_step=``."""

    kv_caches: Sequence[torch.Tensor]  # per layer [num_blocks, 2, Hkv, bs, D]
    pool_rows: Sequence[torch.Tensor]  # per layer, the pool viewed as [num_blocks*2*Hkv*bs, D]
    pool_blocks: Sequence[torch.Tensor]  # per layer, the pool viewed as [num_blocks*2*Hkv, bs, D]
    layer_group: Sequence[int]  # per layer, its KV cache group
    groups: list[GroupStep | None]  # None for a Mamba (state-block) group
    num_seqs: int  # S
    max_query_len: int  # Qm
    num_tokens: int  # T
    q_index: torch.Tensor | None  # [S*Qm] packed token of each padded query; None = decode-only
    out_index: torch.Tensor | None  # [T] padded query row of each packed token
    # per Mamba group: kvcore.worker.mamba_utils.StateStepMetadata
    state_metadata: dict[int, Any] = field(default_factory=dict)


def pool_views_of(
    kv_caches: Sequence[torch.Tensor],
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, the two flat views the kernel indexes (made once, reused every step)."""
    rows = [t.view(-1, t.shape[-1]) for t in kv_caches]
    blocks = [t.view(-1, t.shape[-2], t.shape[-1]) for t in kv_caches]
    return rows, blocks


def build_paged_step(
    metadata: Sequence[CommonAttentionMetadata],  # per KV cache group
    group_sliding_window: Sequence[int | None],
    kv_caches: Sequence[torch.Tensor],
    layer_group: Sequence[int],
    block_size: int,
    num_kv_heads: int,
    num_q_per_kv: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    pool_views: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
    state_groups: frozenset[int] = frozenset(),
) -> PagedStep:
    """Index tensors and masks for one packed forward (computed once, used by every layer)."""
    m0 = metadata[0]
    S, T, Qm = m0.num_reqs, m0.num_actual_tokens, m0.max_query_len
    bs = block_size
    Hkv = num_kv_heads
    G = num_q_per_kv
    qsl = m0.query_start_loc
    lens = qsl[1:] - qsl[:-1]
    starts = m0.seq_lens - lens  # tokens already in the pool
    offsets = qsl[:-1]  # first packed token of each seq
    seq_of_tok = torch.repeat_interleave(torch.arange(S), lens)  # [T]
    tok_in_seq = torch.arange(T) - offsets[seq_of_tok]  # [T]

    decode_only = Qm == 1
    # padded queries: row (s, qi) is token min(qi, len-1) of seq s (padding repeats the last one)
    qi = torch.minimum(torch.arange(Qm)[None, :], (lens - 1)[:, None])  # [S, Qm]
    q_pos = starts[:, None] + qi  # [S, Qm]
    if decode_only:
        q_index = out_index = None
    else:
        q_index = (offsets[:, None] + qi).reshape(-1)
        out_index = seq_of_tok * Qm + tok_in_seq

    last_blk = (m0.seq_lens - 1) // bs
    groups: list[GroupStep | None] = []
    kv_sel = torch.arange(2)[None, :, None, None]
    head_sel = torch.arange(Hkv)[None, None, :, None]
    heads = torch.arange(Hkv)[:, None]
    for g, (md, W) in enumerate(zip(metadata, group_sliding_window)):
        if g in state_groups:
            groups.append(None)
            continue
        first_blk = (
            torch.zeros(S, dtype=torch.long) if W is None else (starts - W + 1).clamp(min=0) // bs
        )
        NB = int((last_blk - first_blk).max()) + 1
        # the blocks each sequence may read, padded with its own last block (masked below):
        # block 0 is never read
        cols = torch.minimum(first_blk[:, None] + torch.arange(NB)[None, :], last_blk[:, None])
        gb = md.block_table_tensor.gather(1, cols)  # [S, NB]
        # where the new tokens go: the slot mapping, as rows of pool.view(-1, D)
        slot = md.slot_mapping
        # [Hkv, T]
        write_rows = ((slot // bs)[None, :] * 2 * Hkv + heads) * bs + (slot % bs)[None, :]
        # what to read: rows of pool.view(-1, bs, D) in [S, 2, Hkv, NB] order
        gather_rows = (gb[:, None, None, :] * 2 + kv_sel) * Hkv + head_sel
        # mask: key at position kpos visible to query at q_pos iff kpos <= q_pos (and in window)
        kpos = ((first_blk[:, None] + torch.arange(NB)[None, :]) * bs)[:, :, None] + torch.arange(
            bs
        )
        kpos = kpos.reshape(S, NB * bs)  # [S, L]
        m = kpos[:, None, :] <= q_pos[:, :, None]  # [S, Qm, L]
        if W is not None:
            m &= kpos[:, None, :] > (q_pos[:, :, None] - W)
        m = m[:, None].expand(S, G, Qm, NB * bs).reshape(S, 1, G * Qm, NB * bs)
        # additive float mask, built once per step (sdpa would otherwise convert a bool mask per
        # layer)
        mask = torch.zeros(m.shape, dtype=dtype).masked_fill_(~m, float("-inf"))
        n_read = (last_blk - first_blk + 1).tolist()
        groups.append(
            GroupStep(
                sliding_window=W,
                write_rows=write_rows.reshape(-1).to(device),
                write_rows_v=(write_rows.reshape(-1) + Hkv * bs).to(device),
                gather_rows=gather_rows.reshape(-1).to(device),
                num_ctx_blocks=NB,
                mask=mask.to(device),
                gathered_block_ids=[row[:k] for row, k in zip(gb.tolist(), n_read)],
            )
        )
    if pool_views is None:
        pool_views = pool_views_of(kv_caches)
    return PagedStep(
        kv_caches=kv_caches,
        pool_rows=pool_views[0],
        pool_blocks=pool_views[1],
        layer_group=layer_group,
        groups=groups,
        num_seqs=S,
        max_query_len=Qm,
        num_tokens=T,
        q_index=None if q_index is None else q_index.to(device),
        out_index=None if out_index is None else out_index.to(device),
    )


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    paged_step: PagedStep | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Write this layer's new K/V into its block pool, then attend over each sequence's blocks."""
    if paged_step is None:
        raise RuntimeError(
            f"attention '{ATTN_NAME}' was called without a paged_step; "
            "use kvcore.worker.gpu.model_runner.GPUModelRunner"
        )
    step = paged_step
    layer = module.layer_idx
    gs = step.groups[step.layer_group[layer]]
    blocks = step.pool_blocks[layer]
    _, bs, D = blocks.shape
    _, Hq, T, _ = query.shape
    Hkv = key.shape[1]
    G = Hq // Hkv
    S, Qm = step.num_seqs, step.max_query_len

    # 1) write: K rows [Hkv, T] of the pool seen as [num_blocks*2*Hkv*bs, D]; V's are Hkv*bs further
    rows = step.pool_rows[layer]
    rows.index_copy_(0, gs.write_rows, key.reshape(Hkv * T, D))
    rows.index_copy_(0, gs.write_rows_v, value.reshape(Hkv * T, D))

    # 2) gather every sequence's visible blocks at once: K and V [S, Hkv, NB*bs, D]
    k, v = (
        blocks.index_select(0, gs.gather_rows).view(S, 2, Hkv, gs.num_ctx_blocks * bs, D).unbind(1)
    )

    # 3) queries grouped under their KV head: [S, Hkv, G*Qm, D] (no repeat of K/V needed)
    if step.q_index is None:  # decode only: one query per sequence, T == S
        qp = query.view(Hkv, G, S, D).permute(2, 0, 1, 3)
        out = F.scaled_dot_product_attention(qp, k, v, attn_mask=gs.mask, scale=scaling)
        return out.reshape(1, S, Hq, D), None
    qp = (
        query.view(Hkv, G, T, D)
        .index_select(2, step.q_index)
        .view(Hkv, G, S, Qm, D)
        .permute(2, 0, 1, 3, 4)
        .reshape(S, Hkv, G * Qm, D)
    )
    out = F.scaled_dot_product_attention(qp, k, v, attn_mask=gs.mask, scale=scaling)
    # out: [S, Hkv, G*Qm, D] -> packed [1, T, Hq, D]
    out = out.view(S, Hkv, G, Qm, D).permute(0, 3, 1, 2, 4).reshape(S * Qm, Hq, D)
    return out.index_select(0, step.out_index).unsqueeze(0), None


AttentionInterface.register(ATTN_NAME, paged_attention_forward)
