"""transformers models that share the loaded weights: the references the engine is checked against."""

from __future__ import annotations

import copy
from typing import Sequence

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
        raise RuntimeError(f"weights do not fit {cls.__name__}: missing={missing} unexpected={unexpected}")
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
    """A new module tree sharing every parameter/buffer tensor with ``model`` but with its own config.

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
    for k in ("architectures", "model_type", "transformers_version", "quantization_config",
              "_name_or_path", "sliding_window", "layer_types", "use_sliding_window"):
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
