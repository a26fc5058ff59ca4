"""Compute once, shared by every session of this server process: ``Shared``, one kind of value in
the server's one cache bounded by bytes (runs/server_cache.py, where its invariants are), and
its page side, ``ready_or_placeholder``.

A ``Shared`` holds values by key. ``get`` computes a missing value in the asking thread (a second
asker waits for the first instead of computing again); ``start`` computes it in a background
thread and returns at once; ``peek`` returns it if it is ready, else None, never waiting.
``ready_or_placeholder`` is the page's side of ``start``: the value when it is ready, else a
visible note that polls and reruns the page once the value is there, so a page script never
waits for a long computation.
"""

from __future__ import annotations

from typing import Callable, Hashable, Optional, TypeVar

from paged_kv_lab.runs.server_cache import Shared

__all__ = ["POLL_S", "Shared", "ready_or_placeholder"]

T = TypeVar("T")
POLL_S = 1.0  # how often a placeholder looks whether its value is ready


def ready_or_placeholder(
    shared: Shared[T], key: Hashable, compute: Callable[[], T], note: str
) -> Optional[T]:
    """On a page: the value for ``key`` if it is ready; else start computing it in the background,
    show ``note`` where the value will go, and return None (the note polls every POLL_S s and
    reruns the page when the value is ready, which replaces the note)."""
    import streamlit as st

    shared.start(key, compute)
    value = shared.peek(key)
    if value is None:
        st.fragment(run_every=POLL_S)(_placeholder)(shared, key, note)
    return value


def _placeholder(shared: Shared, key: Hashable, note: str) -> None:
    import streamlit as st

    if shared.ready(key):
        st.rerun()
    st.info(note, icon="⏳")
