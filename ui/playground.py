"""The playground's forms: every engine setting, and requests with free text."""

from __future__ import annotations

import copy
import string

import streamlit as st

from lessons.catalog import Lesson
from record.budget import app_limits
from record.scenario import EngineSettings
from ui.modelstate import ModelState
from ui.state import SETTING_DEFAULTS, LessonState, rebuild
from words.i18n import tr

CHOICES = {
    "hash_algo": ("xxhash", "sha256", "sha256_cbor", "xxhash_cbor"),
    "policy": ("fcfs", "priority"),
    "free_order": ("v0.33", "legacy"),
    "admission": ("full_sequence", "first_chunk"),
}


def form_max(name: str) -> int:
    """The form's maximum for a setting: the server's budget limit for it (record/budget.py)."""
    lim = app_limits()
    return {
        "block_size": lim.max_block_size,
        "num_gpu_blocks": lim.max_num_gpu_blocks,
        "max_num_seqs": lim.max_requests,
        "max_num_batched_tokens": lim.max_num_batched_tokens,
    }[name]


def _next_id(existing: list[str]) -> str:
    for c in string.ascii_uppercase:
        if c not in existing:
            return c
    return f"R{len(existing)}"


def settings_form(state: LessonState, lesson: Lesson, ms: ModelState, lang: str) -> None:
    eng = {**SETTING_DEFAULTS, **state.base.get("engine", {})}

    def hint(name: str) -> str | None:  # a setting without a help text shows none
        text = tr(f"playground.help.{name}", lang)
        return None if text == f"playground.help.{name}" else text

    layer_names = {
        "uniform": tr("playground.layers_uniform", lang),
        "hybrid": tr("playground.layers_hybrid", lang),
    }
    with st.form(f"settings:{lesson.id}"):
        st.markdown(f"**{tr('settings', lang)}**")
        c = st.columns(4)
        for i, name in enumerate(
            ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")
        ):
            top = form_max(name)
            c[i].number_input(
                name,
                min_value=2 if name == "num_gpu_blocks" else 1,
                max_value=top,
                value=min(int(eng[name]), top),
                step=1,
                key=f"pg_{name}",
                help=hint(name),
            )
        c = st.columns(5)
        for i, (name, opts) in enumerate(CHOICES.items()):
            c[i].selectbox(
                name,
                opts,
                index=opts.index(eng[name]) if eng[name] in opts else 0,
                key=f"pg_{name}",
                help=hint(name),
            )
        c = st.columns(4)
        c[0].checkbox(
            "enable_prefix_caching",
            value=bool(eng["enable_prefix_caching"]),
            key="pg_enable_prefix_caching",
        )
        c[1].number_input(
            "sliding_window",
            min_value=0,
            max_value=100000,
            value=int(eng["sliding_window"] or 0),
            key="pg_sliding_window",
            help=hint("sliding_window"),
        )
        c[2].selectbox(
            tr("playground.layers", lang),
            ("uniform", "hybrid"),
            format_func=layer_names.get,
            index=1 if state.overrides.get("layers") == "hybrid" else 0,
            key="pg_layers",
        )
        c[3].number_input(
            "seed (0 = greedy)",
            min_value=0,
            max_value=2**31 - 1,
            value=int(eng["seed"] or 0),
            key="pg_seed",
        )
        c = st.columns(4)
        retention = eng.get("prefix_cache_retention_interval", 0)
        c[0].number_input(
            "prefix_cache_retention_interval",
            min_value=-1,
            max_value=100000,
            value=-1 if retention is None else int(retention),
            step=1,
            key="pg_prefix_cache_retention_interval",
            help=hint("prefix_cache_retention_interval"),
        )
        c[1].number_input(
            "watermark",
            min_value=0.0,
            max_value=0.99,
            value=float(eng.get("watermark") or 0.0),
            step=0.05,
            key="pg_watermark",
            help=hint("watermark"),
        )
        cap = eng.get("max_cache_hit_length")
        c[2].number_input(
            "max_cache_hit_length",
            min_value=-1,
            max_value=10**6,
            value=-1 if cap is None else int(cap),
            step=1,
            key="pg_max_cache_hit_length",
            help=hint("max_cache_hit_length"),
        )
        c[3].text_input(
            "hash_seed",
            value=eng.get("hash_seed") or "",
            max_chars=64,
            key="pg_hash_seed",
            help=hint("hash_seed"),
        )
        st.form_submit_button(
            tr("playground.apply", lang), on_click=on_apply_settings, args=(state, lesson, ms)
        )


