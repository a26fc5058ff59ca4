"""No prose in Python: every sentence a user reads comes from the catalogue, in any language.

1. No non-test ``.py`` file of the lab (paged_kv_lab/, kvcore/, bench/) holds CJK text: a
   sentence in Chinese lives in the catalogue's data files, never in code.
2. A pseudo-language ``xx``, made from data alone (a folder with its ``languages.json`` and one
   catalogue file wrapping every entry's English text in ``⟦…⟧``, fields kept), is added through
   ``PAGED_KV_LAB_TEXT_DIRS``. Every page of the app's navigation is opened in ``xx`` (AppTest on
   the tiny model) and every text it shows is read: markdown, captions, headings, alerts, widget
   labels, options and help, expander and tab labels, metrics, dataframe headers, chart titles and
   the browser player's words and step sentences. Once the marked spans are taken out, what is
   left may hold numbers, punctuation, identifiers (``max_num_seqs``, ``#3``), code spans, quoted
   token text, request ids and names (vLLM, SGLang); an English word or a CJK character left there
   is a sentence that did not come from the catalogue.
"""

from __future__ import annotations

from pathlib import Path

from support.paths import ROOT
from support.pseudo import (
    CJK,
    OPEN,
    _vega_texts,
    explore,
    leftovers,
    navigation_pages,
    open_in_xx,
    page_leftovers,
)


# -- 1. no CJK text in code ------------------------------------------------------------------------
def python_files() -> list[Path]:
    return sorted(
        p
        for d in ("paged_kv_lab", "kvcore", "bench")
        for p in (ROOT / d).rglob("*.py")
        if ".venv" not in p.parts
    )


def test_no_python_file_holds_cjk_text():
    found = {
        str(p.relative_to(ROOT)): n
        for p in python_files()
        if (n := len(CJK.findall(p.read_text(encoding="utf-8"))))
    }
    assert not found, (
        "CJK text in Python (move each sentence to text/catalogue/ and refer to it by key); "
        f"file: CJK characters: {found}"
    )


def test_the_leftover_check_finds_english_and_chinese_and_spares_data():
    assert leftovers("⟦Step {n}⟧ 3 · `max_num_seqs` · A → “the cat” · #abc123 · vLLM") == []
    assert leftovers("⟦Request ⟦A⟧ hit⟧: [1, 2] (g0)") == []
    assert leftovers("step 3: ⟦hit⟧") == ["step"]
    assert leftovers("⟦x⟧ 命中 ") == ["命", "中"]
    assert leftovers("Loaded in 3.0 s") == ["Loaded", "in"]
    assert leftovers("⟦x⟧ the request's block's hash") == ["the", "request", "block", "hash"]
    assert leftovers("⟦x⟧ 'a token' and \"another\"") == ["and"]
    spec = {
        "layer": [
            {
                "encoding": {
                    "x": {"title": "engine step"},
                    "color": {"scale": {"domain": ["⟦usage⟧", "waiting"]}},
                }
            },
            {"data": {"values": [{"v": 1, "label": "bound"}]}},
        ]
    }
    assert _vega_texts(spec) == ["engine step", "⟦usage⟧", "waiting", "bound"]


def test_every_page_in_a_pseudo_language_shows_no_english_or_chinese(pseudo_language, monkeypatch):
    pages = navigation_pages(monkeypatch)
    bad: dict[str, list[str]] = {}
    for page in pages:
        name = page or "home"
        try:
            at = open_in_xx(page)
        except AssertionError as e:  # a page that fails in xx: a text not taken from the catalogue
            bad[name] = [f"[exception] {str(e).splitlines()[0][:300]}"]
            continue
        texts = explore(at)
        assert texts, f"{name}: no text read from the page"
        assert any(OPEN in t for _, t in texts), f"{name}: no catalogue text shown in xx"
        if lines := page_leftovers(texts):
            bad[name] = lines
    assert not bad, "text not from the catalogue, page by page:\n" + "\n".join(
        f"{name}:\n" + "\n".join(f"  {line}" for line in lines) for name, lines in bad.items()
    )
