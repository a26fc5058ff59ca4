"""Every sentence a user reads, by key: the catalogue (data files), one ``Text`` type, one lookup.

The catalogue is the JSON files under ``paged_kv_lab/text/catalogue/`` (any depth) and the
``text.json`` of each content folder (``<content>/lessons/<id>/``, ``cases/<id>/``,
``topics/<id>/``: a lesson's, a case's or a topic's own sentences, beside its data), each a map
``{key: {lang: text}}``; a key lives in one file only. A text is a string or a list of strings
(table headers); ``{name}`` marks a field filled by ``tr`` (Python's str.format, so ``{{`` is a
literal brace) or by the player's ``fmt``; every language of an entry names the same fields.
``{key: {"same_as": other}}`` is the other entry's text (written once, shown in two places).

Languages are data too: ``paged_kv_lab/text/languages.json`` names them (``{code: name}``, the
first is the fallback). Folders listed in ``PAGED_KV_LAB_TEXT_DIRS`` (os.pathsep-separated) add
to both: their ``languages.json`` adds languages, their catalogue files add texts per key and
language. So a third language is a folder of data, with no code changed.

Where the content lives is said here, once (``content_dir``: ``PAGED_KV_LAB_CONTENT_DIR``, else
``paged_kv_lab/content``), since this module imports nothing of the lab: the lesson, case and
topic loaders and the page registry ask ``content_dir()`` too, so one variable moves them all.

``Text`` is a sentence not yet put into a language: a key and its fields (which may themselves be
``Text``); ``tr(text_or_key, lang, **fields)`` is the one lookup that renders it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

HERE = Path(__file__).resolve().parent
CATALOGUE_DIR = HERE / "catalogue"
LANGUAGES_FILE = HERE / "languages.json"
TEXT_DIRS_ENV = "PAGED_KV_LAB_TEXT_DIRS"
CONTENT_DIR_ENV = "PAGED_KV_LAB_CONTENT_DIR"
DEFAULT_CONTENT_DIR = HERE.parent / "content"
# the content folder's kinds, one folder per item each (<content>/<kind>/<id>/), and the file of an
# item's sentences
CONTENT_KINDS = ("lessons", "cases", "topics")
CONTENT_TEXT = "text.json"
PLAYER_PREFIX = "player."

Entry = Union[str, tuple]


@dataclass(frozen=True)
class Text:
    """A catalogue sentence with its fields, in no language yet (``tr(text, lang)`` renders it).

    Invariant: ``key`` names a catalogue entry; field values are plain values or ``Text``."""

    key: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, lang: str = "en") -> str:
        return tr(self, lang)

    def __hash__(self) -> int:  # hashable when its fields are (a frozen settings object holds one)
        return hash((self.key, tuple(sorted(self.fields.items()))))


def extra_dirs() -> tuple[Path, ...]:
    raw = os.environ.get(TEXT_DIRS_ENV, "")
    return tuple(Path(p) for p in raw.split(os.pathsep) if p.strip())


def content_dir() -> Path:
    """The content folder: ``lessons/``, ``cases/``, ``topics/`` (a folder per item), ``examples/``
    and the page registry ``pages.json``. ``PAGED_KV_LAB_CONTENT_DIR`` names another one (a
    course of one's own, a test's copy); read at each call, so every lookup follows it."""
    raw = os.environ.get(CONTENT_DIR_ENV, "").strip()
    return Path(os.path.abspath(raw)) if raw else DEFAULT_CONTENT_DIR


def content_text_files(root: Path | None = None) -> list[Path]:
    """The sentence files of the content folder ``root`` (``content_dir()`` when None): each
    lesson's, case's and topic's ``text.json``."""
    root = content_dir() if root is None else root
    return sorted(p for kind in CONTENT_KINDS for p in (root / kind).glob(f"*/{CONTENT_TEXT}"))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object")
    return data


@lru_cache(maxsize=4)
def _languages(dirs: tuple[Path, ...]) -> dict[str, str]:
    langs = dict(_read_json(LANGUAGES_FILE))
    for d in dirs:
        if (d / "languages.json").is_file():
            langs.update(_read_json(d / "languages.json"))
    return langs


def languages() -> dict[str, str]:
    """Language code -> its name in itself, in menu order (the first is the fallback)."""
    return _languages(extra_dirs())


def catalogue_files(base: Path | None = None) -> list[Path]:
    """The catalogue files under ``base`` (any depth); None: the catalogue's own, the files under
    text/catalogue/ and the content folder's ``text.json`` files."""
    if base is None:
        return catalogue_files(CATALOGUE_DIR) + content_text_files()
    return sorted(p for p in base.rglob("*.json") if p.name != "languages.json")


@lru_cache(maxsize=4)
def _catalogue(content: Path, dirs: tuple[Path, ...]) -> dict[str, dict[str, Entry]]:
    raw: dict[str, dict] = {}
    where: dict[str, Path] = {}
    for path in catalogue_files(CATALOGUE_DIR) + content_text_files(content):
        for key, entry in _read_json(path).items():
            if key in raw:
                raise ValueError(f"{path}: key {key!r} is also in {where[key]}")
            if not isinstance(entry, dict):
                raise ValueError(f"{path}: {key!r} must map languages to texts")
            raw[key], where[key] = dict(entry), path
    for d in dirs:  # added languages: per key, per language
        for path in catalogue_files(d):
            for key, entry in _read_json(path).items():
                if key not in raw:
                    raise ValueError(f"{path}: key {key!r} is not in the catalogue")
                if "same_as" not in raw[key] and isinstance(entry, dict):
                    raw[key].update(entry)
    out: dict[str, dict[str, Entry]] = {}
    for key, entry in raw.items():
        seen = [key]
        while "same_as" in entry:
            target = entry["same_as"]
            if target in seen or target not in raw:
                raise ValueError(
                    f"{where[key].name}: {key!r} refers to {target!r}, which is missing or circular"
                )
            seen.append(target)
            entry = raw[target]
        out[key] = {lang: tuple(v) if isinstance(v, list) else v for lang, v in entry.items()}
    return out


