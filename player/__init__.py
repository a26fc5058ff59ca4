"""The step player: a recorded run as compact JSON (payload), the browser assets that draw and
step it (assets/), and the self-contained HTML export (export). No Streamlit in here."""
from player.payload import RunEncoder, apply_delta, color_map, delta, run_payload, snapshot_dict
from player.export import static_html

__all__ = ["RunEncoder", "apply_delta", "color_map", "delta", "run_payload", "snapshot_dict", "static_html"]
