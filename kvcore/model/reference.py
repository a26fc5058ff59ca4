"""transformers models that share the loaded weights: the references the engine is checked against,
and (``agreement_with_generate``) how far a paged run drifts from them in the model's dtype."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from kvcore.model.loader import LoadedModel


def _share_weights_into(cls, config, source_model):
    """Build ``cls(config)`` without allocating, then point its parameters at ``source_model``'s."""
    with torch.device("meta"):
        new = cls(config)
    state = source_model.state_dict()
    missing, unexpected = new.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not m.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"weights do not fit {cls.__name__}: missing={missing} unexpected={unexpected}"
        )
    if getattr(config, "tie_word_embeddings", False):
        new.lm_head.weight = new.model.embed_tokens.weight
    # Non-persistent buffers (rotary inv_freq) are not in the state dict: rebuild them.
    device = next(source_model.parameters()).device
    rotary = type(new.model.rotary_emb)(config=config).to(device)
    for name, buf in source_model.model.rotary_emb.named_buffers():
        if hasattr(rotary, name) and getattr(rotary, name).shape == buf.shape:
            setattr(rotary, name, buf)  # the very same inverse frequencies as the source model
    new.model.rotary_emb = rotary
    for n, t in list(new.named_parameters()) + list(new.named_buffers()):
        if t.is_meta:
            raise RuntimeError(f"{n} stayed on the meta device")
    new.generation_config = copy.deepcopy(source_model.generation_config)
    return new.eval().requires_grad_(False)


def shared_clone(model):
    """A new module tree sharing every parameter/buffer tensor with ``model``, with its own config.

    The runner uses it to switch the attention implementation without touching the
    caller's model (so ``loaded.model.generate`` keeps working).
    """
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def reference_model(
    loaded: LoadedModel,
    sliding_window: int | None = None,
    layer_types: Sequence[str] | None = None,
):
    """A transformers model on the same weights, for comparisons with sliding windows.

    - neither argument: a shared-weight LlamaForCausalLM (sdpa attention);
    - ``sliding_window=W`` only: ``MistralForCausalLM`` with a window of W on all layers;
    - ``layer_types`` (``"full_attention"`` / ``"sliding_attention"`` per layer) with W:
      ``MinistralForCausalLM``.
    transformers' window convention (checked on 5.23, ``masking_utils.sliding_window_overlay``:
    ``kv_idx > q_idx - sliding_window``): a query at position p sees keys p-W+1 .. p, i.e.
    itself and the W-1 tokens before it; the paged kernel uses the same convention.
    The parameters are shared with ``loaded.model`` (nothing is copied).
    """
    src = loaded.model
    base = src.config.to_dict()
    for k in (
        "architectures",
        "model_type",
        "transformers_version",
        "quantization_config",
        "_name_or_path",
        "sliding_window",
        "layer_types",
        "use_sliding_window",
    ):
        base.pop(k, None)
    base["tie_word_embeddings"] = bool(getattr(src.config, "tie_word_embeddings", False))
    if layer_types is not None:
        from transformers import MinistralConfig, MinistralForCausalLM

        layer_types = list(layer_types)
        if len(layer_types) != src.config.num_hidden_layers:
            raise ValueError("layer_types needs one entry per decoder layer")
        bad = set(layer_types) - {"full_attention", "sliding_attention"}
        if bad:
            raise ValueError(f"unknown layer types {bad}")
        if "sliding_attention" in layer_types and not sliding_window:
            raise ValueError("sliding layers need a sliding_window")
        cfg = MinistralConfig(**base, sliding_window=sliding_window, layer_types=layer_types)
        cls = MinistralForCausalLM
    elif sliding_window is not None:
        from transformers import MistralConfig, MistralForCausalLM

        cfg = MistralConfig(**base, sliding_window=int(sliding_window))
        cls = MistralForCausalLM
    else:
        return shared_clone(src)
    cfg._attn_implementation = "sdpa"
    return _share_weights_into(cls, cfg, src)


# -- half precision: how far the paged runner drifts from transformers ---------------------------
@dataclass(frozen=True)
class Agreement:
    """How closely the paged runner follows transformers in the model's own dtype.

    paged_diff: largest |logit difference| between the paged runner and one full forward of
    transformers over the same tokens (same weights, same dtype).  reference_noise: the same
    measure between transformers' own ``generate`` (with its KV cache) and that full forward --
    how far two correct implementations already drift apart in this dtype.  A greedy divergence
    is *explained* when, at the first differing position, ``generate``'s logits rank the two
    candidates closer than ``paged_diff + reference_noise`` (a near tie that rounding may flip).
    """

    dtype: str
    paged_diff: float
    reference_noise: float
    tokens_equal: int  # tokens equal to generate's, each request up to its first difference
    tokens_total: int  # tokens compared (each request: the shorter of the two outputs)
    # (request, position, generate's top-2 margin there)
    divergences: tuple[tuple[str, int, float], ...]

    @property
    def divergences_explained(self) -> bool:
        bound = self.paged_diff + self.reference_noise
        return all(margin <= bound for _, _, margin in self.divergences)


@torch.inference_mode()
def reference_logits(model, prompt: Sequence[int], output: Sequence[int]) -> torch.Tensor:
    """Logits (float32, CPU) predicting each output token, from one full forward of
    prompt + output."""
    dev = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(output)], dtype=torch.long, device=dev)
    logits = model(ids, use_cache=False).logits[0].float().cpu()
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(output)]


@torch.inference_mode()
def agreement_with_generate(
    loaded: LoadedModel,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    paged_tokens: Mapping[str, Sequence[int]],
    paged_logits: Mapping[str, Sequence[torch.Tensor]],
) -> Agreement:
    """Compare a paged run of ``prompts`` (request ``r{i}`` is prompt i: its greedy tokens and,
    per sampled position, its logits as float32 [vocab]) with ``loaded.model.generate``, one
    prompt at a time, up to ``new_tokens`` tokens.  Both stop at the model's EOS (no logits
    processor touches ``generate``'s greedy choice, so its raw logits are the ones it chose
    from); a request is compared over the tokens both produced.  Whoever drives the paged
    runner (the recording engine in tests/differential/test_model_dtype.py, bare kvcore in
    bench/bench_dtype.py) hands its outputs here."""
    model = loaded.model
    dev = next(model.parameters()).device
    eos = sorted(loaded.eos_ids)
    pad = getattr(loaded.tokenizer, "pad_token_id", None) or 0
    paged_diff = noise = 0.0
    equal = total = 0
    divergences = []
    for i, p in enumerate(prompts):
        rid = f"r{i}"
        ids = torch.tensor([list(p)], dtype=torch.long, device=dev)
        gen = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            output_logits=True,
            return_dict_in_generate=True,
        )
        g = gen.sequences[0, len(p) :].tolist()
        g_logits = torch.stack([lg[0].float().cpu() for lg in gen.logits])
        noise = max(noise, (g_logits - reference_logits(model, p, g)).abs().max().item())
        o = list(paged_tokens[rid])
        p_logits = torch.stack(list(paged_logits[rid]))
        paged_diff = max(paged_diff, (p_logits - reference_logits(model, p, o)).abs().max().item())
        n = min(len(o), len(g))
        k = next((j for j in range(n) if o[j] != g[j]), n)
        equal += k
        total += n
        if k < n:
            divergences.append((rid, k, (g_logits[k, g[k]] - g_logits[k, o[k]]).item()))
    return Agreement(
        str(loaded.dtype).replace("torch.", ""), paged_diff, noise, equal, total, tuple(divergences)
    )
