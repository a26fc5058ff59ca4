"""The playground's forms: every engine setting, and requests with free text."""

from __future__ import annotations

import copy
import math
import string
from typing import Any, get_args, get_type_hints

import streamlit as st

from lessons.catalog import Lesson
from record.budget import app_limits, fmt_bytes, kv_pool_bytes
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


# The largest integer a browser's number field holds exactly (Streamlit refuses wider bounds).
FIELD_INT_MAX = 2**53 - 1
# How the form writes null for a setting that may be null: sliding_window 0 = no window, seed 0 =
# greedy, -1 = null for the others.
NONE_AS = {
    "sliding_window": 0,
    "seed": 0,
    "prefix_cache_retention_interval": -1,
    "max_cache_hit_length": -1,
}
# The budget's limit on a setting (record/budget.py: Limits field), where it has one.
BUDGET_MAX = {
    "block_size": "max_block_size",
    "num_gpu_blocks": "max_num_gpu_blocks",
    "max_num_seqs": "max_requests",
    "max_num_batched_tokens": "max_num_batched_tokens",
}


def _ge(tp: Any) -> int | None:
    """The ``ge`` bound of an integer annotation of the schema (inside Optional / Union)."""
    for m in getattr(tp, "__metadata__", ()):
        for c in [m, *getattr(m, "metadata", ())]:
            if isinstance(getattr(c, "ge", None), int):
                return c.ge
    for arg in get_args(tp):
        found = _ge(arg)
        if found is not None:
            return found
    return None


def schema_min(name: str) -> int:
    """The smallest value the scenario schema (record/scenario.py) accepts for an int setting."""
    found = _ge(get_type_hints(EngineSettings, include_extras=True)[name])
    return 0 if found is None else found


def form_range(name: str) -> tuple[int, int]:
    """The form's range for an int setting: the schema's minimum (or the number that writes null)
    up to the budget's limit (record/budget.py), else the largest the field can hold."""
    lo = min(schema_min(name), NONE_AS.get(name, schema_min(name)))
    hi = getattr(app_limits(), BUDGET_MAX[name]) if name in BUDGET_MAX else FIELD_INT_MAX
    return lo, hi


def form_max(name: str) -> int:
    """The form's maximum for a setting: the server's budget limit for it (record/budget.py)."""
    return form_range(name)[1]


def pool_limits(eng: dict, config: Any, dtype: str) -> tuple[int, int]:
    """(most num_gpu_blocks at this block_size, largest block_size at this num_gpu_blocks) that the
    KV-cache budget (max_run_bytes) allows: the pool is num_gpu_blocks × block_size slots."""
    lim = app_limits()
    bs, nb = int(eng["block_size"]), int(eng["num_gpu_blocks"])
    blocks = min(lim.max_num_gpu_blocks, lim.max_run_bytes // kv_pool_bytes(config, bs, 1, dtype))
    size = min(lim.max_block_size, lim.max_run_bytes // kv_pool_bytes(config, 1, nb, dtype))
    return max(blocks, 2), max(size, 1)


def _int_field(col, name: str, value: int, hi: int | None, lang: str, **kw) -> None:
    """A number field for an int setting; a value it cannot show (one the schema accepts past the
    field's range) is shown as text, kept as given, with the reason under it."""
    lo, top = form_range(name)
    top = top if hi is None else hi
    if lo <= value <= top:
        col.number_input(name, min_value=lo, max_value=top, value=value, step=1, **kw)
        return
    col.text_input(name, value=str(value), disabled=True, **kw)
    col.caption(tr("playground.kept", lang, value=value, lo=lo, hi=top))


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
    config = getattr(ms.model, "config", None)
    dtype = state.run.scenario.dtype if state.run is not None else "float32"
    pool = pool_limits(eng, config, dtype) if config is not None else None
    with st.form(f"settings:{lesson.id}"):
        st.markdown(f"**{tr('settings', lang)}**")
        c = st.columns(4)
        for i, name in enumerate(
            ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")
        ):
            top = {"num_gpu_blocks": 0, "block_size": 1}.get(name)
            _int_field(
                c[i],
                name,
                int(eng[name]),
                None if pool is None or top is None else pool[top],
                lang,
                key=f"pg_{name}",
                help=hint(name),
            )
        if pool is not None:
            st.caption(
                tr(
                    "playground.pool_budget",
                    lang,
                    budget=fmt_bytes(app_limits().max_run_bytes),
                    block_size=int(eng["block_size"]),
                    blocks=pool[0],
                    num_gpu_blocks=int(eng["num_gpu_blocks"]),
                    size=pool[1],
                )
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
        window = eng["sliding_window"]
        _int_field(
            c[1],
            "sliding_window",
            NONE_AS["sliding_window"] if window is None else int(window),
            None,
            lang,
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
        _int_field(
            c[3],
            "seed",
            int(eng["seed"] or 0),
            None,
            lang,
            key="pg_seed",
            help=tr("playground.help.seed_engine", lang),
        )
        c = st.columns(4)
        retention = eng.get("prefix_cache_retention_interval", 0)
        _int_field(
            c[0],
            "prefix_cache_retention_interval",
            -1 if retention is None else int(retention),
            None,
            lang,
            key="pg_prefix_cache_retention_interval",
            help=hint("prefix_cache_retention_interval"),
        )
        c[1].number_input(
            "watermark",
            min_value=0.0,
            max_value=math.nextafter(1.0, 0.0),  # the schema's [0, 1)
            value=float(eng.get("watermark") or 0.0),
            step=0.05,
            key="pg_watermark",
            help=hint("watermark"),
        )
        cap = eng.get("max_cache_hit_length")
        _int_field(
            c[2],
            "max_cache_hit_length",
            -1 if cap is None else int(cap),
            None,
            lang,
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
    lim = app_limits()
    with st.form(f"addreq:{lesson.id}", clear_on_submit=False):
        st.markdown(f"**{tr('playground.add_title', lang)}**")
        c = st.columns([1, 4])
        c[0].text_input("id", value=_next_id(existing), key="pg_req_id")
        # no max_chars: the browser would drop a longer text without a word; on_add_request
        # refuses it with the limit's name instead
        c[1].text_input(
            tr("playground.prompt", lang),
            value="What is paged attention?",
            key="pg_req_text",
        )
        c[1].caption(
            tr("playground.prompt_limit", lang, chars=f"{lim.max_prompt_chars:,}")
            + " "
            + tr("playground.prompt_tokens", lang, tokens=f"{lim.max_prompt_tokens:,}")
        )
        c = st.columns(5)
        c[0].checkbox("chat", value=True, key="pg_req_chat")
        c[1].number_input(
            "max_tokens",
            1,
            lim.max_tokens,
            min(12, lim.max_tokens),
            key="pg_req_max",
            help=tr("playground.help.max_tokens", lang, max=f"{lim.max_tokens:,}"),
        )
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
            args=(state, lesson, ms, lang),
        )


def on_add_request(state: LessonState, lesson: Lesson, ms: ModelState, lang: str = "en") -> None:
    ss = st.session_state
    prompt, most = str(ss["pg_req_text"]), app_limits().max_prompt_chars
    if len(prompt) > most:  # refused here, with its limit; nothing is submitted
        state.error = tr(
            "playground.prompt_too_long", lang, length=f"{len(prompt):,}", chars=f"{most:,}"
        )
        return
    add_request(
        state,
        lesson,
        ms,
        {
            "id": str(ss["pg_req_id"]).strip(),
            "prompt": prompt,
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
