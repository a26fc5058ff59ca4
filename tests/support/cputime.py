"""CPU seconds per test, for finding where the suite's time goes on a shared machine (wall times
there depend on the other jobs; CPU seconds much less). Opt-in, as a plugin:

    .venv/bin/python -m pytest -p support.cputime -n 0 tests/app -m "not slow"

prints the tests that took the most CPU (this process's and its reaped children's: a server or
CLI process started by a fixture counts when it exits, often at its fixture's teardown) and the
total per module. ``PAGED_KV_LAB_CPU_LOG=path`` appends one JSON line per test: its id and, per
phase, [own CPU s, children's CPU s, wall s]. Under xdist each worker reports its own tests.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import Counter

import pytest

ROWS: dict[str, dict] = {}
TOP = 15


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _timed(item, phase: str):
    own0, kids0 = _cpu()
    t0 = time.perf_counter()
    yield
    own1, kids1 = _cpu()
    row = ROWS.setdefault(item.nodeid, {"id": item.nodeid})
    row[phase] = [
        round(own1 - own0, 2),
        round(kids1 - kids0, 2),
        round(time.perf_counter() - t0, 2),
    ]


def _total(row: dict) -> float:
    return sum(v[0] + v[1] for k, v in row.items() if k != "id")


def _phase(item, phase: str):
    """The body of the three hook wrappers below: the phase timed around pytest's own."""
    timer = _timed(item, phase)
    next(timer)
    try:
        return (yield)
    finally:
        next(timer, None)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _phase(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _phase(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _phase(item, "teardown"))


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    path = os.environ.get("PAGED_KV_LAB_CPU_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            for row in ROWS.values():
                fh.write(json.dumps(row) + "\n")
    own, kids = _cpu()
    tr = terminalreporter
    tr.section("CPU seconds (own + children's)")
    tr.write_line(
        f"tests {sum(map(_total, ROWS.values())):.1f} s; this process {own:.1f} s, "
        f"its reaped children {kids:.1f} s"
    )
    for row in sorted(ROWS.values(), key=_total, reverse=True)[:TOP]:
        tr.write_line(f"{_total(row):7.1f}  {row['id']}")
    modules: Counter = Counter()
    for row in ROWS.values():
        modules[row["id"].split("::")[0]] += _total(row)
    tr.write_line("by module:")
    for module, total in modules.most_common(TOP):
        tr.write_line(f"{total:7.1f}  {module}")
