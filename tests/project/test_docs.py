"""The docs stay true: README.md and docs/ link to each other correctly, every page is in the
site's nav, the README stays a landing page, and docs/layout.md's kvcore table matches the code.

The kvcore table is generated from the code; after moving or adding a kvcore file, regenerate it:

    .venv/bin/python tests/project/test_docs.py --print-layout    # print the table
    .venv/bin/python tests/project/test_docs.py --write-layout    # rewrite it inside docs/layout.md

No mkdocs build here (``make docs`` does that, with ``--strict``): these checks read text only.
"""

from __future__ import annotations

import ast
import re
import sys
import unicodedata
from pathlib import Path

if __name__ == "__main__":  # run as a script (--write-layout): tests/ on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.paths import FIXTURES, ROOT  # noqa: E402

DOCS = ROOT / "docs"
LAYOUT_PAGE = DOCS / "layout.md"
VLLM_FILES = FIXTURES / "vllm_034_files.txt"
README_MAX_LINES = 250

TABLE_START = (
    "<!-- kvcore-table:start (generated: python tests/project/test_docs.py --write-layout) -->"
)
TABLE_END = "<!-- kvcore-table:end -->"
REGENERATE = "regenerate it with: .venv/bin/python tests/project/test_docs.py --write-layout"

# kvcore files with no vLLM counterpart (a folder ends with "/"). Every other kvcore file must sit
# at the path vLLM 0.34.0 uses for it.
OURS = (
    "kvcore/__init__.py",
    "kvcore/__main__.py",
    "kvcore/model/",  # loading SmolLM2 / the tiny model, memory profiling
    "kvcore/worker/paged_attention.py",  # our attention kernel over the paged pool
    # the draft model's forward (vLLM's proposer runs its own model; kvcore's torch stays here)
    "kvcore/worker/draft_model_runner.py",
    # the EAGLE-style head's passes (vLLM's EagleSpeculator runs its head itself; torch stays here)
    "kvcore/worker/eagle_head_runner.py",
    # the observer interface the lab records through (vLLM's precedent, its metrics collector,
    # is a concrete class in v1/core/kv_cache_metrics.py)
    "kvcore/core/kv_cache_observer.py",
    # the read-only view the lab reads state through (vLLM's readers are its own tests)
    "kvcore/core/kv_cache_inspect.py",
)
OURS_TEXT = "ours: no vLLM counterpart"

# Top-level folders of this repository: a path in the docs that starts with one of them must exist.
REPO_DIRS = (
    "kvcore",
    "paged_kv_lab",
    "bench",
    "tests",
    "scripts",
    "docs",
    ".streamlit",
    ".ci",
)


# --------------------------------------------------------------------------- the kvcore table


def vllm_path(rel: str) -> str:
    """kvcore/<path>.py -> the vLLM file at the same place, by the layout's rule."""
    path = rel.removeprefix("kvcore/")
    if path.startswith(("distributed/", "utils/", "config/", "lora/", "multimodal/", "platforms/")):
        return "vllm/" + path
    return "vllm/v1/" + path


def is_ours(rel: str) -> bool:
    return any(rel == o or (o.endswith("/") and rel.startswith(o)) for o in OURS)


def public_names(path: Path) -> list[str]:
    """Top-level public classes and functions, in the order the file defines them."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [n.name for n in tree.body if isinstance(n, kinds) and not n.name.startswith("_")]


def kvcore_rows() -> list[tuple[str, str, list[str]]]:
    """(our file, the vLLM file it mirrors or OURS_TEXT, its public names), one per kvcore file.

    A package's ``__init__.py`` is listed only when it defines something public.
    """
    rows = []
    for path in sorted((ROOT / "kvcore").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        names = public_names(path)
        if path.name == "__init__.py" and not names:
            continue
        rows.append((rel, OURS_TEXT if is_ours(rel) else vllm_path(rel), names))
    return rows


def layout_table() -> str:
    lines = [
        "| our file | vLLM 0.34.0 file it mirrors | main classes and functions |",
        "|---|---|---|",
    ]
    for rel, vllm, names in kvcore_rows():
        mirror = vllm if vllm == OURS_TEXT else f"`{vllm}`"
        listed = ", ".join(f"`{n}`" for n in names) or "—"
        lines.append(f"| `{rel}` | {mirror} | {listed} |")
    return "\n".join(lines)


def table_in_page(text: str) -> str:
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    assert start >= 0 and end > start, f"docs/layout.md lost its table markers; {REGENERATE}"
    return text[start + len(TABLE_START) : end].strip()


def write_layout() -> None:
    text = LAYOUT_PAGE.read_text(encoding="utf-8")
    table_in_page(text)  # the markers are there
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    new = f"{head}{TABLE_START}\n{layout_table()}\n{TABLE_END}{tail}"
    LAYOUT_PAGE.write_text(new, encoding="utf-8")


def known_vllm_files(listing: Path = VLLM_FILES) -> set[str]:
    lines = listing.read_text(encoding="utf-8").splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


# --------------------------------------------------------------------------- markdown reading

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


def strip_code(text: str) -> str:
    """The text without fenced blocks and inline code (links in them are not links)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub(" ", text)


def code_text(text: str) -> str:
    """Only what is in fenced blocks and inline code: where paths are written."""
    parts = [m.group(0) for m in FENCE.finditer(text)]
    parts += [m.group(2) for m in INLINE_CODE.finditer(FENCE.sub("", text))]
    return "\n".join(parts)


