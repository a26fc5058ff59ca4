"""One self-contained HTML file: the player's html/css/js and a recorded run, inlined.

It opens from a file:// URL with no server and no network, and steps exactly like the app
because it runs the same player.js on the same payload. The run is inlined as JSON in a
``<script type="application/json">`` element whose text cannot close the element (``<``, ``>``
and ``&`` are written as \\u escapes), and player.js reads it with JSON.parse: nothing from the
run is ever parsed as HTML. What the app sends with a run's head besides the run (the wire keys
and the player's words: ``player_book``) is inlined in the module, as a JSON literal.
"""

from __future__ import annotations

import html
import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Optional

from paged_kv_lab.player.payload import player_book
from paged_kv_lab.text.i18n import tr

ASSETS = (
    "player.html",
    "player.css",
    "player.js",
    "panels.js",
    "charts.js",
    "text.js",
    "decode.js",
    "room.js",
)
# each after the modules it imports
MODULES = ("text.js", "decode.js", "charts.js", "panels.js", "room.js", "player.js")


@lru_cache(maxsize=None)
def asset(name: str) -> str:
    if name not in ASSETS:
        raise ValueError(f"unknown player asset {name!r}")
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def module_js() -> str:
    """The player's JS modules as one module's text, for where they cannot be fetched by URL
    (the static export, a page without a server): each file in import order, its imports of the
    others dropped. The app serves them as files and the browser resolves the imports itself."""
    parts = []
    for name in MODULES:
        lines = asset(name).split("\n")
        parts.append("\n".join(line for line in lines if not line.startswith("import ")))
    return "\n".join(parts)


def json_for_script(value: Any) -> str:
    """JSON that is safe inside a <script> element's text."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for ch, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(ch, esc)
    return text


def html_lang(code: str) -> str:
    """The page's ``<html lang>``: a catalogue language's code is its BCP 47 tag (anything else,
    never written into the page, is "en")."""
    return code if re.fullmatch(r"[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*", code or "") else "en"


def escape(text: str) -> str:
    """Plain text for an HTML element's text or a quoted attribute."""
    return html.escape(text, quote=True)


def static_html(
    payload: dict[str, Any],
    title: Optional[str] = None,
    back: Optional[tuple[str, str]] = None,
) -> str:
    """The page; ``back`` = (words, relative href) puts a link above the player (the class pack's
    way back to its index). A page opened as ``...html#step=N`` shows step N first. No
    ``title``: the catalogue's, in the run's language."""
    run_lang = (payload.get("head") or {}).get("lang") or "en"
    safe_title = escape(title if title is not None else tr("export.default_title", run_lang))
    back_link = (
        f'<p class="pkv-back"><a href="{escape(back[1])}">{escape(back[0])}</a></p>\n'
        if back
        else ""
    )
    lang = html_lang(run_lang)
    js = module_js().replace("</script", "<\\/script")
    book = json_for_script(player_book(run_lang))
    return f"""<!doctype html>
<html lang="{lang}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; \
script-src 'unsafe-inline'">
<title>{safe_title}</title>
<style>
body {{ font-family: system-ui, 'Noto Sans CJK SC', 'Microsoft YaHei', sans-serif; margin: 1rem; }}
{asset("player.css")}
</style>
</head>
<body>
{back_link}<div id="pkv-root">{asset("player.html")}</div>
<script type="application/json" id="pkv-run">{json_for_script(payload)}</script>
<script type="module">
{js}
const pkvAt = /^#step=([0-9]{{1,7}})$/.exec(location.hash);
mountPlayer({{
  data: {{
    ...JSON.parse(document.getElementById("pkv-run").textContent),
    ...{book},
    ...(pkvAt ? {{ goto: {{ seq: 1, step: Number(pkvAt[1]) }} }} : {{}}),
  }},
  parentElement: document.getElementById("pkv-root"),
  setStateValue: () => {{}},
  setTriggerValue: () => {{}},
  static: true,
}});
</script>
</body>
</html>
"""
