"""Paged KV Lab: step a real LLM through vLLM v1's paged KV-cache management, live.

Run: python -m streamlit run paged_kv_lab/streamlit_app.py   (the entry itself: ui/entry.py; its
pages are built from the page registry, content/pages.json)
"""

from paged_kv_lab.ui.entry import main

main()
