"""The app's entry: page config, sidebar (language, model, device, load state) and navigation.

app.py (the root of a clone) and streamlit_app.py (the installed package) call ``main()``. The
pages are the page registry's (content/registry.py: its sections, order, URL paths, titles and
icons, in the sidebar's language), each an ``st.Page`` over a function: a page that plays a
lesson draws it with ``render_lesson(<its lesson>)``, any other with the function ``RENDERERS``
names for its id (imported when the page first runs). There is no page file: Streamlit routes
``/<slug>`` to the registry's page by its URL path, a first visit on a fresh server included.
``streamlit_page`` gives the same page for ``st.page_link`` and ``st.switch_page``.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Callable

import streamlit as st

from paged_kv_lab.content.registry import Page, nav_title, page, sections
from paged_kv_lab.store.server_cache import VISITORS
from paged_kv_lab.text.i18n import languages, tr
from paged_kv_lab.ui.lesson_page import render_lesson
from paged_kv_lab.ui.modelstate import (
    DEVICES,
    MODELS,
    default_device,
    default_model,
    get_model,
    model_summary,
)
from paged_kv_lab.ui.state import init_globals_from_url
from paged_kv_lab.ui.warm_up import start_warm_up, warm_up_line

PAGE_DRAWN = "_page_drawn"  # session state: the URL path of the page this session drew last

# The pages that are drawn by a function of their own, not by the lesson page: registry page id ->
# (module of paged_kv_lab.ui, function). The one map from the registry's ids to code; a page that
# plays a lesson and is not listed here needs nothing: adding a lesson adds no line here.
RENDERERS: dict[str, tuple[str, str]] = {
    "home": ("home_page", "render_home"),
    "casebook": ("casebook_page", "render_casebook"),
    "blocksize": ("topic_pages", "render_block_size"),
    "collisions": ("topic_pages", "render_collisions"),
    "hitttft": ("topic_pages", "render_ttft"),
    "designs": ("designs_page", "render_designs_page"),
    "hashkeys": ("topic_pages", "render_hash_keys"),
    "trace": ("trace_page", "render_trace_page"),
    "workloads": ("workloads_page", "render_workloads_page"),
    "live": ("live_page", "render_live_page"),
    "join": ("class_panel", "render_join_page"),
}


def _copy_choice(widget_key: str, key: str) -> None:
    st.session_state[key] = st.session_state[widget_key]


def _choice(label: str, options, key: str, format_func) -> None:
    """A sidebar selectbox whose value lives in the plain session key ``key``.

    The widget has its own key and is handed the value before every run, so the choice is the
    session's, whatever page drew the widget last (a widget keyed by the value itself once came
    back at its first option after a page switch: the sidebar fell back to smollm2 / auto)."""
    widget_key = f"_sidebar_{key}"
    st.session_state[widget_key] = st.session_state[key]
    st.selectbox(
        label,
        options,
        key=widget_key,
        format_func=format_func,
        on_change=_copy_choice,
        args=(widget_key, key),
    )


def sidebar() -> str:
    init_globals_from_url()
    st.session_state.setdefault("lang", "en")
    st.session_state.setdefault("model_name", default_model())
    st.session_state.setdefault("device", default_device())
    with st.sidebar:
        names = languages()  # read at run time: a language folder added later is offered too
        _choice(tr("language"), list(names), "lang", names.get)
        lang = st.session_state["lang"]
        _choice(tr("model", lang), MODELS, "model_name", lambda m: tr(f"model_{m}", lang))
        _choice(tr("device", lang), DEVICES, "device", lambda d: tr(f"device_{d}", lang))
        name, device = st.session_state["model_name"], st.session_state["device"]
        st.markdown(f"**{tr('model_state', lang)}**")
        ms = get_model(
            name, device, status_text=tr("model_loading", lang, model=name, device=device)
        )
        if ms.model is None:
            st.error(tr("model_failed", lang, model=name, device=device, error=ms.error))
            st.caption(tr("model_hint", lang))
        else:
            info = model_summary(ms.model)
            st.success(tr("model_ready", lang, model=name, device=info["device"]))
            st.caption(
                tr("model_info", lang, **info)
                + " · "
                + tr("model_loaded", lang, model=name, device=info["device"], secs=ms.seconds)
            )
        start_warm_up(ms)
        warm_up_line(ms, lang)
    st.session_state["_model_state"] = ms
    st.session_state["_prefs"] = {"lang": lang, "model_name": name, "device": device}
    return lang


def renderer(p: Page) -> Callable[[], None]:
    """The function that draws page ``p``: its own (``RENDERERS``), else its lesson's page."""
    if p.id in RENDERERS:
        module, name = RENDERERS[p.id]

        def render() -> None:
            getattr(importlib.import_module(f"paged_kv_lab.ui.{module}"), name)()

    elif p.lesson is not None:
        lesson_id = p.lesson

        def render() -> None:
            render_lesson(lesson_id)

    else:
        raise KeyError(f"page {p.id!r} plays no lesson and ui/entry.py's RENDERERS lacks it")
    render.__name__ = f"page_{p.id}"
    return render


def streamlit_page(p: Page | str, lang: str) -> st.Page:
    """Page ``p`` (a registry page or its id) as Streamlit's page: what st.navigation lists, and
    what st.page_link and st.switch_page take (they find it by its URL path)."""
    p = page(p) if isinstance(p, str) else p
    return st.Page(
        renderer(p),
        title=nav_title(p, lang),
        icon=p.icon,
        url_path=p.url_path,
        default=p.default,
    )


def main() -> None:
    """One script run. A new session's first, and a run that draws another page than the
    session's last, run inside ``VISITORS.drawing()``: the work done ahead of visitors (the
    warm-up, steps computed ahead) waits meanwhile (store/server_cache.py). A rerun of the same
    page (a widget, a fragment) does not: a page polling its run must not hold that run back."""
    first = PAGE_DRAWN not in st.session_state
    with VISITORS.drawing() if first else contextlib.nullcontext():
        st.set_page_config(page_title="Paged KV Lab", page_icon="🧱", layout="wide")
        lang = sidebar()
        shown = st.navigation(
            {
                tr(section.title, lang): [streamlit_page(p, lang) for p in section.pages]
                for section in sections()
            },
            # every page listed: collapsed, Streamlit shows ten and hides the rest behind a button
            expanded=True,
        )
        other = st.session_state.get(PAGE_DRAWN) != shown.url_path
        st.session_state[PAGE_DRAWN] = shown.url_path
        with VISITORS.drawing() if other else contextlib.nullcontext():
            shown.run()
