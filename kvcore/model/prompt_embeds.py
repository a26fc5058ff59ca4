"""Embedding rows a scenario can write down: a text's own input-embedding rows, plus seeded noise.

Ours, no vLLM counterpart: vLLM's caller hands it a tensor (``prompt_embeds``, or an encoder's
output for a multimodal item). A scenario file names where the rows come from instead, and this
turns that into rows: the model's embedding of the text's tokens (none: zeros), plus Gaussian
noise from a CPU generator seeded with ``seed`` and scaled by ``scale``, cast to the model's dtype
(as vLLM casts the tensors it is given). A row is its raw bytes, as kvcore's Request keeps it, so
its block hashes hash exactly the bytes the model is fed.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from kvcore.model.loader import LoadedModel


def embedding_rows(
    loaded: LoadedModel,
    token_ids: Optional[Sequence[int]],
    num_rows: int,
    noise_seed: Optional[int] = None,
    noise_scale: float = 0.0,
) -> list[bytes]:
    """``num_rows`` rows (raw bytes, the model's dtype) of width ``hidden_size``: the input
    embeddings of ``token_ids`` (which then number ``num_rows``) or zeros, plus the seeded noise.
    Same arguments -> the same bytes, on any device; row i depends on token i, the seed and i
    only."""
    hidden = int(loaded.config.hidden_size)
    if token_ids is not None:
        if len(token_ids) != num_rows:
            raise ValueError(f"{len(token_ids)} token ids for {num_rows} rows")
        weight = loaded.model.get_input_embeddings().weight
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=weight.device)
        rows = weight.detach()[ids].float().cpu()
    else:
        rows = torch.zeros((num_rows, hidden), dtype=torch.float32)
    if noise_seed is not None and noise_scale:
        # one draw per row, in order: row i's noise depends on the seed and i alone, so two
        # prompts whose texts share their first tokens share their first rows (and blocks)
        gen = torch.Generator(device="cpu").manual_seed(int(noise_seed))
        noise = torch.stack([torch.randn(hidden, generator=gen) for _ in range(num_rows)])
        rows = rows + noise * float(noise_scale)
    rows = rows.to(loaded.dtype).contiguous()
    return [bytes(r.view(torch.uint8).numpy().tobytes()) for r in rows]


def rows_tensor(rows: Sequence[bytes], dtype: torch.dtype) -> torch.Tensor:
    """The rows as one tensor [len(rows), hidden] of ``dtype`` (the inverse of
    :func:`embedding_rows`' bytes)."""
    flat = torch.frombuffer(bytearray(b"".join(rows)), dtype=dtype)
    return flat.view(len(rows), -1)
