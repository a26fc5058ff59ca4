"""One run of scripts/vllm_lookahead_diff.py under the scratch vLLM environment (``VLLM_VENV``,
default /tmp/vllm034-venv), for the tests that compare our Scheduler with vLLM's through it."""

import os
import subprocess
from pathlib import Path

import pytest

from support.paths import ROOT

VENV = Path(os.environ.get("VLLM_VENV", "/tmp/vllm034-venv"))
PYTHON = VENV / "bin" / "python"


def drive(script: str) -> tuple[int, str, str]:
    """Run ``script`` (Python source that prints the comparison, then "=== switched off" and
    the run with our side altered) in that environment: (exit status, the comparison's output,
    the altered run's output with the stderr tail). Skips, with the reason, without vLLM."""
    if not PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VENV} (build it: bash scripts/vllm_env.sh)")
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    if subprocess.run([str(PYTHON), "-c", probe], timeout=60).returncode != 0:
        pytest.skip(f"no vLLM package in {VENV} (build it: bash scripts/vllm_env.sh)")
    done = subprocess.run(
        [str(PYTHON), "-c", script], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    same, _, off = done.stdout.partition("=== switched off")
    return done.returncode, same.strip(), off.strip() + "\n" + done.stderr[-2000:]
