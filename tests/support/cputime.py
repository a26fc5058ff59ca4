"""CPU seconds per test, for finding where the suite's time goes on a shared machine (wall times
there depend on the other jobs; CPU seconds much less). Opt-in, as a plugin:

    .venv/bin/python -m pytest -p support.cputime -n 0 tests/app -m "not slow"

prints the tests that took the most CPU (this process's and its reaped children's: a server or
CLI process started by a fixture counts when it exits, often at its fixture's teardown) and the
total per module. ``PAGED_KV_LAB_CPU_LOG=path`` appends one JSON line per test: its id, its worker,
the wall-clock time its setup started and its teardown ended, and per phase [own CPU s,
children's CPU s, wall s]. Under xdist each worker reports its own tests. What the workers did
over the run (how long all of them were in a test, how long only one was, and which test that
was: a test marked ``alone`` or the others draining before it):

    PAGED_KV_LAB_CPU_LOG=/tmp/cpu.jsonl .venv/bin/python -m pytest -p support.cputime -n 4 ...
    .venv/bin/python tests/support/cputime.py /tmp/cpu.jsonl
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
    row = ROWS.setdefault(
        item.nodeid, {"id": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    )
    if phase == "setup":
        row["start"] = time.time()
    yield
    own1, kids1 = _cpu()
    if phase == "teardown":
        row["end"] = time.time()
    row[phase] = [
        round(own1 - own0, 2),
        round(kids1 - kids0, 2),
        round(time.perf_counter() - t0, 2),
    ]


def _total(row: dict) -> float:
    return sum(v[0] + v[1] for k, v in row.items() if k in ("setup", "call", "teardown"))


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


def timeline(rows: list[dict], least: float = 3.0) -> str:
    """From a log's rows: the seconds of the run during which 0, 1, 2, ... workers were in a test,
    then each stretch of at least ``least`` seconds when only one was, with that test."""
    rows = [r for r in rows if "start" in r and "end" in r]
    t0, t1 = min(r["start"] for r in rows), max(r["end"] for r in rows)
    edges = sorted({t for r in rows for t in (r["start"], r["end"])})
    busy: Counter = Counter()
    lines, alone_since, alone_id = [], None, None
    for a, b in zip(edges, edges[1:]):
        mid = (a + b) / 2
        inside = [r for r in rows if r["start"] <= mid < r["end"]]
        busy[len(inside)] += b - a
        one = inside[0]["id"] if len(inside) == 1 else None
        if one != alone_id:
            if alone_id is not None and a - alone_since >= least:
                lines.append(f"{alone_since - t0:7.0f} s  {a - alone_since:5.0f} s  {alone_id}")
            alone_since, alone_id = a, one
    head = [f"the run's {t1 - t0:.0f} s, by how many workers were in a test:"]
    head += [f"  {n}: {s:.0f} s" for n, s in sorted(busy.items())]
    return "\n".join(head + ["stretches with one worker in a test (from, for, the test):"] + lines)


if __name__ == "__main__":
    import sys

    with open(sys.argv[1], encoding="utf-8") as fh:
        print(timeline([json.loads(line) for line in fh if line.strip()]))
