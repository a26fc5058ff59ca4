"""The model, loaded once per server process and shared (read-only) by every session."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import streamlit as st

from kvcore.model.shapes import ATTENTION_MODELS, DEVICE_CHOICES

# the sidebar's choices: the models every lesson plays on, and the loader's devices
MODELS = ATTENTION_MODELS
DEVICES = DEVICE_CHOICES
ENV_MODEL = "PAGED_KV_LAB_MODEL"
ENV_DEVICE = "PAGED_KV_LAB_DEVICE"

# what this process has loaded (to show progress only when needed)
_LOADED: set[tuple[str, str]] = set()


@dataclass
class ModelState:
    name: str
    device: str
    model: object | None
    error: str | None
    seconds: float


def default_model() -> str:
    v = os.environ.get(ENV_MODEL, "smollm2")
    return v if v in MODELS else "smollm2"


def default_device() -> str:
    v = os.environ.get(ENV_DEVICE, "auto")
    return v if v in DEVICES else "auto"


@st.cache_resource(show_spinner=False, max_entries=4)
def _load(name: str, device: str):
    from kvcore.model import load_model

    t0 = time.perf_counter()
    model = load_model(name, device)
    return model, time.perf_counter() - t0


def engine_lock() -> threading.Lock:
    """One forward at a time per process: sessions share the weights, and this box has 2 cores.
    The run store's worker takes it for one engine step at a time (runstore/store.py)."""
    from paged_kv_lab.store.run_store import ENGINE_LOCK

    return ENGINE_LOCK


def get_model(name: str, device: str, status_text: str | None = None) -> ModelState:
    """Load (or fetch from the process cache) a model; errors come back as text, never raised."""
    try:
        if (name, device) not in _LOADED and status_text:
            with st.status(status_text, expanded=False) as box:
                model, secs = _load(name, device)
                box.update(state="complete")
        else:
            model, secs = _load(name, device)
        _LOADED.add((name, device))
        return ModelState(name, device, model, None, secs)
    except Exception as e:  # unknown model, missing wheel, no CUDA: the app keeps running
        return ModelState(name, device, None, f"{type(e).__name__}: {e}", 0.0)


def model_summary(model) -> dict:
    cfg = model.config
    heads = int(cfg.num_attention_heads)
    return {
        "layers": int(cfg.num_hidden_layers),
        "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        "dtype": str(getattr(model, "dtype", "float32")).replace("torch.", ""),
        "device": str(getattr(model, "device", "cpu")),
    }


def played_model_state(lesson, ms: ModelState, status_text: str | None = None) -> ModelState:
    """The model a lesson (or a case) plays on: its own (``Lesson.model``, on the device of the
    sidebar's ``ms``), loaded once per process, or ``ms`` itself."""
    if lesson.model is None or lesson.model == ms.name:
        return ms
    return get_model(lesson.model, ms.device, status_text)
