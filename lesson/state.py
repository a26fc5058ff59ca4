"""Per-session lesson state (in st.session_state) and its mirror in the URL.

Each browser session keeps one LessonState per page: the scenario it runs (the
lesson's, an uploaded one, or the playground's edits), the settings switched on
that page, and the LabRun holding the engine and its recorded steps.
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

from kvcore.scenario import EngineSettings, Scenario, ScenarioError, load_scenario, scenario_to_dict

from .catalog import Lesson
from .modelstate import DEVICES, MODELS, ModelState, engine_lock
from .runtime import LabRun, Timeline, check_requests

SETTING_DEFAULTS = dataclasses.asdict(EngineSettings())
URL_SETTINGS = tuple(k for k in SETTING_DEFAULTS if k != "layer_types") + ("layers",)


@dataclass(kw_only=True)
class PageState:
    """What the shared controls (lesson/widgets.py) act on: a Timeline and the page's modes."""
    run: Timeline | None = None
    error: str | None = None           # last engine / scenario / file error, shown once
    notice: str | None = None
    playing: bool = False
    quiz: Any = None                   # a pending quiz.Prediction
    quiz_choice: int | None = None
    upload_id: str | None = None       # the last uploaded file handled (a rerun must not load it again)


@dataclass
class LessonState(PageState):
    lesson_id: str
    base: dict                         # scenario in the engine's file format (before overrides)
    overrides: dict = field(default_factory=dict)
    model_key: tuple = ()


def build_scenario(lesson: Lesson, base: dict, overrides: dict, ms: ModelState) -> Scenario:
    """Apply overrides (and the 'layers' pattern) to ``base`` and validate it with the engine's loader."""
    d = copy.deepcopy(base)
    tmp = dataclasses.replace(lesson, scenario=d)
    num_layers = int(ms.model.config.num_hidden_layers) if ms.model is not None else None
    d = tmp.scenario_dict(num_layers, overrides)
    d["model"], d["device"] = ms.name, ms.device
    return load_scenario(d)


def make_factory(ms: ModelState):
    def factory(scenario: Scenario):
        from kvcore.engine import Engine
        return Engine(scenario, model=ms.model)
    return factory


def locked(fn, *args, **kwargs):
    """Run an engine call under the process-wide lock."""
    with engine_lock():
        return fn(*args, **kwargs)


def new_run(state: LessonState, lesson: Lesson, ms: ModelState, step: int = 0) -> None:
    scenario = build_scenario(lesson, state.base, state.overrides, ms)
    run = locked(LabRun, scenario, make_factory(ms))
    if step:
        locked(run.goto, step)
    state.run = run
    state.model_key = (ms.name, ms.device)


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
        except (ScenarioError, ValueError) as e:
            state.error = str(e)
            if state.base != lesson.scenario or state.overrides:
                state.base, state.overrides = copy.deepcopy(lesson.scenario), {}
                new_run(state, lesson, ms, 0)
    return state


def rebuild(state: LessonState, lesson: Lesson, ms: ModelState, base: dict | None = None,
            overrides: dict | None = None, keep_step: bool = True) -> str | None:
    """Switch to a new base/overrides; on any error nothing changes and the message comes back."""
    new_base = state.base if base is None else base
    new_over = state.overrides if overrides is None else overrides
    try:
        scenario = build_scenario(lesson, new_base, new_over, ms)
        step = state.run.cursor if (keep_step and state.run is not None) else 0
        locked(check_requests, scenario, make_factory(ms))
        run = locked(LabRun, scenario, make_factory(ms))
        if step:
            locked(run.goto, step)
    except ScenarioError as e:
        return "\n".join(e.problems)
    except Exception as e:  # the engine refused the scenario (e.g. a prompt that never fits)
        return f"{type(e).__name__}: {e}"
    state.base, state.overrides, state.run = copy.deepcopy(new_base), dict(new_over), run
    state.quiz, state.playing = None, False
    for k in [k for k in st.session_state if str(k).startswith("pg_") and not str(k).startswith("pg_req")]:
        del st.session_state[k]  # the playground form shows the new settings
    return None


def parse_scenario_text(text: str | bytes) -> tuple[dict | None, list[str]]:
    """(scenario dict, []) or (None, problems). The dict is the validated file, normalised."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        return None, [f"json: line {e.lineno} column {e.colno}: {e.msg}"]
    try:
        return scenario_to_dict(load_scenario(raw)), []
    except ScenarioError as e:
        return None, list(e.problems)


# -- URL ---------------------------------------------------------------------------
def _encode_base(d: dict) -> str:
    raw = json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")


def _decode_base(s: str) -> dict:
    pad = "=" * (-len(s) % 4)
    return json.loads(zlib.decompress(base64.urlsafe_b64decode(s + pad)).decode())


def _parse_value(key: str, v: str) -> Any:
    default = SETTING_DEFAULTS.get(key)
    if v in ("null", "none", "None"):
        return None
    if isinstance(default, bool):
        return v.lower() in ("1", "true", "yes", "on")
    if isinstance(default, int) or key in ("sliding_window", "seed", "max_model_len"):
        return int(v)
    return v


def apply_url(state: LessonState, lesson: Lesson) -> int:
    """Read lesson settings from the URL when it names this lesson; returns the step to show."""
    qp = st.query_params
    if qp.get("lesson") != lesson.id:
        return 0
    if "scn" in qp:
        try:
            d, problems = parse_scenario_text(json.dumps(_decode_base(qp["scn"])))
            if d is not None:
                state.base = d
        except Exception:
            state.notice = "url: the scenario in the link could not be read"
    for k in URL_SETTINGS:
        if k in qp:
            try:
                state.overrides[k] = _parse_value(k, qp[k])
            except ValueError:
                pass
    try:
        return max(0, int(qp.get("step", 0)))
    except ValueError:
        return 0


def url_params(state: LessonState, lesson: Lesson, lang: str, ms: ModelState) -> dict[str, str]:
    out = {"lesson": lesson.id, "step": str(state.run.cursor if state.run else 0), "lang": lang,
           "model": ms.name, "device": ms.device}
    for k, v in state.overrides.items():
        out[k] = "null" if v is None else (str(v).lower() if isinstance(v, bool) else str(v))
    if state.base != lesson.scenario:
        out["scn"] = _encode_base(state.base)
    return out


def write_url(state: LessonState, lesson: Lesson, lang: str, ms: ModelState) -> None:
    params = url_params(state, lesson, lang, ms)
    if dict(st.query_params) != params:
        st.query_params.from_dict(params)


def init_globals_from_url() -> None:
    """Language, model and device from the URL, once per session, before their widgets exist."""
    if st.session_state.get("_url_read"):
        return
    st.session_state["_url_read"] = True
    qp = st.query_params
    prefs = st.session_state.setdefault("_prefs", {})
    for param, key, allowed in (("lang", "lang", ("en", "zh")), ("model", "model_name", MODELS),
                                ("device", "device", DEVICES)):
        if qp.get(param) in allowed:
            st.session_state[key] = prefs[key] = qp[param]


def pref(key: str, default: str) -> str:
    """A sidebar choice. ``_prefs`` mirrors the sidebar widgets so a page run without app.py
    (AppTest.switch_page runs only the page file) still sees them."""
    v = st.session_state.get(key)
    return v if v is not None else st.session_state.get("_prefs", {}).get(key, default)
