"""An EAGLE-style draft head for the loaded model, fitted offline from the model's own text.

EAGLE drafts at the level of features: from the target's hidden state at position t and the token
at t + 1 it predicts the hidden state at t + 1, and the target's own LM head turns that into the
draft for t + 2; the predicted feature then stands in for the next hidden state, k times. vLLM's
EAGLE head is a decoder layer with K/V of its own; ours is the smallest head of that shape, one
linear map over ``[hidden_t ; embedding(token_{t+1})]`` (plus a bias), so it needs the target's
hidden states and nothing else, and it writes no K/V.

The map is fitted by ridge regression (closed form, float64) on the model's own greedy text:
``NUM_PROMPTS`` prompts of seeded random token ids, each continued greedily by the model for
``GEN_TOKENS`` tokens, then one teacher-forced pass for the hidden states (the output of the final
norm, which is what the LM head reads). Nothing is downloaded and no gradient is taken. The head is
made once per model and kept in the model cache (``$PAGED_KV_LAB_CACHE`` or
``~/.cache/paged-kv-lab``): ``python scripts/make_eagle_head.py`` makes it ahead, else the first
engine that asks for it does. Its acceptance does not change what is generated: drafts are
verified greedily by the target.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from kvcore.model.gguf_cache import cache_root
from kvcore.model.loader import LoadedModel

SEED = 0
NUM_PROMPTS = 32
PROMPT_TOKENS = 8
GEN_TOKENS = 48
RIDGE = 1e-3  # times the mean diagonal of X^T X
FORMAT = 1


@dataclass
class EagleHead:
    """``next_feature([h ; e]) = [h ; e] @ weight + bias``: ``weight`` [2 * hidden, hidden]."""

    weight: torch.Tensor
    bias: torch.Tensor

    def next_feature(self, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        x = torch.cat([hidden, embeds], dim=-1).to(self.weight.dtype)
        return x @ self.weight + self.bias


def model_key(loaded: LoadedModel) -> str:
    """Which weights a head belongs to: the model's name, its config and a digest of its
    embedding and final-norm weights."""
    m = loaded.model
    digest = hashlib.sha256()
    digest.update(json.dumps(loaded.config.to_dict(), sort_keys=True, default=str).encode())
    for t in (m.model.embed_tokens.weight[:256], m.model.norm.weight):
        digest.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    return f"{loaded.name}-{digest.hexdigest()[:16]}"


def head_path(loaded: LoadedModel) -> Path:
    return cache_root() / f"eagle-head-v{FORMAT}-{model_key(loaded)}.pt"


def _training_text(loaded: LoadedModel) -> torch.Tensor:
    """[NUM_PROMPTS, PROMPT_TOKENS + GEN_TOKENS] token ids: seeded prompts, greedy continuations."""
    m = loaded.model
    gen = torch.Generator().manual_seed(SEED)
    vocab = min(int(loaded.config.vocab_size), 16384)
    prompts = torch.randint(0, vocab, (NUM_PROMPTS, PROMPT_TOKENS), generator=gen)
    prompts = prompts.to(loaded.device)
    out = m.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=GEN_TOKENS,
        min_new_tokens=GEN_TOKENS,
        do_sample=False,
        pad_token_id=0,
    )
    return out[:, : PROMPT_TOKENS + GEN_TOKENS]


@torch.inference_mode()
def fit_eagle_head(loaded: LoadedModel) -> EagleHead:
    """The ridge-regression fit described above, on ``loaded``'s own greedy text."""
    m = loaded.model
    ids = _training_text(loaded)
    hidden = m.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    embeds = m.model.embed_tokens(ids)
    # the model's own tokens only: from the last prompt position on
    start = PROMPT_TOKENS - 1
    x = torch.cat([hidden[:, start:-1], embeds[:, start + 1 :]], dim=-1)
    y = hidden[:, start + 1 :]
    x = x.reshape(-1, x.shape[-1]).double().cpu()
    y = y.reshape(-1, y.shape[-1]).double().cpu()
    x = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=1)
    gram = x.T @ x
    gram += torch.eye(gram.shape[0], dtype=gram.dtype) * (RIDGE * gram.diagonal().mean())
    solution = torch.linalg.solve(gram, x.T @ y)
    dtype = loaded.dtype
    return EagleHead(
        solution[:-1].to(dtype).to(loaded.device), solution[-1].to(dtype).to(loaded.device)
    )


def eagle_head_for(loaded: LoadedModel) -> EagleHead:
    """The model's head from the cache, fitted and stored there first if it is not yet."""
    path = head_path(loaded)
    if path.exists():
        state = torch.load(path, map_location=loaded.device, weights_only=True)
        return EagleHead(state["weight"].to(loaded.dtype), state["bias"].to(loaded.dtype))
    head = fit_eagle_head(loaded)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    torch.save({"weight": head.weight.cpu(), "bias": head.bias.cpu()}, tmp)
    os.replace(tmp, path)  # a half-written head is never read
    return head
