"""Per-session lesson state (in st.session_state) and its mirror in the URL.

Each browser session keeps one LessonState per page: the scenario it runs (the
lesson's, an uploaded one, or the playground's edits), the settings switched on
that page, and a Timeline -- its own cursor over the shared recorded run of that
scenario (runstore/store.py). Every scenario is checked against the resource budget
(run/budget.py) before the store builds anything for it; links and files are
capped in size before they are decoded.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from paged_kv_lab.content.catalog import OPTION_EFFECTS, Lesson
from paged_kv_lab.run.budget import ENV, BudgetError, app_limits, check_size, fmt_bytes
from paged_kv_lab.run.scenario import (
    EngineSettings,
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_to_dict,
)
from paged_kv_lab.store import recorded_run
from paged_kv_lab.store.run_store import default_store
from paged_kv_lab.store.timeline import Timeline
from paged_kv_lab.text.i18n import Text, languages, said, tr
from paged_kv_lab.ui.class_panel import teach_param
from paged_kv_lab.ui.modelstate import DEVICES, MODELS, ModelState

SETTING_DEFAULTS = dataclasses.asdict(EngineSettings())
URL_SETTINGS = tuple(k for k in SETTING_DEFAULTS if k != "layer_types") + tuple(OPTION_EFFECTS)


@dataclass(kw_only=True)
class PageState:
    """What the shared controls (ui/widgets.py) act on: a Timeline and the page's modes."""

    run: Timeline | None = None
    error: str | None = None  # last engine / scenario / file error, shown once
    notice: str | None = None
    playing: bool = False
    quiz: Any = None  # a pending quiz.Prediction
    quiz_choice: int | None = None
    upload_id: str | None = None  # the last uploaded file handled (a rerun must not load it again)
    # why the uploaded file ``upload_id`` was refused: shown beside the uploader while that file is
    # in it (not once, as ``error``: a run that a newer rerun interrupts would lose a one-shot
    # message, and the file is not handled a second time)
    upload_problem: str | None = None
    run_error_seen: str | None = None  # the run's stop reason, once shown


@dataclass
class LessonState(PageState):
    lesson_id: str
    base: dict  # scenario in the engine's file format (before overrides)
    overrides: dict = field(default_factory=dict)
    model_key: tuple = ()


def build_scenario(lesson: Lesson, base: dict, overrides: dict, ms: ModelState) -> Scenario:
    """Apply overrides (and the 'layers' pattern) to ``base`` and validate it with the engine's
    loader."""
    d = copy.deepcopy(base)
    tmp = dataclasses.replace(lesson, scenario=d)
    num_layers = int(ms.model.config.num_hidden_layers) if ms.model is not None else None
    d = tmp.scenario_dict(num_layers, overrides)
    d["model"], d["device"] = ms.name, ms.device
    return load_scenario(d)


def make_factory(ms: ModelState):
    def factory(scenario: Scenario):
        import paged_kv_lab.fleet.model_fleet  # noqa: F401  (registers the fleet kind of run)
        from paged_kv_lab.disagg.pd import engine_for

        return engine_for(scenario, model=ms.model)

    return factory


def locked(fn, *args, **kwargs):
    """Call a Timeline move. Kept for callers: the run store's worker takes the engine lock for
    one step at a time, and a session never holds it (a session waiting under it would stall
    the very worker it waits for)."""
    return fn(*args, **kwargs)


def model_key(ms: ModelState) -> tuple[str, str, str]:
    return recorded_run.model_key(ms.name, ms.model, ms.device)


def open_run(scenario: Scenario, ms: ModelState, step: int = 0) -> Timeline:
    """A cursor at ``step`` over the shared run of ``scenario`` on the loaded model.
    Raises BudgetError (over a limit) or ValueError (a prompt that never fits)."""
    run = default_store().run(
        scenario, make_factory(ms), model_key=model_key(ms), model=ms.model, limits=app_limits()
    )
    return Timeline(
        run, cursor=min(int(step), run.recorded() if run.done else 1 << 30), scenario=scenario
    )


def new_run(state: LessonState, lesson: Lesson, ms: ModelState, step: int = 0) -> None:
    scenario = build_scenario(lesson, state.base, state.overrides, ms)
    state.run = open_run(scenario, ms, step)
    state.model_key = (ms.name, ms.device)


