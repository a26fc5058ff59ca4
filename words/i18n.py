"""UI text in English and Chinese: one catalogue, words/strings.json, for the app and the player.

Every label the app shows goes through ``tr(key, lang, **fields)``; the browser player gets its
part of the same catalogue (the keys ``player.<name>``, as ``L.<name>`` in player/assets/*.js)
from ``player_strings`` with the run. Lesson narration lives with each lesson (lessons/), event
sentences in words/sentences.py and the "why?" answers in words/explain_text.py: that is content,
in the same two-language dict shape ``{"en": ..., "zh": ...}`` that ``pick`` reads.

The catalogue: ``{key: {"en": text, "zh": text}}``, where a text is a string or a list of
strings (table headers), and ``{name}`` marks a field filled by ``tr`` (Python's str.format,
so ``{{`` is a literal brace) or by the player's ``fmt``; both languages name the same fields.
``{key: {"same_as": other}}`` is the other entry's text (the player's labels that the app shows
too are written once).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Union

LANGS = ("en", "zh")
LANG_NAMES = {"en": "English", "zh": "中文"}
CATALOGUE = Path(__file__).with_name("strings.json")
PLAYER_PREFIX = "player."

Text = Union[str, tuple]


@lru_cache(maxsize=1)
def catalogue() -> dict[str, dict[str, Text]]:
    """The catalogue with every ``same_as`` resolved, lists as tuples: key -> {lang: text}."""
    raw = json.loads(CATALOGUE.read_text(encoding="utf-8"))
    out: dict[str, dict[str, Text]] = {}
    for key, entry in raw.items():
        seen = [key]
        while "same_as" in entry:
            target = entry["same_as"]
            if target in seen or target not in raw:
                raise ValueError(
                    f"{CATALOGUE.name}: {key!r} refers to {target!r}, which is missing or circular"
                )
            seen.append(target)
            entry = raw[target]
        out[key] = {lang: tuple(v) if isinstance(v, list) else v for lang, v in entry.items()}
    return out


def _unescape(text: str) -> str:
    return text.replace("{{", "{").replace("}}", "}")


def tr(key: str, lang: str = "en", **fields) -> Text:
    """``key`` in ``lang`` (English for an unknown language), its fields filled from ``fields``;
    an unknown key comes back as the key itself."""
    entry = catalogue().get(key)
    if entry is None:
        return key
    text = entry.get(lang) or entry["en"]
    if isinstance(text, tuple):
        return tuple(t.format(**fields) if fields else _unescape(t) for t in text)
    return text.format(**fields) if fields else _unescape(text)


@lru_cache(maxsize=None)
def _player_strings(lang: str) -> str:
    return json.dumps(
        {
            key[len(PLAYER_PREFIX) :]: list(v) if isinstance(v, tuple) else v
            for key, entry in catalogue().items()
            if key.startswith(PLAYER_PREFIX)
            for v in [entry.get(lang) or entry["en"]]
        },
        ensure_ascii=False,
    )


def player_strings(lang: str) -> dict[str, Union[str, list]]:
    """The player's words in ``lang``: ``player.<name>`` entries as ``{name: text}``, fields left
    as ``{name}`` for the player's ``fmt`` (a fresh dict: the caller may keep it)."""
    return json.loads(_player_strings(lang))


def pick(texts: dict | str | None, lang: str = "en", **fields) -> str:
    """Choose a language from a ``{"en": ..., "zh": ...}`` dict (lesson data)."""
    if texts is None:
        return ""
    if isinstance(texts, str):
        text = texts
    else:
        text = texts.get(lang) or texts.get("en") or ""
    return text.format(**fields) if fields else text
