"""The app's entry: page config, sidebar (language, model, device, load state) and navigation.

app.py (the root of a clone) and streamlit_app.py (the installed package) call ``main()``; the
navigation is the page registry's (content/registry.py: its sections, titles and icons, in the
sidebar's language). Each file in pages/ calls
``lesson_page(id)`` (a tool page: ``run_page(render)``): inside the entry's navigation it draws
the page; run on its own it runs the entry first, whose navigation then runs the page. A page
file can run on its own because Streamlit still treats pages/ as a multipage folder until the
first ``st.navigation`` call of the process (so a deep link opened first on a fresh server lands
there), and because AppTest.switch_page runs page files alone.
"""

from __future__ import annotations

import threading
from typing import Callable

import streamlit as st

from paged_kv_lab.content.registry import Page, nav_title, page_script, sections
from paged_kv_lab.text.i18n import languages, tr
from paged_kv_lab.ui.home_page import render_home
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

_inside = threading.local()  # script runs are per-session threads


def _copy_choice(widget_key: str, key: str) -> None:
    st.session_state[key] = st.session_state[widget_key]


def _choice(label: str, options, key: str, format_func) -> None:
    """A sidebar selectbox whose value lives in the plain session key ``key``.

    The widget has its own key and is handed the value before every run. Streamlit ties a
    widget's value to the script that drew it: the first run of a deep-linked page file and
    the entry's navigation are different scripts, and a widget keyed by the value itself came
    back there at its first option (the sidebar fell back to smollm2 / auto)."""
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


def st_page(page: Page, lang: str) -> st.Page:
    if page.file is None:  # the default page
        return st.Page(render_home, title=tr(page.title, lang), icon=page.icon, default=True)
    return st.Page(
        page_script(page), title=nav_title(page, lang), icon=page.icon, url_path=page.url_path
    )


def main() -> None:
    st.set_page_config(page_title="Paged KV Lab", page_icon="🧱", layout="wide")
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        lang = sidebar()
        st.navigation(
            {
                tr(section.title, lang): [st_page(p, lang) for p in section.pages]
                for section in sections()
            },
            # every page listed: collapsed, Streamlit shows ten and hides the rest behind a button
            expanded=True,
        ).run()
    finally:
        _inside.depth -= 1


def run_page(render: Callable[[], None]) -> None:
    if getattr(_inside, "depth", 0) > 0:
        render()
    else:
        main()


def lesson_page(lesson_id: str) -> None:
    run_page(lambda: render_lesson(lesson_id))