def heading_texts(text: str) -> list[str]:
    out = []
    for m in HEADING.finditer(FENCE.sub("", text)):
        h = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))  # a link: keep its text
        out.append(h.replace("`", "").replace("*", ""))
    return out


def slug_mkdocs(heading: str) -> str:
    """Python-Markdown's toc slug (what mkdocs gives a heading's id)."""
    value = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def slug_github(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors that work both on GitHub and in the mkdocs site."""
    heads = heading_texts(path.read_text(encoding="utf-8"))
    return {slug_mkdocs(h) for h in heads} & {slug_github(h) for h in heads}


def markdown_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted(DOCS.rglob("*.md"))


def broken_links(path: Path) -> list[str]:
    problems = []
    text = strip_code(path.read_text(encoding="utf-8"))
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            continue
        where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor:
            if dest.suffix != ".md":
                problems.append(f"{where}: an anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                problems.append(f"{where}: no heading with this anchor in {dest.name}")
    return problems


def nav_pages(nav) -> list[str]:
    """Every .md file named anywhere in mkdocs.yml's nav."""
    if isinstance(nav, str):
        return [nav] if nav.endswith(".md") else []
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


# --------------------------------------------------------------------------- the tests


def test_readme_is_a_landing_page():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/"
    )


def test_readme_commands_are_makefile_targets():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))
    named = set(re.findall(r"^make ([\w-]+)", code_text(readme), re.MULTILINE))
    assert {"run", "test"} <= named, "the README must show `make run` and `make test`"
    assert named <= targets, f"README names make targets the Makefile lacks: {named - targets}"


def test_links_between_readme_and_docs_resolve():
    problems = [p for path in markdown_files() for p in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_paths_named_in_the_docs_exist():
    """A repository path written in code (`run/trace_file.py`, `ui/view.py: name`) must exist,
    and a name after it must be defined in that file."""
    dirs = "|".join(re.escape(d) for d in REPO_DIRS)
    pattern = re.compile(rf"(?<![\w./~-])((?:{dirs})/[\w./-]*)(?::\s+(\w+))?")
    problems = []
    for path in markdown_files():
        code = code_text(path.read_text(encoding="utf-8"))
        for m in pattern.finditer(code):
            if code[m.end(1) : m.end(1) + 1] in ("*", "<", "{"):  # a pattern, not a path
                continue
            rel, name = m.group(1).rstrip("."), m.group(2)
            target = ROOT / rel
            where = f"{path.relative_to(ROOT)}: {rel}"
            if not target.exists():
                problems.append(f"{where}: no such file or folder")
            elif name and target.suffix == ".py":
                src = target.read_text(encoding="utf-8")
                if not re.search(
                    rf"^\s*(?:async\s+def|def|class)\s+{name}\b|^{name}\s*[:=]", src, re.MULTILINE
                ):
                    problems.append(f"{where}: {name} is not defined there")
    assert not problems, "paths in the docs that do not exist:\n" + "\n".join(sorted(set(problems)))


def test_every_docs_page_is_in_the_nav():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    in_nav = nav_pages(config.get("nav", []))
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(set(in_nav)) == pages, (
        f"not in mkdocs.yml's nav: {sorted(set(pages) - set(in_nav))}; "
        f"in the nav but missing: {sorted(set(in_nav) - set(pages))}"
    )
    assert len(in_nav) == len(set(in_nav)), "a page is in the nav twice"


def test_layout_table_matches_the_code():
    shown = table_in_page(LAYOUT_PAGE.read_text(encoding="utf-8"))
    expected = layout_table()
    if shown != expected:
        shown_rows, expected_rows = set(shown.splitlines()), set(expected.splitlines())
        diff = [f"- {r}" for r in sorted(shown_rows - expected_rows)] + [
            f"+ {r}" for r in sorted(expected_rows - shown_rows)
        ]
        raise AssertionError(
            "docs/layout.md's kvcore table differs from the code "
            f"({REGENERATE}):\n" + "\n".join(diff)
        )


def test_kvcore_files_sit_at_real_vllm_paths():
    known = known_vllm_files()
    wrong = [
        f"{rel} -> {vllm}"
        for rel, vllm, _ in kvcore_rows()
        if vllm != OURS_TEXT and vllm not in known
    ]
    assert not wrong, (
        "these kvcore files name no vLLM 0.34.0 file (tests/fixtures/vllm_034_files.txt); move "
        "each to vLLM's path, or list it in OURS in tests/project/test_docs.py:\n"
        + "\n".join(wrong)
    )


def test_slugs_follow_mkdocs_and_github():
    assert slug_mkdocs("Where num_gpu_blocks comes from") == "where-num_gpu_blocks-comes-from"
    assert slug_github("Asking why?") == slug_mkdocs("Asking why?") == "asking-why"
    assert slug_mkdocs("a -m b") == "a-m-b" and slug_github("a -m b") == "a--m-b"
    assert slug_github("中文 words") == "中文-words" and slug_mkdocs("中文 words") == "words"


if __name__ == "__main__":
    if sys.argv[1:] == ["--print-layout"]:
        print(layout_table())
    elif sys.argv[1:] == ["--write-layout"]:
        write_layout()
        print(f"wrote the kvcore table into {LAYOUT_PAGE.relative_to(ROOT)}")
    else:
        sys.exit(__doc__)
