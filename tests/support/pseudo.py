"""Reading a page in the pseudo-language ``xx`` (every catalogue entry's English between ⟦…⟧):
the texts a page shows (AppTest), what is left of them once the marked spans are taken out, and
a walk of a page's player and panels. The fixture that adds ``xx`` (``pseudo_language``) is in
tests/conftest.py; tests/app/test_pseudo_language.py reads every page with it."""

from __future__ import annotations

import json
import re
from typing import Sequence

from paged_kv_lab.text import i18n
from support.app import APP, TIMEOUT, Browser
from support.paths import ROOT

CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef]")


OPEN, CLOSE = "⟦", "⟧"


# -- 2. a pseudo-language from data alone ----------------------------------------------------------
def wrap(text):
    if isinstance(text, (list, tuple)):
        return [wrap(t) for t in text]
    return OPEN + text + CLOSE


# Words that are names, not sentences: products, models, acronyms written in lower case.
NAMES = {
    "vLLM",
    "vllm",
    "SGLang",
    "sglang",
    "nano",
    "SmolLM",
    "Instruct",
    "cuda",
    "cpu",
    "auto",
    "tok",
    "ms",  # a unit
    "kvcore",
}


def identifiers() -> set[str]:
    """Names the app shows as they are, alone as a label or a choice: the scenario format's
    fields and choices (``policy``, ``fcfs``, ``seed``) and vLLM's functions (``schedule``)."""
    import dataclasses
    import typing

    from paged_kv_lab.run import scenario

    out: set[str] = set()

    def literals(t) -> None:
        if typing.get_origin(t) is typing.Literal:
            out.update(a for a in typing.get_args(t) if isinstance(a, str))
        for a in typing.get_args(t):
            literals(a)

    from paged_kv_lab.why.source_links import FUNCTIONS

    out.update(FUNCTIONS)
    for cls in vars(scenario).values():
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            out.update(f.name for f in dataclasses.fields(cls))
            for t in typing.get_type_hints(cls, include_extras=True).values():
                literals(t)
    return out


# code spans, quoted text (token text, a repr) and links are data; an apostrophe is no quote
QUOTED = re.compile(
    r"`[^`]*`|“[^”]*”|‘[^’]*’|(?<![A-Za-z])'(?:[^'\\\n]|\\.)*'(?![A-Za-z])"
    r'|(?<![A-Za-z])"(?:[^"\\\n]|\\.)*"(?![A-Za-z])'
)


URL = re.compile(r"https?://\S+")


MARKED = re.compile(OPEN + "[^" + OPEN + CLOSE + "]*" + CLOSE)


CHUNK = re.compile(r"[^\s()\[\]{}:;,!?*|<>=+…—–·→←/\\'’]+")


def leftovers(text: str) -> list[str]:
    """The English words and CJK characters of ``text`` outside the pseudo-language's markers,
    code spans, quotes and links; an identifier (a digit, ``_``, ``.`` or ``#`` in it, or mixed
    case), an acronym, a one-letter id or a name is not a word."""
    while True:
        inner = MARKED.sub(" ", text)
        if inner == text:
            break
        text = inner
    text = URL.sub(" ", QUOTED.sub(" ", text))
    out = CJK.findall(text)
    for chunk in CHUNK.findall(text):
        word = chunk.strip(".'\"-%")
        if len(word) < 2 or not word.isalpha() or not word.isascii() or word in NAMES:
            continue
        if word.isupper() or (word[1:].lower() != word[1:]):  # an acronym or mixed case (vLLM)
            continue
        out.append(word)
    return out


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _player_texts(payload: dict) -> list[str]:
    """The player's words and the server's sentences of the steps sent so far."""
    from paged_kv_lab.player import WIRE

    t = WIRE["step"]
    out = _strings((payload.get("strings") or {}).get("xx", {}))
    for st in payload.get("steps") or []:
        out += [e[3] for e in st.get(t["events"], [])]
        out += _strings(st.get(t["narration"], [])) + _strings(st.get(t["summary"], ""))
    return out


