"""Paged KV Lab: step a real LLM through vLLM v1's paged KV-cache management, live.

Run: python -m streamlit run app.py
"""
import streamlit as st

st.set_page_config(page_title="Paged KV Lab", page_icon="🧱", layout="wide")

from lesson.home_page import render_home  # noqa: E402  (set_page_config must come first)
from lesson.i18n import LANG_NAMES, LANGS, tr  # noqa: E402
from lesson.lessons import LESSONS, PAGE_FILES, url_path  # noqa: E402
from lesson.modelstate import (DEVICES, MODELS, default_device, default_model, get_model,  # noqa: E402
                               model_summary)
from lesson.state import init_globals_from_url  # noqa: E402

init_globals_from_url()
st.session_state.setdefault("lang", "en")
st.session_state.setdefault("model_name", default_model())
st.session_state.setdefault("device", default_device())

with st.sidebar:
    st.selectbox("Language / 语言", LANGS, key="lang", format_func=LANG_NAMES.get)
    lang = st.session_state["lang"]
    st.selectbox(tr("model", lang), MODELS, key="model_name", format_func=lambda m: tr(f"model_{m}", lang))
    st.selectbox(tr("device", lang), DEVICES, key="device", format_func=lambda d: tr(f"device_{d}", lang))
    name, device = st.session_state["model_name"], st.session_state["device"]
    st.markdown(f"**{tr('model_state', lang)}**")
    ms = get_model(name, device, status_text=tr("model_loading", lang, model=name, device=device))
    if ms.model is None:
        st.error(tr("model_failed", lang, model=name, device=device, error=ms.error))
        st.caption(tr("model_hint", lang))
    else:
        info = model_summary(ms.model)
        st.success(tr("model_ready", lang, model=name, device=info["device"]))
        st.caption(tr("model_info", lang, **info) + " · " + tr("model_loaded", lang, model=name,
                                                               device=info["device"], secs=ms.seconds))
st.session_state["_model_state"] = ms
st.session_state["_prefs"] = {"lang": lang, "model_name": name, "device": device}

home = st.Page(render_home, title=tr("nav_home", lang), icon="🏠", url_path="home", default=True)
lesson_pages = [
    st.Page(PAGE_FILES[l.id], title=f"{l.number}. {l.title[lang]}", icon=l.icon, url_path=url_path(l.id))
    for l in LESSONS
]
st.navigation({tr("nav_home", lang): [home], tr("nav_lessons", lang): lesson_pages}).run()
