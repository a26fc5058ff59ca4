"""The page registry (paged_kv_lab/content/pages.json) is the one list of pages: it loads with its
invariants, every page has its title and summary in every language and something that draws it,
and README.md's page table and docs/lessons.md's page list are generated from it. After changing
the registry, regenerate:

    .venv/bin/python tests/lab/test_page_registry.py --write    # rewrite both tables
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a script (--write): the checkout and tests/ on sys.path
    sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (2, 1)]

from paged_kv_lab.content.registry import load_registry, nav_title, pages, sections  # noqa: E402
from paged_kv_lab.text.i18n import catalogue, languages, tr  # noqa: E402
from support.paths import ROOT  # noqa: E402

README = ROOT / "README.md"
LESSONS_DOC = ROOT / "docs" / "lessons.md"
WRITE = "regenerate with: .venv/bin/python tests/lab/test_page_registry.py --write"
MARKS = {
    README: (
        "<!-- pages-table:start (generated from paged_kv_lab/content/pages.json) -->",
        "<!-- pages-table:end -->",
    ),
    LESSONS_DOC: (
        "<!-- pages-list:start (generated from paged_kv_lab/content/pages.json) -->",
        "<!-- pages-list:end -->",
    ),
}


def readme_table() -> str:
    """Every page with what it shows, by section (English)."""
    lines = ["| Section | Page | What you watch |", "|---|---|---|"]
    for s in sections():
        for p in s.pages:
            lines.append(f"| {tr(s.title)} | {p.icon} {nav_title(p, 'en')} | {tr(p.summary)} |")
    return "\n".join(lines)


def drawn_by(p) -> str:
    """What draws a page: its lesson's folder (played by the lesson page), or its function."""
    from paged_kv_lab.ui.entry import RENDERERS

    if p.id in RENDERERS:
        module, name = RENDERERS[p.id]
        return f"`{name}` in `paged_kv_lab/ui/{module}.py`"
    return f"the lesson page, from `paged_kv_lab/content/lessons/{p.lesson}/`"


def lessons_doc_list() -> str:
    """Every page with its URL path and what draws it."""
    lines = ["| Section | Page | URL path | Drawn by |", "|---|---|---|---|"]
    for s in sections():
        for p in s.pages:
            title = f"{p.icon} {nav_title(p, 'en')}"
            lines.append(f"| {tr(s.title)} | {title} | `/{p.url_path}` | {drawn_by(p)} |")
    return "\n".join(lines)


GENERATED = {README: readme_table, LESSONS_DOC: lessons_doc_list}


def between(path: Path) -> str:
    start, end = MARKS[path]
    text = path.read_text(encoding="utf-8")
    a, b = text.find(start), text.find(end)
    assert a >= 0 and b > a, f"{path.name} lost its page-table markers; {WRITE}"
    return text[a + len(start) : b].strip()


def write(path: Path) -> None:
    start, end = MARKS[path]
    text = path.read_text(encoding="utf-8")
    between(path)
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{start}\n{GENERATED[path]()}\n{end}{tail}", encoding="utf-8")


@pytest.mark.parametrize("path", list(GENERATED), ids=lambda p: p.name)
def test_the_docs_page_tables_are_the_registry(path):
    assert between(path) == GENERATED[path](), f"{path.name}'s page table is stale; {WRITE}"


def test_every_page_and_section_is_titled_in_every_language():
    cat = catalogue()
    keys = [s.title for s in sections()] + [k for p in pages() for k in (p.title, p.summary)]
    for key in keys + ["page.lesson_title"]:
        assert key in cat, f"{key} is not in the catalogue"
        assert set(languages()) <= set(cat[key]), f"{key} lacks a language"


def test_the_readme_counts_no_pages_by_hand():
    """The old README said four Topics when there were five: counts come from the table only."""
    text = README.read_text(encoding="utf-8")
    for word in ("four", "five", "six"):
        assert f"{word} questions answered" not in text


def test_every_page_is_drawn_by_its_lesson_or_its_function():
    """ui/entry.py's RENDERERS names a function for each page that plays no lesson (or plays it
    its own way), and no other id; each function exists."""
    import importlib

    from paged_kv_lab.ui.entry import RENDERERS, renderer

    ids = {p.id for p in pages()}
    assert set(RENDERERS) <= ids, f"not in the registry: {sorted(set(RENDERERS) - ids)}"
    for p in pages():
        assert callable(renderer(p)), p.id
    for module, name in RENDERERS.values():
        assert callable(getattr(importlib.import_module(f"paged_kv_lab.ui.{module}"), name))


def _load(tmp_path, data: dict):
    path = tmp_path / "pages.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return load_registry(path)


def _page(pid: str, **kw) -> dict:
    return {"id": pid, "slug": pid, "icon": "x", "ready": [".x"], **kw}


def test_the_registry_names_the_page_and_field_it_rejects(tmp_path):
    home = _page("home", slug="")
    ok = {
        "sections": [
            {"id": "start", "title": "t", "pages": [home]},
            {"id": "lessons", "title": "t", "pages": [_page("a", lesson="a"), _page("b")]},
        ]
    }
    got = _load(tmp_path, ok)
    assert got[0].pages[0].default and not got[1].pages[0].default
    a, b = got[1].pages
    assert (a.url_path, a.number, a.lesson, b.url_path, b.number) == ("a", 1, "a", "b", None)

    def refused(pages, message):
        with pytest.raises(ValueError, match=message):
            _load(tmp_path, {"sections": [{"id": "start", "title": "t", "pages": pages}]})

    refused([home, _page("a"), _page("a")], r"pages.json: pages: id used twice: \['a'\]")
    refused([home, _page("a", icon=3)], r"section 'start', page 1 \('a'\): 'icon' must be")
    refused([home, _page("a", colour="red")], r"unknown field\(s\) \['colour'\]")
    refused([home, _page("a", slug="")], r"page 1 \('a'\): the first page, and only it")
    refused([_page("home"), _page("a")], r"page 0 \('home'\): the first page, and only it")
    refused([home, _page("a", slug="x/y")], "slug 'x/y': letters, digits")
    refused([home, _page("a", lesson="z"), _page("b", lesson="z")], r"lesson used twice: \['z'\]")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        for p in GENERATED:
            write(p)
            print(f"wrote the page table into {p.relative_to(ROOT)}")
    else:
        sys.exit(__doc__)
