"""The home page: paged KV caching in a minute, one live picture, the lessons' cards (the pages of
the registry's Lessons section, each with its one-line summary)."""

from __future__ import annotations

import streamlit as st

from paged_kv_lab.content.registry import LESSONS_SECTION, nav_title, sections
from paged_kv_lab.text.i18n import languages, tr
from paged_kv_lab.ui.entry import streamlit_page
from paged_kv_lab.ui.lesson_page import current_lang, current_model, render_lesson

PACK_FOLDER = "paged-kv-lab-class-pack"


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
            st.page_link(streamlit_page(page, lang), label=nav_title(page, lang), icon=page.icon)
            st.caption(tr(page.summary, lang))
    class_pack(lang)


def class_pack(lang: str) -> None:
    """The class pack (ui/class_pack.py) as a zip: built when the button is pressed, from the runs
    the
    server has recorded (the warm-up records them all), in every language."""
    ms = current_model()
    if ms.model is None:
        return

    def build() -> bytes:
        from paged_kv_lab.classroom.pack_site import zip_pack
        from paged_kv_lab.ui.class_pack import build_pack, pack_items

        return zip_pack(build_pack(pack_items(), tuple(languages()), ms), PACK_FOLDER)

    st.download_button(
        tr("pack.button", lang),
        build,
        file_name=f"{PACK_FOLDER}.zip",
        mime="application/zip",
        key="dl_pack",
        on_click="ignore",
        icon=":material/folder_zip:",
        help=tr("pack.button_help", lang),
    )
