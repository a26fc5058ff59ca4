"""Paged KV Lab: step a real LLM through vLLM v1's paged KV-cache management, live.

Run: python -m streamlit run app.py   (the entry itself lives in ui/entry.py)
"""

from ui.entry import main

main()
