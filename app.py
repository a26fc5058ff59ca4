"""Paged KV Lab: step a real LLM through vLLM v1's paged KV-cache management, live.

Run from a clone: ``streamlit run app.py`` (or ``make run``). The installed package starts the same
app from its own copy of this file (``paged-kv-lab``: paged_kv_lab/streamlit_app.py); the pages and
the sidebar are paged_kv_lab/ui/entry.py's, built from the page registry (content/pages.json), with
no page files: /<slug> opens a page, on a first visit too.
"""

from paged_kv_lab.ui.entry import main

main()