def run_error(state: PageState) -> None:
    """Show once why the run stopped early (a failed step, the step cap, a full store)."""
    run = state.run
    capped = getattr(run.run, "capped_at", None) if run is not None else None
    if capped is not None:  # said under the player, in the page's language (step_cap_note)
        return
    if run is not None and run.error and run.error != state.run_error_seen and run.finished:
        state.run_error_seen = run.error
        said = getattr(run.run, "error_key", None)
        if said is not None:
            lang = st.session_state.get("_prefs", {}).get("lang", "en")
            kind, fields = said
            said = tr("run_store_full", lang, **fields) if kind == "store_full" else None
            said = said or tr("run_dropped", lang)
        state.error = state.error or said or run.error


def get_state(lesson: Lesson, ms: ModelState) -> LessonState:
    key = f"lesson:{lesson.id}"
    state: LessonState | None = st.session_state.get(key)
    step = 0
    if state is None:
        state = LessonState(lesson.id, copy.deepcopy(lesson.scenario))
        step = apply_url(state, lesson)
        st.session_state[key] = state
    if ms.model is None:
        return state
    if state.run is None or state.model_key != (ms.name, ms.device):
        step = step or (state.run.cursor if state.run is not None else 0)
        try:
            new_run(state, lesson, ms, step)
        except Exception as e:  # over the budget, invalid, or refused by the engine: said, kept
            state.error = refusal(e)
            if state.base != lesson.scenario or state.overrides:
                state.base, state.overrides = copy.deepcopy(lesson.scenario), {}
                new_run(state, lesson, ms, 0)
    run_error(state)
    return state


def refusal(e: Exception, lang: str | None = None) -> str:
    """Why a scenario did not open, in ``lang`` (default: the sidebar's): the schema's problems
    (one a line), the budget's sentence, or the engine's error with its type (e.g. a prompt that
    never fits the pool)."""
    lang = pref("lang", "en") if lang is None else lang
    if isinstance(e, ScenarioError):
        return "\n".join(e.lines(lang))
    if isinstance(e, BudgetError):
        return said(e, lang)
    return f"{type(e).__name__}: {said(e, lang)}"


def rebuild(
    state: LessonState,
    lesson: Lesson,
    ms: ModelState,
    base: dict | None = None,
    overrides: dict | None = None,
    keep_step: bool = True,
) -> str | None:
    """Switch to a new base/overrides; on any error nothing changes and the message comes back."""
    new_base = state.base if base is None else base
    new_over = state.overrides if overrides is None else overrides
    try:
        scenario = build_scenario(lesson, new_base, new_over, ms)
        step = state.run.cursor if (keep_step and state.run is not None) else 0
        # the engine's own checks refuse a prompt that never fits
        run = open_run(scenario, ms, step)
    except Exception as e:  # invalid, over the budget, or refused by the engine's own checks
        return refusal(e)
    state.base, state.overrides, state.run = copy.deepcopy(new_base), dict(new_over), run
    state.quiz, state.playing = None, False
    for k in [
        k for k in st.session_state if str(k).startswith("pg_") and not str(k).startswith("pg_req")
    ]:
        del st.session_state[k]  # the playground form shows the new settings
    return None


def parse_scenario_text(text: str | bytes, lang: str = "en") -> tuple[dict | None, list[str]]:
    """(scenario dict, []) or (None, problems in ``lang``). The dict is the validated file,
    normalised. Text over the file-size limit is refused before it is parsed; bytes must be
    UTF-8."""
    size = len(text.encode() if isinstance(text, str) else text)
    try:
        check_size(size, Text("refusal.what.scenario"), app_limits())
    except BudgetError as e:
        return None, [said(e, lang)]
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            at = {"at": e.start, "byte": f"{text[e.start]:02x}"}
            return None, [tr("refusal.scenario_not_utf8", lang, **at)]
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        where = {"line": e.lineno, "column": e.colno, "error": e.msg}
        return None, [tr("refusal.json_syntax", lang, **where)]
    try:
        return scenario_to_dict(load_scenario(raw)), []
    except ScenarioError as e:
        return None, e.lines(lang)


