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

Per layer the function (1) writes the step's new K/V into the pool through the slot
mapping, then (2) gathers, for every sequence at once (one padded gather, no loop over
sequences or tokens), the blocks its queries may see, and (3) runs causal,
grouped-query attention with ``scaled_dot_product_attention`` under a boolean mask.
On a sliding-window layer a query at position p sees keys p-W+1 .. p (transformers'
convention), and only the blocks from ``(start - W + 1) // block_size`` on are gathered:
table entries before that are outside every query's window -- the block manager replaces
them with the null block 0, and they are never read.  Padding columns of the gather
repeat the sequence's own last block and are masked, so block 0 is never read at all.

Everything that depends only on the batch (indices, masks) is computed once per step in
:func:`build_paged_step` and shared by all layers of a KV cache group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ATTN_NAME = "kvlab_paged"
NULL_BLOCK = 0


@dataclass
class GroupStep:
    """Per KV cache group, per step: where to write, what to gather, and the mask."""

    sliding_window: int | None
    write_rows: torch.Tensor   # [Hkv*T] rows of pool.view(-1, D) receiving the new K
    write_rows_v: torch.Tensor  # the same for V (K's rows + Hkv*bs)
    gather_rows: torch.Tensor  # [S*2*Hkv*NB] rows of pool.view(-1, bs, D) to gather
    num_ctx_blocks: int        # NB: gathered blocks per sequence (padded)
    mask: torch.Tensor         # [S, 1, G*Qm, NB*bs] additive: 0 = may attend, -inf = masked
    gathered_block_ids: list[list[int]]  # per sequence, the physical blocks read (for displays/tests)


@dataclass
class PagedStep:
    """Everything a layer needs for one forward; passed to ``model(...)`` as ``paged_step=``."""

    kv_caches: Sequence[torch.Tensor]  # per layer [num_blocks, 2, Hkv, bs, D]
    pool_rows: Sequence[torch.Tensor]    # per layer, the pool viewed as [num_blocks*2*Hkv*bs, D]
    pool_blocks: Sequence[torch.Tensor]  # per layer, the pool viewed as [num_blocks*2*Hkv, bs, D]
    layer_group: Sequence[int]         # per layer, its KV cache group
    groups: list[GroupStep]
    num_seqs: int                      # S
    max_query_len: int                 # Qm
    num_tokens: int                    # T
    q_index: torch.Tensor | None       # [S*Qm] packed token of each padded query; None = decode-only
    out_index: torch.Tensor | None     # [T] padded query row of each packed token


def _check_tables(item_no: int, request_id: str, table: Sequence[int], first: int, last: int,
                  num_blocks: int, group: int, sliding: int | None) -> None:
    if len(table) <= last:
        raise ValueError(
            f"request {request_id!r}: block table of group {group} has {len(table)} entries but the "
            f"step needs logical block {last}"
        )
    used = table[first:last + 1]
    if NULL_BLOCK in used:
        where = first + list(used).index(NULL_BLOCK)
        what = ("inside the sliding window" if sliding else "in a full-attention table")
        raise ValueError(
            f"request {request_id!r}: logical block {where} of group {group} is the null block "
            f"{what}; only blocks wholly before position start-W+1 may be null"
        )
    hi = max(used)
    lo = min(used)
    if hi >= num_blocks or lo < 0:
        raise ValueError(
            f"request {request_id!r}: block id {hi if hi >= num_blocks else lo} is outside the "
            f"pool of {num_blocks} blocks"
        )


