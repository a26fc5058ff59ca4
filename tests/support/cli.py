"""``python -m paged_kv_lab`` for tests, in this process or in a new one.

In this process the command skips the interpreter's start and torch's import (about 5 s of CPU a
run on this machine against 2 s for the run itself); one test per command family keeps a real
process, so the module entry point and the exit codes the shell sees stay covered."""

import contextlib
import io
import subprocess
import sys

from support.paths import ROOT


def run_cli(*args, timeout=600) -> subprocess.CompletedProcess:
    """The command in a new process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "paged_kv_lab", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli_here(*args) -> subprocess.CompletedProcess:
    """The same command through ``main`` in this process: its exit code (argparse's
    ``SystemExit`` included), stdout and stderr, in the shape ``run_cli`` returns."""
    from paged_kv_lab.cli.main import main

    argv = list(map(str, args))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    return subprocess.CompletedProcess(
        ["python", "-m", "paged_kv_lab", *argv], code, out.getvalue(), err.getvalue()
    )