# -- URL ---------------------------------------------------------------------------
def _encode_base(d: dict) -> str:
    raw = json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def _decode_base(s: str) -> dict:
    """The packed scenario of a link, capped before decoding (its length) and while it is
    decompressed (never more than the file limit is inflated)."""
    limits = app_limits()
    check_size(len(s), Text("refusal.what.link"), limits, "max_link_chars")
    pad = "=" * (-len(s) % 4)
    inflate = zlib.decompressobj()
    raw = inflate.decompress(base64.urlsafe_b64decode(s + pad), limits.max_file_bytes + 1)
    if len(raw) > limits.max_file_bytes or inflate.unconsumed_tail:
        allowed, env = fmt_bytes(limits.max_file_bytes), ENV["max_file_bytes"]
        fields = {"allowed": allowed, "where": limits.where, "env": env}
        text = Text("refusal.link_inflated", fields)
        raise BudgetError(text, env, len(raw), limits.max_file_bytes)
    return json.loads(raw.decode())


def _parse_value(key: str, v: str) -> Any:
    default = SETTING_DEFAULTS.get(key)
    if v in ("null", "none", "None"):
        return None
    if isinstance(default, bool):
        return v.lower() in ("1", "true", "yes", "on")
    if isinstance(default, int) or key in (
        "sliding_window",
        "seed",
        "max_model_len",
        "max_cache_hit_length",
        "max_num_inflight_kv_loads",
    ):
        return int(v)
    if isinstance(default, float):
        return float(v)
    return v


def apply_url(state: LessonState, lesson: Lesson) -> int:
    """Read lesson settings from the URL when it names this lesson; returns the step to show."""
    qp = st.query_params
    if qp.get("lesson") != lesson.id:
        return 0
    lang = pref("lang", "en")
    problems: list[str] = []
    if "scn" in qp:
        try:
            d, problems = parse_scenario_text(json.dumps(_decode_base(qp["scn"])), lang)
            if d is not None:
                state.base = d
        except BudgetError as e:
            problems = [said(e, lang)]
        except Exception as e:  # not base64, not zlib, not UTF-8 JSON: a cut or edited link
            problems = [tr("url_unreadable", lang, error=f"{type(e).__name__}: {e}")]
    for k in URL_SETTINGS:
        if k in qp:
            try:
                state.overrides[k] = _parse_value(k, qp[k])
            except ValueError:
                problems.append(f"{k}={qp[k][:40]!r}: " + tr("url_not_a_number", lang))
    if problems:
        state.error = tr("url_bad", lang) + "\n" + "\n".join(f"- {p}" for p in problems)
    try:
        return min(max(0, int(qp.get("step", 0))), app_limits().max_run_steps)
    except ValueError:
        return 0


def url_params(state: LessonState, lesson: Lesson, lang: str, ms: ModelState) -> dict[str, str]:
    out = {
        "lesson": lesson.id,
        "step": str(state.run.cursor if state.run else 0),
        "lang": lang,
        "model": ms.name,
        "device": ms.device,
    }
    for k, v in state.overrides.items():
        out[k] = "null" if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
    if state.base != lesson.scenario:
        packed = _encode_base(state.base)
        if len(packed) <= app_limits().max_link_chars:  # a longer one would be refused on opening
            out["scn"] = packed
    return out


def write_url(state: LessonState, lesson: Lesson, lang: str, ms: ModelState) -> None:
    """Keep the URL in step with the page; a scenario too large for a link is left out of it, and
    the page says so (the link cap acts here, where the link is made)."""
    params = url_params(state, lesson, lang, ms)
    if "scn" not in params and state.base != lesson.scenario:
        most = app_limits().max_link_chars
        chars = len(_encode_base(state.base))
        st.caption(tr("url_too_long", lang, chars=f"{chars:,}", most=f"{most:,}"))
    params.update(teach_param())  # the teacher's own URL only: never in a link shared from here
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)


def init_globals_from_url() -> None:
    """Language, model and device from the URL, once per session, before their widgets exist."""
    if st.session_state.get("_url_read"):
        return
    st.session_state["_url_read"] = True
    qp = st.query_params
    prefs = st.session_state.setdefault("_prefs", {})
    for param, key, allowed in (
        ("lang", "lang", tuple(languages())),
        ("model", "model_name", MODELS),
        ("device", "device", DEVICES),
    ):
        if qp.get(param) in allowed:
            st.session_state[key] = prefs[key] = qp[param]


def pref(key: str, default: str) -> str:
    """A sidebar choice. ``_prefs`` mirrors the sidebar widgets, so code that draws a page
    without the sidebar in the same run (a test that sets the session's choices) still sees
    them."""
    v = st.session_state.get(key)
    return v if v is not None else st.session_state.get("_prefs", {}).get(key, default)
