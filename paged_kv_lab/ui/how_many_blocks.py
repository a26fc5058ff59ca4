"""How many blocks? The loaded model's memory profile and vLLM's num_gpu_blocks arithmetic (lesson
1).

The profile (weights, peak activations of one forward at PROFILE_TOKENS, the rest) is measured once
per model and device per server process, under the engine lock like any engine step, and shared by
every session; the sliders only redo the arithmetic (kvcore.model.memory.KVCacheSizing).
"""

from __future__ import annotations

import streamlit as st

from kvcore.model.memory import (
    DEFAULT_BLOCK_SIZE,
    KVCacheSizing,
    MemoryProfile,
    num_gpu_blocks_from_profile,
)
from paged_kv_lab.content.memory_math import DTYPES, human_bytes
from paged_kv_lab.store.server_cache import Shared
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.why.sentences import sizing_sentences

PROFILE_TOKENS = 256  # the forward profiled: the lessons' token budget, well inside the run budget
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
MAX_MODEL_LENS = (256, 512, 1024, 2048, 4096, 8192)

PROFILES: Shared[MemoryProfile] = Shared("memory profiles")  # by model, device and dtype


def _key(model) -> tuple[str, str, str]:
    return (model.name, str(model.device), str(model.dtype))


def model_profile(model) -> MemoryProfile:
    """The loaded model's memory profile, measured on first use (under the engine lock: it runs
    the model) and then shared."""

    def measure() -> MemoryProfile:
        from kvcore.model.profile import profile_model
        from paged_kv_lab.store.run_store import ENGINE_LOCK

        with ENGINE_LOCK:
            return profile_model(model, PROFILE_TOKENS)

    return PROFILES.get(_key(model), measure)


def profiled(model) -> MemoryProfile | None:
    return PROFILES.peek(_key(model))


def sizing(
    model,
    profile: MemoryProfile,
    utilization: float | None,
    block_size: int,
    kv_dtype: str,
    max_model_len: int,
    enable_extensible_kv_cache: bool | None = None,
) -> KVCacheSizing:
    """``utilization`` and ``enable_extensible_kv_cache`` None: resolved as vLLM 0.34.0 resolves
    them on a GPU (kvcore/config/cache.py, kvcore/config/vllm.py)."""
    return num_gpu_blocks_from_profile(
        profile,
        model.config,
        block_size,
        kv_dtype,
        utilization,
        max_model_len,
        enable_extensible_kv_cache=enable_extensible_kv_cache,
    )


# the panel's choices for enable_extensible_kv_cache: vLLM's default (None) first
EXTENSIBLE_CHOICES = (None, True, False)


def show_how_many_blocks(model, lang: str, key: str) -> None:
    st.markdown(f"**{tr('hmb.title', lang)}**")
    st.caption(tr("hmb.caption", lang))
    profile = profiled(model)
    if profile is None:
        if not st.button(tr("hmb.profile", lang, tokens=PROFILE_TOKENS), key=f"hmb_profile:{key}"):
            return
        try:
            profile = model_profile(model)
        except Exception as e:  # a device error is shown, never raised into the page
            st.error(f"{type(e).__name__}: {e}")
            return
    model_dtype = str(getattr(model, "dtype", "float32")).replace("torch.", "")
    max_len = int(getattr(model.config, "max_position_embeddings", 8192))
    lens = [n for n in MAX_MODEL_LENS if n <= max_len] or [max_len]
    e1, e2 = st.columns(2)
    extensible = e1.selectbox(
        "enable_extensible_kv_cache",
        EXTENSIBLE_CHOICES,
        format_func=lambda v: tr(f"hmb.extensible.{str(v).lower()}", lang),
        key=f"hmb_ext:{key}",
    )
    stated = e2.checkbox(tr("hmb.state_utilization", lang), key=f"hmb_util_on:{key}")
    c1, c2, c3, c4 = st.columns(4)
    util = c1.slider(
        "gpu_memory_utilization", 0.05, 1.0, 0.9, 0.05, key=f"hmb_util:{key}", disabled=not stated
    )
    bs = c2.select_slider(
        "block_size", options=list(BLOCK_SIZES), value=DEFAULT_BLOCK_SIZE, key=f"hmb_bs:{key}"
    )
    kv_dtype = c3.selectbox(
        tr("hmb.kv_dtype", lang),
        DTYPES,
        index=DTYPES.index(model_dtype) if model_dtype in DTYPES else 0,
        key=f"hmb_dt:{key}",
    )
    mml = c4.select_slider("max_model_len", options=lens, value=lens[-1], key=f"hmb_len:{key}")
    s = sizing(model, profile, util if stated else None, bs, kv_dtype, mml, extensible)
    m1, m2, m3 = st.columns(3)
    m1.metric("num_gpu_blocks", f"{s.num_gpu_blocks:,}")
    m2.metric(tr("hmb.max_concurrency", lang), f"{s.max_concurrency:,.2f}")
    m3.metric(tr("hmb.kv_cache", lang), human_bytes(max(s.available_kv_cache_memory, 0)))
    st.code("\n".join(s.lines()), language=None)
    for line in sizing_sentences(s):
        st.caption(tr(line, lang))
    st.caption(tr("hmb.concurrency_caption", lang, tokens=mml))
