"""The home page: paged KV caching in a minute, one live picture, the lessons' cards (the pages of
the registry's Lessons section, each with its one-line summary)."""

from __future__ import annotations

import streamlit as st

from paged_kv_lab.app.lesson_page import current_lang, render_lesson
from paged_kv_lab.app.registry import LESSONS_SECTION, nav_title, sections
from paged_kv_lab.text.i18n import tr


def render_home() -> None:
    lang = current_lang()
    st.title(f"🧱 {tr('app_title', lang)}")
    st.header(tr("home_title", lang))
    st.markdown("\n\n".join(tr("home.minute", lang)))
    st.subheader(tr("home_live", lang))
    render_lesson("home", compact=True)
    st.subheader(tr("home_lessons", lang))
    cols = st.columns(2)
    (lessons,) = (s for s in sections() if s.id == LESSONS_SECTION)
    for i, page in enumerate(lessons.pages):
        with cols[i % 2].container(border=True):
            st.page_link(page.file, label=nav_title(page, lang), icon=page.icon)
            st.caption(tr(page.summary, lang))
