"""The playground's forms: every engine setting, and requests with free text."""

from __future__ import annotations

import copy
import functools
import math
import string
from typing import Any, get_args, get_type_hints

import streamlit as st

from paged_kv_lab.content.catalog import Lesson
from paged_kv_lab.run.budget import ENV, SETTING_LIMITS, app_limits, fmt_bytes, kv_pool_bytes
from paged_kv_lab.run.scenario import (
    ADMISSIONS,
    FREE_ORDERS,
    HASH_ALGOS,
    POLICIES,
    EngineSettings,
)
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.modelstate import ModelState
from paged_kv_lab.ui.state import SETTING_DEFAULTS, LessonState, rebuild

# the schema's choices (run/scenario.py, each kvcore's own list)
CHOICES = {
    "hash_algo": HASH_ALGOS,
    "policy": POLICIES,
    "free_order": FREE_ORDERS,
    "admission": ADMISSIONS,
}


# The largest integer a browser's number field holds exactly (Streamlit refuses wider bounds).
FIELD_INT_MAX = 2**53 - 1
# How the form writes null for a setting that may be null: sliding_window 0 = no window (the
# schema has no window of 0), -1 = null for the others (seed 0 is a seed: sampling, not greedy).
NONE_AS = {
    "sliding_window": 0,
    "seed": -1,
    "prefix_cache_retention_interval": -1,
    "max_cache_hit_length": -1,
    "max_num_inflight_kv_loads": 0,  # the schema has no cap of 0
}
# The budget's limit on a setting (run/budget.py: Limits field), where it has one; more
# sequences than the requests a run may have would never fill, so the form stops there too.
BUDGET_MAX = {
    **{path[1]: f for path, f in SETTING_LIMITS.items() if path[0] == "engine" and len(path) == 2},
    "max_num_seqs": "max_requests",
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


@functools.cache
def schema_min(name: str) -> int:
    """The smallest value the scenario schema (run/scenario.py) accepts for an int setting."""
    found = _ge(get_type_hints(EngineSettings, include_extras=True)[name])
    return 0 if found is None else found


def form_range(name: str) -> tuple[int, int]:
    """The form's range for an int setting: the schema's minimum (or the number that writes null)
    up to the budget's limit (run/budget.py), else the largest the field can hold."""
    lo = min(schema_min(name), NONE_AS.get(name, schema_min(name)))
    hi = getattr(app_limits(), BUDGET_MAX[name]) if name in BUDGET_MAX else FIELD_INT_MAX
    return lo, hi


def form_max(name: str) -> int:
    """The form's maximum for a setting: the server's budget limit for it (run/budget.py)."""
    return form_range(name)[1]


def pool_limits(eng: dict, config: Any, dtype: str) -> tuple[int, int]:
    """(most num_gpu_blocks at this block_size, largest block_size at this num_gpu_blocks) that the
    KV-cache budget (max_run_bytes) allows: the pool is num_gpu_blocks × block_size slots."""
    lim = app_limits()
    bs, nb = int(eng["block_size"]), int(eng["num_gpu_blocks"])
    blocks = min(lim.max_num_gpu_blocks, lim.max_run_bytes // kv_pool_bytes(config, bs, 1, dtype))
    size = min(lim.max_block_size, lim.max_run_bytes // kv_pool_bytes(config, 1, nb, dtype))
    return max(blocks, 2), max(size, 1)


def _int_field(
    col, name: str, value: int, hi: int | None, lang: str, lo: int | None = None, **kw
) -> None:
    """A number field for an int setting; a value it cannot show (one the schema accepts past the
    field's range) is shown as text, kept as given, with the reason under it. The range is
    ``form_range(name)`` unless ``lo`` and ``hi`` are given (a nested setting's)."""
    lo, top = (lo, hi) if lo is not None and hi is not None else form_range(name)
    top = top if hi is None else hi
    if lo <= value <= top:
        col.number_input(name, min_value=lo, max_value=top, value=value, step=1, **kw)
        return
    col.text_input(name, value=str(value), disabled=True, **kw)
    col.caption(tr("playground.kept", lang, value=value, lo=lo, hi=top))


def form_values(eng: dict) -> dict[str, Any]:
    """What each field of the settings form shows for the engine settings ``eng`` (null as its
    number). Apply keeps a setting whose field still shows this: only an edit changes it."""
    shown: dict[str, Any] = {
        name: int(eng[name])
        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")
    }
    shown.update({n: eng[n] if eng[n] in opts else opts[0] for n, opts in CHOICES.items()})
    shown["enable_prefix_caching"] = bool(eng["enable_prefix_caching"])
    for name, null in NONE_AS.items():
        shown[name] = null if eng.get(name) is None else int(eng[name])
    shown["watermark"] = float(eng.get("watermark") or 0.0)
    shown["hash_seed"] = eng.get("hash_seed") or ""
    # vLLM 0.34's settings (cache-aware admission, in-flight KV loads): vLLM's defaults
    shown["cache_aware_admission_window"] = int(eng.get("cache_aware_admission_window") or 0)
    threshold = eng.get("cache_aware_admission_threshold")
    shown["cache_aware_admission_threshold"] = 0.5 if threshold is None else float(threshold)
    return shown


def _next_id(existing: list[str]) -> str:
    for c in string.ascii_uppercase:
        if c not in existing:
            return c
    return f"R{len(existing)}"


def settings_form(state: LessonState, lesson: Lesson, ms: ModelState, lang: str) -> None:
    eng = {**SETTING_DEFAULTS, **state.base.get("engine", {})}
    shown = form_values(eng)

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
                shown[name],
                None if pool is None or top is None else pool[top],
                lang,
                key=f"pg_{name}",
                help=hint(name),
            )
        lim = app_limits()
        st.caption(
            tr(
                "playground.field_limits",
                lang,
                limits=", ".join(
                    f"{name} {getattr(lim, field):,} ({ENV[field]})"
                    for name, field in BUDGET_MAX.items()
                ),
            )
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
        # vLLM 0.34's extensible KV cache: a stated pool size turns it off (kvcore/config/vllm.py)
        st.caption(tr("playground.extensible_off", lang, num_gpu_blocks=int(eng["num_gpu_blocks"])))
        c = st.columns(5)
        for i, (name, opts) in enumerate(CHOICES.items()):
            c[i].selectbox(
                name,
                opts,
                index=opts.index(shown[name]),
                key=f"pg_{name}",
                help=hint(name),
            )
        c = st.columns(4)
        c[0].checkbox(
            "enable_prefix_caching",
            value=shown["enable_prefix_caching"],
            key="pg_enable_prefix_caching",
        )
        _int_field(
            c[1],
            "sliding_window",
            shown["sliding_window"],
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
            shown["seed"],
            None,
            lang,
            key="pg_seed",
            help=tr("playground.help.seed_engine", lang),
        )
        c = st.columns(4)
        _int_field(
            c[0],
            "prefix_cache_retention_interval",
            shown["prefix_cache_retention_interval"],
            None,
            lang,
            key="pg_prefix_cache_retention_interval",
            help=hint("prefix_cache_retention_interval"),
        )
        c[1].number_input(
            "watermark",
            min_value=0.0,
            max_value=math.nextafter(1.0, 0.0),  # the schema's [0, 1)
            value=shown["watermark"],
            step=0.05,
            key="pg_watermark",
            help=hint("watermark"),
        )
        _int_field(
            c[2],
            "max_cache_hit_length",
            shown["max_cache_hit_length"],
            None,
            lang,
            key="pg_max_cache_hit_length",
            help=hint("max_cache_hit_length"),
        )
        c[3].text_input(
            "hash_seed",
            # no max_chars: the browser would cut a longer seed from a file, and Apply would
            # write the cut one
            value=shown["hash_seed"],
            key="pg_hash_seed",
            help=hint("hash_seed"),
        )
        _vllm_034_fields(shown, lang, hint)
        _speculative_fields(eng.get("speculative"), lang)
        _cpu_offload_fields(eng.get("cpu_offload"), lang)
        st.form_submit_button(
            tr("playground.apply", lang), on_click=on_apply_settings, args=(state, lesson, ms)
        )


def _vllm_034_fields(shown: dict[str, Any], lang: str, hint) -> None:
    """The scheduler settings vLLM 0.34 added, under vLLM's names and with its defaults:
    cache-aware admission's window and threshold, and the cap on in-flight KV loads."""
    c = st.columns(3)
    _int_field(
        c[0],
        "cache_aware_admission_window",
        shown["cache_aware_admission_window"],
        None,
        lang,
        key="pg_cache_aware_admission_window",
        help=hint("cache_aware_admission_window"),
    )
    c[1].number_input(
        "cache_aware_admission_threshold",
        min_value=0.0,
        max_value=1.0,  # the schema's [0, 1], as vLLM's
        value=shown["cache_aware_admission_threshold"],
        step=0.05,
        key="pg_cache_aware_admission_threshold",
        help=hint("cache_aware_admission_threshold"),
    )
    _int_field(
        c[2],
        "max_num_inflight_kv_loads",
        shown["max_num_inflight_kv_loads"],
        None,
        lang,
        key="pg_max_num_inflight_kv_loads",
        help=hint("max_num_inflight_kv_loads"),
    )


SPEC_METHODS = ("off", "ngram", "draft_model", "eagle", "mtp")


def _speculative_fields(sp: dict | None, lang: str) -> None:
    """Speculative decoding: off, n-gram, the draft model (its k and its depth), or an EAGLE/MTP
    head (its k)."""
    sp = sp or {}
    c = st.columns(3)
    method = sp.get("method", "ngram") if sp else "off"
    c[0].selectbox(
        tr("playground.speculative", lang),
        SPEC_METHODS,
        index=SPEC_METHODS.index(method) if method in SPEC_METHODS else 0,
        format_func=lambda m: tr("playground.spec_off", lang) if m == "off" else m,
        key="pg_spec_method",
        help=tr("playground.help.speculative", lang),
    )
    # a scenario's value past these ranges is kept, with a note (never raised on: issue 26)
    _int_field(
        c[1],
        "num_speculative_tokens",
        int(sp.get("num_speculative_tokens") or 3),
        8,
        lang,
        lo=1,
        key="pg_num_speculative_tokens",
    )
    _int_field(
        c[2],
        "num_draft_layers",
        int(sp.get("num_draft_layers") or 0),
        256,
        lang,
        lo=0,
        key="pg_num_draft_layers",
        help=tr("playground.help.num_draft_layers", lang),
    )


def _speculative_value(ss, old: dict | None) -> dict | None:
    """engine.speculative from the form: the scenario's own dict where nothing was changed."""
    method = ss["pg_spec_method"]
    if method == "off":
        return None
    new = {
        **(old or {}),
        "method": method,
        "num_speculative_tokens": int(ss["pg_num_speculative_tokens"]),
    }
    layers = int(ss["pg_num_draft_layers"])
    new["num_draft_layers"] = layers or None
    if method in ("ngram", "eagle", "mtp"):  # unused: the scenario's own stays
        new["num_draft_layers"] = (old or {}).get("num_draft_layers")
    if method in ("eagle", "mtp"):
        # the lab models EAGLE on plain block hashes only (the help says so)
        new.setdefault("disable_lookahead_block_hashes", True)
    return new


def _cpu_offload_fields(tier: dict | None, lang: str) -> None:
    """The second tier (engine.cpu_offload): its CPU pool's blocks (0: off) and lazy mode."""
    tier = tier or {}
    c = st.columns(3)
    _int_field(
        c[0],
        "cpu_offload.num_cpu_blocks",
        int(tier.get("num_cpu_blocks") or 0),
        app_limits().max_num_gpu_blocks,
        lang,
        lo=0,
        key="pg_num_cpu_blocks",
        help=tr("playground.help.cpu_offload", lang),
    )
    c[1].checkbox(
        "cpu_offload.lazy_offload", value=bool(tier.get("lazy_offload")), key="pg_lazy_offload"
    )


def _cpu_offload_value(ss, old: dict | None) -> dict | None:
    """engine.cpu_offload from the form: None when it has no blocks (a pool of 1 block, its null
    block alone, is refused by the scenario's check, by name)."""
    n = int(ss["pg_num_cpu_blocks"])
    if n == 0:
        return None
    return {**(old or {}), "num_cpu_blocks": n, "lazy_offload": bool(ss["pg_lazy_offload"])}


def on_apply_settings(state: LessonState, lesson: Lesson, ms: ModelState) -> None:
    ss = st.session_state
    vals = {
        name: int(ss[f"pg_{name}"])
        for name in ("block_size", "num_gpu_blocks", "max_num_seqs", "max_num_batched_tokens")
    }
    vals.update({name: ss[f"pg_{name}"] for name in CHOICES})
    vals["enable_prefix_caching"] = bool(ss["pg_enable_prefix_caching"])
    vals["sliding_window"] = int(ss["pg_sliding_window"]) or None
    seed = int(ss["pg_seed"])
    vals["seed"] = None if seed < 0 else seed
    retention = int(ss["pg_prefix_cache_retention_interval"])
    vals["prefix_cache_retention_interval"] = None if retention < 0 else retention
    vals["watermark"] = float(ss["pg_watermark"])
    cap = int(ss["pg_max_cache_hit_length"])
    vals["max_cache_hit_length"] = None if cap < 0 else cap
    vals["hash_seed"] = str(ss["pg_hash_seed"]) or None
    vals["cache_aware_admission_window"] = int(ss["pg_cache_aware_admission_window"])
    vals["cache_aware_admission_threshold"] = float(ss["pg_cache_aware_admission_threshold"])
    vals["max_num_inflight_kv_loads"] = int(ss["pg_max_num_inflight_kv_loads"]) or None
    eng = {**SETTING_DEFAULTS, **state.base.get("engine", {})}
    shown = form_values(eng)
    for name in vals:  # a field left as drawn keeps the scenario's own value ("" and null differ)
        if str(ss[f"pg_{name}"]) == str(shown[name]):
            vals[name] = eng[name]
    base = copy.deepcopy(state.base)
    new_eng = {
        k: v
        for k, v in {**base.get("engine", {}), **vals}.items()
        if k in EngineSettings.__dataclass_fields__
    }
    new_eng.pop("layer_types", None)
    new_eng["speculative"] = _speculative_value(ss, base.get("engine", {}).get("speculative"))
    new_eng["cpu_offload"] = _cpu_offload_value(ss, base.get("engine", {}).get("cpu_offload"))
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
        count = sum(int(r.get("n", 1)) for r in state.base.get("requests", []))
        st.caption(
            tr(
                "playground.requests_limit",
                lang,
                count=count,
                most=f"{lim.max_requests:,}",
                tokens=f"{lim.max_tokens:,}",
            )
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