def on_apply_settings(state: LessonState, lesson: Lesson, ms: ModelState) -> None:
    ss = st.session_state
    vals = {
        name: int(ss[f"pg_{name}"])
        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")
    }
    vals.update({name: ss[f"pg_{name}"] for name in CHOICES})
    vals["enable_prefix_caching"] = bool(ss["pg_enable_prefix_caching"])
    vals["sliding_window"] = int(ss["pg_sliding_window"]) or None
    vals["seed"] = int(ss["pg_seed"]) or None
    retention = int(ss["pg_prefix_cache_retention_interval"])
    vals["prefix_cache_retention_interval"] = None if retention < 0 else retention
    vals["watermark"] = float(ss["pg_watermark"])
    cap = int(ss["pg_max_cache_hit_length"])
    vals["max_cache_hit_length"] = None if cap < 0 else cap
    vals["hash_seed"] = str(ss["pg_hash_seed"]) or None
    base = copy.deepcopy(state.base)
    new_eng = {
        k: v
        for k, v in {**base.get("engine", {}), **vals}.items()
        if k in EngineSettings.__dataclass_fields__
    }
    new_eng.pop("layer_types", None)
    base["engine"] = new_eng
    over = {} if ss["pg_layers"] == "uniform" else {"layers": "hybrid"}
    err = rebuild(state, lesson, ms, base=base, overrides=over, keep_step=True)
    if err:
        state.error = err


def request_form(state: LessonState, lesson: Lesson, ms: ModelState, lang: str) -> None:
    existing = [r["id"] for r in state.base.get("requests", [])]
    with st.form(f"addreq:{lesson.id}", clear_on_submit=False):
        st.markdown(f"**{tr('playground.add_title', lang)}**")
        c = st.columns([1, 4])
        c[0].text_input("id", value=_next_id(existing), key="pg_req_id")
        c[1].text_input(
            tr("playground.prompt", lang),
            value="What is paged attention?",
            key="pg_req_text",
            max_chars=app_limits().max_prompt_chars,
        )
        c = st.columns(5)
        c[0].checkbox("chat", value=True, key="pg_req_chat")
        c[1].number_input("max_tokens", 1, app_limits().max_tokens, 12, key="pg_req_max")
        c[2].number_input("priority", -100, 100, 0, key="pg_req_prio")
        c[3].text_input("cache_salt", value="", key="pg_req_salt")
        c[4].checkbox("ignore_eos", value=False, key="pg_req_eos")
        c = st.columns(5)
        c[0].number_input("n", 1, 8, 1, key="pg_req_n", help=tr("playground.help.n", lang))
        c[1].number_input(
            "seed", 0, 2**31 - 1, None, key="pg_req_seed", help=tr("playground.help.seed", lang)
        )
        st.form_submit_button(
            tr("playground.add", lang),
            type="primary",
            on_click=on_add_request,
            args=(state, lesson, ms),
        )


def on_add_request(state: LessonState, lesson: Lesson, ms: ModelState) -> None:
    ss = st.session_state
    add_request(
        state,
        lesson,
        ms,
        {
            "id": str(ss["pg_req_id"]).strip(),
            "prompt": ss["pg_req_text"],
            "chat": bool(ss["pg_req_chat"]),
            "max_tokens": int(ss["pg_req_max"]),
            "priority": int(ss["pg_req_prio"]),
            "cache_salt": ss["pg_req_salt"] or None,
            "ignore_eos": bool(ss["pg_req_eos"]),
            "n": int(ss["pg_req_n"]),
            "seed": None if ss["pg_req_seed"] is None else int(ss["pg_req_seed"]),
        },
    )
    if state.error is None:
        del ss["pg_req_id"]  # the next request gets the next free letter


def add_request(state: LessonState, lesson: Lesson, ms: ModelState, req: dict) -> str | None:
    """Append a request arriving at the next step and replay to the current one."""
    base = copy.deepcopy(state.base)
    cursor = state.run.cursor if state.run else 0
    base.setdefault("requests", []).append({**req, "arrival_step": cursor})
    err = rebuild(state, lesson, ms, base=base, keep_step=True)
    if err:
        state.error = err
    return err
