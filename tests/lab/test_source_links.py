"""The code behind each decision (why.source_links): every vLLM permalink points into a file of
the v0.34.0 tag within its recorded length, every kvcore link is a real function, every event
kind has a chain, and a step's calls come out in call order.

Where vLLM 0.34.0 is installed (``VLLM_VENV``, default /tmp/vllm034-venv, made by
scripts/vllm_env.sh; the wheel's files are the tag's), each range is derived again from its file
with ``ast`` and must be the named function's, from its first decorator to its last line, and
each file's recorded length its real one; without it those checks skip and say why."""

from __future__ import annotations

import ast
import inspect
import os
import re
from pathlib import Path
from typing import Optional

import pytest

from paged_kv_lab.recording import events as E
from paged_kv_lab.why.source_links import (
    FUNCTIONS,
    SIZING_LINKS,
    VLLM_FILE_LINES,
    VLLM_TAG,
    call_order,
    decision_link,
    event_calls,
)
from support.event_runs import every_kind_events, every_kind_runs

PERMALINK = re.compile(
    r"^https://github\.com/vllm-project/vllm/blob/v0\.34\.0/(vllm/[\w/]+\.py)#L(\d+)-L(\d+)$"
)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_vllm_permalinks_lie_in_the_tag_files(name):
    link = FUNCTIONS[name].vllm
    assert VLLM_TAG == "v0.34.0"
    m = PERMALINK.match(link.url)
    assert m, link.url
    path, start, end = m.group(1), int(m.group(2)), int(m.group(3))
    assert path == link.path and path in VLLM_FILE_LINES
    assert 1 <= start < end <= VLLM_FILE_LINES[path]
    # the vLLM function and ours carry the same method name (the house rule: vLLM's names)
    assert (
        link.qualname.split(".")[-1] == FUNCTIONS[name].ours.qualname.split(".")[-1]
        or name == "sample"
    )


def test_every_recorded_file_is_linked():
    linked = {f.vllm.path for f in FUNCTIONS.values()} | {v.path for v in SIZING_LINKS.values()}
    assert set(VLLM_FILE_LINES) == linked
    for link in SIZING_LINKS.values():
        assert 1 <= link.start < link.end <= VLLM_FILE_LINES[link.path]


# -- against vLLM 0.34.0's own source, where it is installed ---------------------------------------
def vllm_site() -> tuple[Optional[Path], str]:
    """(the site-packages folder holding vLLM at ``VLLM_TAG``, why it is missing)."""
    venv = Path(os.environ.get("VLLM_VENV", "/tmp/vllm034-venv"))
    version = VLLM_TAG.removeprefix("v")
    for site in sorted(venv.glob("lib/python3*/site-packages")):
        if (site / f"vllm-{version}.dist-info").is_dir() and (site / "vllm").is_dir():
            return site, ""
    return None, f"no vLLM {version} in {venv} (`bash scripts/vllm_env.sh`, or set VLLM_VENV)"


def function_lines(text: str, qualname: str) -> Optional[tuple[int, int]]:
    """(first line, last line) of ``qualname`` (``Class.method`` or a module-level function)
    in the module ``text``: from its first decorator, else its ``def``, to its last line."""
    body, node = ast.parse(text).body, None
    for part in qualname.split("."):
        named = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        node = next((n for n in body if isinstance(n, named) and n.name == part), None)
        if node is None:
            return None
        body = node.body
    return min([d.lineno for d in node.decorator_list] + [node.lineno]), node.end_lineno


def test_function_lines_start_at_the_first_decorator():
    text = "class A:\n    @property\n    @staticmethod\n    def f():\n        pass\n"
    assert function_lines(text, "A.f") == (2, 5)
    assert function_lines(text, "A.g") is None and function_lines(text, "f") is None


def test_each_range_is_its_function_in_vllms_own_source():
    site, why = vllm_site()
    if site is None:
        pytest.skip(why)
    lengths = {p: len((site / p).read_text(encoding="utf-8").splitlines()) for p in VLLM_FILE_LINES}
    assert lengths == VLLM_FILE_LINES
    wrong = []
    links = {**{n: f.vllm for n, f in FUNCTIONS.items()}, **SIZING_LINKS}
    for name, v in sorted(links.items()):
        found = function_lines((site / v.path).read_text(encoding="utf-8"), v.qualname)
        if found != (v.start, v.end):
            wrong.append((name, v.path, v.qualname, found))
    assert not wrong, f"(name, path, qualname, its lines at {VLLM_TAG}): {wrong}"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_kvcore_links_resolve_to_real_functions(name):
    ours = FUNCTIONS[name].ours
    fn = ours.resolve()
    assert inspect.isfunction(fn)
    assert fn.__qualname__ == ours.qualname and fn.__module__ == ours.module
    assert f"def {fn.__name__}(" in ours.source()


def test_every_event_kind_has_a_decision_link():
    seen = set()
    for ev in every_kind_events():
        chain = event_calls(ev, 2)
        assert chain and all(n in FUNCTIONS for n in chain)
        assert decision_link(ev, 2) is FUNCTIONS[chain[-1]]
        seen.add(ev.kind)
    assert seen == set(E.EVENT_KINDS)


def test_a_steps_calls_come_in_call_order():
    recs = dict(every_kind_runs())["preemption"]
    step = next(r for r in recs if any(e.kind == E.ALLOCATED for e in r.events))
    calls = call_order(step.events)
    names = [c.link.name for c in calls]
    assert (
        names.index("schedule")
        < names.index("get_computed_blocks")
        < names.index("allocate_slots")
        < names.index("get_new_blocks")
    )
    depth = {c.link.name: c.depth for c in calls}
    assert (depth["schedule"], depth["allocate_slots"], depth["get_new_blocks"]) == (0, 1, 3)
