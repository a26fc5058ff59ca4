"""The teaching side of Paged KV Lab: lessons as data, figure builders and Streamlit widgets.

Everything here reads kvcore's frozen Snapshot / Event records; nothing reaches into the engine.
"""