def _plotly_texts(spec: dict) -> list[str]:
    layout = spec.get("layout", {})
    out = []
    for name in ["title"] + [k for k in layout if k.startswith(("xaxis", "yaxis"))]:
        title = layout.get(name, {})
        title = title.get("title", title) if name != "title" else title
        if isinstance(title, dict):
            out += _strings(title.get("text", ""))
        elif isinstance(title, str):
            out.append(title)
    out += [a.get("text", "") for a in layout.get("annotations", [])]
    out += [tr.get("name", "") for tr in spec.get("data", []) if isinstance(tr.get("name"), str)]
    return out


def _vega_texts(spec) -> list[str]:
    """A Vega-Lite spec's words: titles (axes, legends, tooltips), a scale's named domain (the
    legend's entries) and the text of inline data rows, at any depth of its layers."""
    out: list[str] = []
    if isinstance(spec, list):
        for x in spec:
            out += _vega_texts(x)
    elif isinstance(spec, dict):
        for k, v in spec.items():
            if k == "title" and isinstance(v, str) and v.strip():
                out.append(v)
            elif k == "domain" and isinstance(v, list):
                out += [x for x in v if isinstance(x, str)]
            elif k == "values" and isinstance(v, list):
                out += [
                    x
                    for row in v
                    if isinstance(row, dict)
                    for x in row.values()
                    if isinstance(x, str)
                ]
            else:
                out += _vega_texts(v)
    return out


TEXT_FIELDS = ("body", "label", "help", "placeholder", "caption")


def shown_texts(at) -> list[tuple[str, str]]:
    """(where, text) of every text on the page: element and block protos, dataframe headers,
    chart titles, the player's payload."""
    out: list[tuple[str, str]] = []

    def walk(node):
        proto = getattr(node, "proto", None)
        kind = getattr(node, "type", type(node).__name__)
        if proto is not None and hasattr(proto, "ListFields"):
            for fd, value in proto.ListFields():
                if fd.name in TEXT_FIELDS and isinstance(value, str):
                    out.append((kind, value))
                elif fd.name == "options" and kind in ("radio", "selectbox", "multiselect"):
                    out.extend((f"{kind} option", v) for v in value if isinstance(v, str))
                elif fd.name in ("expandable", "tab") and hasattr(value, "label"):
                    out.append((fd.name, value.label))
            if kind == "bidi_component" and getattr(proto, "json", ""):
                out.extend(("player", s) for s in _player_texts(json.loads(proto.json)))
            if kind == "plotly_chart" and getattr(proto, "spec", ""):
                out.extend(("chart", s) for s in _plotly_texts(json.loads(proto.spec)))
            if kind == "vega_lite_chart" and getattr(proto, "spec", ""):
                out.extend(("chart", s) for s in _vega_texts(json.loads(proto.spec)))
        if kind == "arrow_data_frame" or type(node).__name__ == "Dataframe":
            try:
                out.extend(("dataframe header", str(c)) for c in node.value.columns)
            except Exception:  # a frame AppTest cannot decode has no header to read
                pass
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return [(w, t) for w, t in out if t]


