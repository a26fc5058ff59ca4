"""The step player: a recorded run as compact JSON (payload), the browser assets that decode, draw
and step it (assets/), and the self-contained HTML export (export). No Streamlit in here."""

from paged_kv_lab.player.export import static_html
from paged_kv_lab.player.payload import (
    WIRE,
    RunEncoder,
    color_map,
    delta,
    player_book,
    run_payload,
    snapshot_dict,
)

__all__ = [
    "WIRE",
    "RunEncoder",
    "color_map",
    "delta",
    "player_book",
    "run_payload",
    "snapshot_dict",
    "static_html",
]