def catalogue() -> dict[str, dict[str, Entry]]:
    """Every entry with ``same_as`` resolved, lists as tuples: key -> {lang: text}."""
    return _catalogue(content_dir(), extra_dirs())


def _unescape(text: str) -> str:
    return text.replace("{{", "{").replace("}}", "}")


def _fill(text: str, lang: str, fields: Mapping[str, Any]) -> str:
    if not fields:
        return _unescape(text)
    return text.format(**{k: _field(v, lang) for k, v in fields.items()})


def _field(value: Any, lang: str) -> Any:
    # a tuple of Text is a list of sentences (a refusal's problems): one a line
    if isinstance(value, tuple) and value and all(isinstance(v, Text) for v in value):
        return "\n".join(tr(v, lang) for v in value)
    return tr(value, lang) if isinstance(value, Text) else value


def tr(key: str | Text, lang: str = "en", **fields) -> Entry:
    """The one lookup: ``key`` (or a ``Text``) in ``lang``, its fields filled. A language the
    entry lacks falls back to the first language; an unknown key comes back as the key itself."""
    if isinstance(key, Text):
        fields = {**key.fields, **fields}
        key = key.key
    entry = catalogue().get(key)
    if entry is None:
        return key
    text = entry.get(lang) or entry[next(iter(languages()))]
    if isinstance(text, tuple):
        return tuple(_fill(t, lang, fields) for t in text)
    return _fill(text, lang, fields)


@lru_cache(maxsize=None)
def _player_strings(lang: str, content: Path, dirs: tuple[Path, ...]) -> str:
    fallback = next(iter(_languages(dirs)))
    return json.dumps(
        {
            key[len(PLAYER_PREFIX) :]: list(v) if isinstance(v, tuple) else v
            for key, entry in _catalogue(content, dirs).items()
            if key.startswith(PLAYER_PREFIX)
            for v in [entry.get(lang) or entry[fallback]]
        },
        ensure_ascii=False,
    )


def player_strings(lang: str) -> dict[str, Union[str, list]]:
    """The player's words in ``lang``: ``player.<name>`` entries as ``{name: text}``, fields left
    as ``{name}`` for the player's ``fmt`` (a fresh dict: the caller may keep it)."""
    return json.loads(_player_strings(lang, content_dir(), extra_dirs()))


def pick(texts: dict | str | None, lang: str = "en", **fields) -> str:
    """Deprecated: a ``{"en": ..., "zh": ...}`` dict written in Python. Being replaced by catalogue
    keys (``tr``); removed once no caller is left."""
    if texts is None:
        return ""
    if isinstance(texts, str):
        text = texts
    else:
        text = texts.get(lang) or texts.get("en") or ""
    return text.format(**fields) if fields else text


def __getattr__(name: str):
    # LANGS / LANG_NAMES read the data files (and PAGED_KV_LAB_TEXT_DIRS) when asked
    if name == "LANGS":
        return tuple(languages())
    if name == "LANG_NAMES":
        return languages()
    raise AttributeError(name)


class Refusal(ValueError):
    """A refusal that is one catalogue sentence: ``text`` the sentence ("<PREFIX><key>", the ids
    and numbers its data), ``str(e)`` its English. Subclasses name their PREFIX."""

    PREFIX = "problem."

    def __init__(self, key: str, **fields) -> None:
        self.text = Text(f"{self.PREFIX}{key}", fields)
        super().__init__(tr(self.text, "en"))


class ProblemsError(ValueError):
    """A refusal that lists problems, one a line. ``texts``: each problem a catalogue sentence
    whose fields hold the data (a field's path, the offending value: never translated);
    ``problems``: their English (what the CLI, logs and tests read); ``text``: the sentence
    around them (the subclass's ``AROUND``), so ``str(e)`` is the English whole."""

    AROUND: Text  # the sentence around the problems (its ``problems`` field filled here)

    def __init__(self, problems: Sequence[Text]) -> None:
        self.texts = tuple(problems)
        bullets = tuple(Text("problem.bullet", {"line": t}) for t in self.texts)
        self.text = Text(self.AROUND.key, {"problems": bullets})
        super().__init__(tr(self.text, "en"))

    @property
    def problems(self) -> list[str]:
        return [tr(t, "en") for t in self.texts]

    def lines(self, lang: str = "en") -> list[str]:
        """The problems in ``lang``, one a line."""
        return [tr(t, lang) for t in self.texts]


def said(error: BaseException, lang: str = "en") -> str:
    """What ``error`` says in ``lang``: its ``text`` (a ``Text``: a refusal, an explain error)
    rendered, or, for an error that carries no catalogue sentence, ``str(error)``."""
    text = getattr(error, "text", None)
    return tr(text, lang) if isinstance(text, Text) else str(error)