def pool_views_of(kv_caches: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer, the two flat views the kernel indexes (made once, reused every step)."""
    rows = [t.view(-1, t.shape[-1]) for t in kv_caches]
    blocks = [t.view(-1, t.shape[-2], t.shape[-1]) for t in kv_caches]
    return rows, blocks


def build_paged_step(
    token_counts: Sequence[int],
    start_positions: Sequence[int],
    block_tables: Sequence[Sequence[Sequence[int]]],  # [seq][group] -> table
    request_ids: Sequence[str],
    group_sliding_window: Sequence[int | None],
    kv_caches: Sequence[torch.Tensor],
    layer_group: Sequence[int],
    block_size: int,
    num_blocks: int,
    num_kv_heads: int,
    num_q_per_kv: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    pool_views: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> PagedStep:
    """Index tensors and masks for one packed forward (computed once, used by every layer)."""
    S = len(token_counts)
    bs = block_size
    Hkv = num_kv_heads
    G = num_q_per_kv
    lens = torch.tensor(token_counts, dtype=torch.long)
    starts = torch.tensor(start_positions, dtype=torch.long)
    T = int(sum(token_counts))
    Qm = int(max(token_counts))
    offsets = torch.cumsum(lens, 0) - lens                      # first packed token of each seq
    seq_of_tok = torch.repeat_interleave(torch.arange(S), lens)  # [T]
    tok_in_seq = torch.arange(T) - offsets[seq_of_tok]           # [T]
    pos_of_tok = starts[seq_of_tok] + tok_in_seq                 # [T]

    decode_only = Qm == 1
    # padded queries: row (s, qi) is token min(qi, len-1) of seq s (padding repeats the last one)
    qi = torch.minimum(torch.arange(Qm)[None, :], (lens - 1)[:, None])  # [S, Qm]
    q_pos = starts[:, None] + qi                                         # [S, Qm]
    if decode_only:
        q_index = out_index = None
    else:
        q_index = (offsets[:, None] + qi).reshape(-1)
        out_index = seq_of_tok * Qm + tok_in_seq

    last_blk = [(s + n - 1) // bs for s, n in zip(start_positions, token_counts)]
    groups: list[GroupStep] = []
    kv_sel = torch.arange(2)[None, :, None, None]
    head_sel = torch.arange(Hkv)[None, None, :, None]
    for g, W in enumerate(group_sliding_window):
        if W is not None and W < 1:
            raise ValueError(f"sliding window of group {g} must be >= 1, got {W}")
        if W is None:
            first_blk = [0] * S
        else:
            first_blk = [max(0, s - W + 1) // bs for s in start_positions]
        ids: list[list[int]] = []
        for i in range(S):
            table = block_tables[i][g]
            _check_tables(i, request_ids[i], table, first_blk[i], last_blk[i], num_blocks, g, W)
            ids.append(list(table[first_blk[i]:last_blk[i] + 1]))
        NB = max(len(b) for b in ids)
        # pad with the sequence's own last block (masked below): block 0 is never read
        padded = [b + [b[-1]] * (NB - len(b)) for b in ids]
        gb = torch.tensor(padded, dtype=torch.long)                     # [S, NB]
        first_t = torch.tensor(first_blk, dtype=torch.long)
        # where the new tokens go
        blk_of_tok = gb[seq_of_tok, pos_of_tok // bs - first_t[seq_of_tok]]  # [T]
        off_of_tok = pos_of_tok % bs
        heads = torch.arange(Hkv)[:, None]
        write_rows = ((blk_of_tok[None, :] * 2) * Hkv + heads) * bs + off_of_tok[None, :]  # [Hkv, T]
        # what to read: rows of pool.view(-1, bs, D) in [S, 2, Hkv, NB] order
        gather_rows = (gb[:, None, None, :] * 2 + kv_sel) * Hkv + head_sel
        # mask: key at position kpos visible to query at q_pos iff kpos <= q_pos (and in window)
        kpos = ((first_t[:, None] + torch.arange(NB)[None, :]) * bs)[:, :, None] + torch.arange(bs)
        kpos = kpos.reshape(S, NB * bs)                                   # [S, L]
        m = kpos[:, None, :] <= q_pos[:, :, None]                         # [S, Qm, L]
        if W is not None:
            m &= kpos[:, None, :] > (q_pos[:, :, None] - W)
        m = m[:, None].expand(S, G, Qm, NB * bs).reshape(S, 1, G * Qm, NB * bs)
        # additive float mask, built once per step (sdpa would otherwise convert a bool mask per layer)
        mask = torch.zeros(m.shape, dtype=dtype).masked_fill_(~m, float("-inf"))
        groups.append(GroupStep(
            sliding_window=W,
            write_rows=write_rows.reshape(-1).to(device),
            write_rows_v=(write_rows.reshape(-1) + Hkv * bs).to(device),
            gather_rows=gather_rows.reshape(-1).to(device),
            num_ctx_blocks=NB,
            mask=mask.to(device),
            gathered_block_ids=ids,
        ))
    if pool_views is None:
        pool_views = pool_views_of(kv_caches)
    return PagedStep(
        kv_caches=kv_caches, pool_rows=pool_views[0], pool_blocks=pool_views[1],
        layer_group=layer_group, groups=groups, num_seqs=S,
        max_query_len=Qm, num_tokens=T,
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
            f"attention '{ATTN_NAME}' was called without a paged_step; use kvcore.model.ModelRunner"
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
    k, v = blocks.index_select(0, gs.gather_rows).view(S, 2, Hkv, gs.num_ctx_blocks * bs, D).unbind(1)

    # 3) queries grouped under their KV head: [S, Hkv, G*Qm, D] (no repeat of K/V needed)
    if step.q_index is None:  # decode only: one query per sequence, T == S
        qp = query.view(Hkv, G, S, D).permute(2, 0, 1, 3)
        out = F.scaled_dot_product_attention(qp, k, v, attn_mask=gs.mask, scale=scaling)
        return out.reshape(1, S, Hq, D), None
    qp = (query.view(Hkv, G, T, D).index_select(2, step.q_index).view(Hkv, G, S, Qm, D)
          .permute(2, 0, 1, 3, 4).reshape(S, Hkv, G * Qm, D))
    out = F.scaled_dot_product_attention(qp, k, v, attn_mask=gs.mask, scale=scaling)
    # out: [S, Hkv, G*Qm, D] -> packed [1, T, Hq, D]
    out = out.view(S, Hkv, G, Qm, D).permute(0, 3, 1, 2, 4).reshape(S * Qm, Hq, D)
    return out.index_select(0, step.out_index).unsqueeze(0), None


AttentionInterface.register(ATTN_NAME, paged_attention_forward)
