"""Our Scheduler makes vLLM 0.33.0's own allocations with ``num_lookahead_tokens > 0``.

Runs ``scripts/vllm_lookahead_diff.py`` under the scratch vLLM environment (built by
``bash scripts/vllm_env.sh``; ``VLLM_VENV`` names another place): random traces with drafts
accepted and rejected, prefix hits and preemption, compared step by step with vLLM's Scheduler
(scheduled tokens and drafts, preempted requests, every block table, free blocks,
num_computed_tokens). Skipped, with the reason, where that environment is absent. Importing vLLM
takes a while, so it is in the slow set.
"""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("VLLM_VENV", "/tmp/vllm-venv"))
PYTHON = VENV / "bin" / "python"

pytestmark = pytest.mark.slow


def vllm_python() -> str:
    if not PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VENV} (build it: bash scripts/vllm_env.sh)")
    probe = subprocess.run(
        [str(PYTHON), "-c", "import vllm.v1.core.sched.scheduler"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"vLLM's Scheduler does not import in {VENV}: {last}")
    return str(PYTHON)


def test_same_allocations_as_vllms_scheduler_with_lookahead_slots():
    python = vllm_python()
    done = subprocess.run(
        [python, str(ROOT / "scripts" / "vllm_lookahead_diff.py"), "--traces", "25", "--seed", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = done.stdout.strip()
    assert done.returncode == 0, out + "\n" + done.stderr[-2000:]
    assert out.splitlines()[-1].startswith("SAME: 25 random traces"), out


def test_the_driver_tells_a_difference():
    """With our lookahead switched off the comparison must fail: it can see a difference."""
    python = vllm_python()
    code = (
        "import sys; sys.path.insert(0, 'scripts'); import vllm_lookahead_diff as d\n"
        "orig = d.our_scheduler\n"
        "def ours(t):\n"
        "    s = orig(t); s.config.num_lookahead_tokens = 0; return s\n"
        "d.our_scheduler = ours\n"
        "sys.argv = ['x', '--traces', '5']\n"
        "sys.exit(d.main())\n"
    )
    done = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert done.returncode == 1 and " vs ours " in done.stdout, done.stdout + done.stderr[-1000:]