def navigation_pages(monkeypatch) -> list[str]:
    """The registry ids of the pages the app's st.navigation lists (by their URL paths)."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    seen: list = []
    real = st.navigation

    def spy(pages, *a, **kw):
        groups = pages.values() if isinstance(pages, dict) else [pages]
        seen[:] = [p for group in groups for p in group]
        return real(pages, *a, **kw)

    monkeypatch.setattr(st, "navigation", spy)
    AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    monkeypatch.setattr(st, "navigation", real)
    from paged_kv_lab.content.registry import pages

    by_path = {p.url_path: p.id for p in pages()}
    ids = [by_path[p.url_path] for p in seen]
    assert ids, "the app's navigation lists its pages"
    return ids


def open_in_xx(page: str):
    """The page (a registry id) with the language set to xx."""
    from streamlit.testing.v1 import AppTest

    from support.app import open_page

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if page != "home":  # the first run draws the home page: in English, so that each page is
        at.run()  # judged alone
        open_page(at, page)
    at.session_state["lang"] = "xx"
    at.run()
    assert not at.exception, failures(at)
    return at


def failures(at) -> list[str]:
    """Each exception of the run with the last line of code it came from."""
    out = []
    for e in at.exception:
        frames = [f for f in e.stack_trace if f.strip().startswith("File ")]
        where = frames[-1].strip().splitlines()[0] if frames else ""
        out.append(f"{e.value} ({where})")
    return out


def play(at, steps: int = 8) -> list[str]:
    """Each player of the page is played ``steps`` steps on (as the browser asks for them, the
    cursor moved to the last): the sentences of the steps it was sent."""
    from paged_kv_lab.player import WIRE

    t = WIRE["step"]
    out: list[str] = []
    for el in at.get("bidi_component"):
        if "pkv:" not in el.proto.id:
            continue  # not a step player (Real workloads mounts its pool player ahead, empty)
        key = el.proto.id.rsplit("pkv:", 1)[-1]
        b = Browser(at, key).until_recorded(steps)
        if b.steps:
            b.show(len(b.steps))
        for st in b.steps:
            out += [e[3] for e in st.get(t["events"], [])]
            out += _strings(st.get(t["narration"], [])) + _strings(st.get(t["summary"], ""))
    return out


WHY_MODES = ("request", "block", "two", "order", "calls", "sglang", "nano")  # app/why_panel.py's


def explore(at) -> list[tuple[str, str]]:
    """Every text the page shows: as opened, with its example loaded, its players played, then
    each question of each "Why?" panel asked in turn (closed until the learner opens them)."""
    texts = shown_texts(at)
    for key in [str(b.key) for b in at.button if str(b.key).startswith("example:")]:
        at.button(key=key).click().run()  # a page that opens empty shows its example
        assert not at.exception, failures(at)
    texts += [("player step", p) for p in play(at)] + shown_texts(at)
    for key in [str(t.key) for t in at.toggle if str(t.key).startswith("why_open:")]:
        at.toggle(key=key).set_value(True).run()
        assert not at.exception, failures(at)
        mode_key = "why_mode:" + key.split(":", 1)[1]
        radios = [r for r in at.radio if r.key == mode_key]
        asked = [m for m in WHY_MODES if radios and radios[0].format_func(m) in radios[0].options]
        for mode in asked:
            at.radio(key=mode_key).set_value(mode).run()
            assert not at.exception, failures(at)
            texts += shown_texts(at)
        assert not radios or asked, "every question of the panel is asked"
    return texts


def scenario_words() -> set[str]:
    """The words of the scenario files (descriptions, prompts): the shared examples
    (content/examples/) and the lessons' and cases' (content/<kind>/<id>/scenario.json); data a
    trace carries, shown as the file has them, like a scenario a user uploads."""
    out: set[str] = set()
    content = ROOT / "paged_kv_lab" / "content"
    for path in [*(content / "examples").rglob("*.json"), *content.glob("*/*/scenario.json")]:
        out.update(_strings(json.loads(path.read_text(encoding="utf-8"))))
    return out


def page_leftovers(texts: Sequence[tuple[str, str]]) -> list[str]:
    """Each text that still holds English or CJK outside the markers, as a line (a scenario
    shown as JSON, ``st.json``, is data and is not read)."""
    data = {w.replace("\\", "") for w in scenario_words()}
    langs = i18n.languages()
    # the language menu names each language in itself, under a label every reader can find
    alone = identifiers() | set(langs.values()) | {i18n.tr("language", lang) for lang in langs}
    return list(
        dict.fromkeys(
            f"[{where}] {words}: {t[:160]!r}"
            for where, t in texts
            if where != "json"
            and t.strip() not in alone
            and not any(t.replace("\\", "").startswith(d[:40]) for d in data if len(d) > 40)
            and (words := leftovers(t))
        )
    )
