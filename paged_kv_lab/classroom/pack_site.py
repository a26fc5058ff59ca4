"""The class pack's pages and folder: an index of offline players by section, a quiz page, and the
checks on where the pack goes. What the pack holds (which lessons, their runs, their words) is the
app's (ui/class_pack.py); this module only lays it out, as plain data in, text files out.

The pack is one folder that works from a file:// URL, a USB stick or any static host:

    index.html            every language's index; the switch shows one (``index.html#<lang>``)
    <lang>/<id>.html      one lesson's, topic's or case's run as the static player (export.py)
    <lang>/quiz.html      the quiz: choose, check, read why

Invariants: every link in it is relative and stays inside it; no page fetches anything (each one's
Content-Security-Policy forbids it); every text from a run, the catalogue or a file name reaches a
page escaped (the index) or through ``textContent`` (the quiz), never as HTML.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from paged_kv_lab.player.export import escape, html_lang, json_for_script
from paged_kv_lab.text.i18n import Text

INDEX = "index.html"
QUIZ = "quiz.html"
FILE_STEM = re.compile(r"^[a-z0-9][a-z0-9-]*$")  # a player's file name in the pack, before .html

_CSP = (
    '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
    "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
)
_STYLE = """
body { font-family: system-ui, 'Noto Sans CJK SC', 'Microsoft YaHei', sans-serif;
  margin: 1.2rem auto; max-width: 60rem; padding: 0 1rem; color: #222; line-height: 1.45; }
a { color: #1f5fa8; }
nav.pkv-langs { display: flex; gap: .8rem; justify-content: flex-end; }
nav.pkv-langs a { text-decoration: none; border: 1px solid #ccc; border-radius: .4rem;
  padding: .1rem .5rem; }
.pkv-entry { margin: .35rem 0 .7rem 0; }
.pkv-entry small, .pkv-where { color: #666; display: block; }
.pkv-q { border: 1px solid #ddd; border-radius: .5rem; padding: .6rem .9rem; margin: .8rem 0; }
.pkv-q label { display: block; margin: .15rem 0; }
.pkv-ok { color: #1b7a1b; } .pkv-no { color: #b22222; }
"""


class PackRefused(ValueError):
    """A pack that is not built, and why (``text``, a catalogue sentence)."""

    def __init__(self, text: Text) -> None:
        super().__init__(text.key)
        self.text = text


def check_out_dir(path: str | Path) -> Path:
    """``path`` as the pack's folder: it must be new or an empty folder (a pack never overwrites or
    mixes with other files). Raises PackRefused naming the problem."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise PackRefused(Text("pack.refused.not_a_folder", {"path": str(out)}))
    if out.is_dir() and any(out.iterdir()):
        raise PackRefused(Text("pack.refused.not_empty", {"path": str(out)}))
    return out


@dataclass(frozen=True)
class IndexEntry:
    """One player on the index: ``href`` is its file in the language's folder; ``more`` are
    further (words, href) links of the entry (a case's run with its fix)."""

    href: str
    icon: str
    title: str
    summary: str
    more: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class IndexSection:
    title: str
    entries: tuple[IndexEntry, ...]


@dataclass(frozen=True)
class IndexPage:
    """The index in one language: its sections in the app's order, then the quiz's link."""

    lang: str
    name: str  # the language's name in itself, on the switch
    title: str
    intro: str
    sections: tuple[IndexSection, ...]
    quiz: IndexEntry


def _entry(lang: str, e: IndexEntry) -> str:
    more = "".join(f' · <a href="{escape(lang)}/{escape(h)}">{escape(w)}</a>' for w, h in e.more)
    return (
        f'<div class="pkv-entry">{escape(e.icon)} <a class="pkv-open" '
        f'href="{escape(lang)}/{escape(e.href)}">'
        f"{escape(e.title)}</a>{more}<small>{escape(e.summary)}</small></div>"
    )


def index_html(pages: Sequence[IndexPage]) -> str:
    """The pack's index.html: every language's index, one shown at a time. The switch is links to
    ``#<lang>`` and CSS shows the targeted one (the first when none is), so it needs no script."""
    body = []
    for p in pages:
        lang = html_lang(p.lang)
        sections = "".join(
            f"<h2>{escape(s.title)}</h2>" + "".join(_entry(p.lang, e) for e in s.entries)
            for s in p.sections
        )
        body.append(
            f'<main id="{escape(p.lang)}" lang="{lang}"><h1>{escape(p.title)}</h1>'
            f"<p>{escape(p.intro)}</p>{sections}<h2>{escape(p.quiz.title)}</h2>"
            f"{_entry(p.lang, p.quiz)}</main>"
        )
    switch = " ".join(
        f'<a href="#{escape(p.lang)}" lang="{html_lang(p.lang)}" data-lang="{escape(p.lang)}">'
        f"{escape(p.name)}</a>"
        for p in pages
    )
    first = html_lang(pages[0].lang) if pages else "en"
    return f"""<!doctype html>
<html lang="{first}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{_CSP}
<title>{escape(pages[0].title if pages else "")}</title>
<style>{_STYLE}
main {{ display: none; }}
main:target, body:not(:has(main:target)) main:first-of-type {{ display: block; }}
</style>
</head>
<body>
<nav class="pkv-langs">{switch}</nav>
{"".join(body)}
</body>
</html>
"""


_QUIZ_JS = """
const data = JSON.parse(document.getElementById("pkv-quiz").textContent);
const root = document.getElementById("pkv-questions");
const el = (tag, cls, text) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
};
data.questions.forEach((q, i) => {
  const box = el("section", "pkv-q");
  box.dataset.question = String(i);
  const where = el("small", "pkv-where", q.where + " · ");
  const look = el("a", null, q.link);
  look.href = q.href;
  where.append(look);
  box.append(where, el("p", null, q.prompt));
  q.options.forEach((text, j) => {
    const label = el("label");
    const input = el("input");
    input.type = "radio";
    input.name = "q" + i;
    input.value = String(j);
    label.append(input, " " + text);
    box.append(label);
  });
  const check = el("button", null, data.words.check);
  check.type = "button";
  const said = el("p", "pkv-said");
  check.addEventListener("click", () => {
    const picked = box.querySelector("input:checked");
    if (!picked) { said.className = "pkv-said"; said.textContent = data.words.pick; return; }
    const right = Number(picked.value) === q.answer;
    said.className = "pkv-said " + (right ? "pkv-ok" : "pkv-no");
    said.textContent = (right ? data.words.right : q.wrong) + " " + q.explain;
  });
  box.append(check, said);
  root.append(box);
});
"""


def quiz_html(
    lang: str,
    title: str,
    intro: str,
    back: tuple[str, str],
    words: Mapping[str, str],
    questions: Sequence[Mapping[str, Any]],
) -> str:
    """The quiz page of one language. ``words``: ``check``, ``pick`` (nothing chosen yet),
    ``right``; each question: ``where``, ``href`` (its player, relative) and ``link`` (the link's
    words), ``prompt``, ``options``, ``answer`` (an index), ``wrong`` (the sentence
    naming the right answer) and ``explain``. All of it is data for the script, shown as text."""
    data = json_for_script({"words": dict(words), "questions": [dict(q) for q in questions]})
    return f"""<!doctype html>
<html lang="{html_lang(lang)}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{_CSP}
<title>{escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<p><a href="{escape(back[1])}">{escape(back[0])}</a></p>
<h1>{escape(title)}</h1>
<p>{escape(intro)}</p>
<div id="pkv-questions"></div>
<script type="application/json" id="pkv-quiz">{data}</script>
<script>{_QUIZ_JS}</script>
</body>
</html>
"""


def write_pack(out: str | Path, files: Mapping[str, str]) -> int:
    """Write ``files`` (relative path -> text) under ``out`` (checked: new or empty); returns the
    bytes written."""
    root = check_out_dir(out)
    total = 0
    for rel, text in files.items():
        path = root / _relative(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        path.write_bytes(data)
        total += len(data)
    return total


def zip_pack(files: Mapping[str, str], folder: str) -> bytes:
    """The pack as a zip holding one folder ``folder`` (the app's download)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, text in files.items():
            z.writestr(f"{folder}/{_relative(rel)}", text)
    return buf.getvalue()


def _relative(rel: str) -> str:
    """A path inside the pack: relative, no part going up (the pack's own names only)."""
    parts = rel.split("/")
    if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in rel:
        raise ValueError(f"not a path inside the pack: {rel!r}")
    return rel
