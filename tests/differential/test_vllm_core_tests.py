"""vLLM 0.34.0's own tests/v1/core against kvcore (scripts/vllm_core_tests.py, issues 36 and 44):
no test may fail because kvcore's block layer behaves differently (the documented number is 0),
no more may fail under kvcore's own Scheduler than documented (the goal is 0), and at least the
documented numbers must pass with kvcore's code running in them (docs/fidelity.md, "vLLM's own
tests as the yardstick").

Slow (a pytest run of about 650 tests under vLLM's interpreter and one of test_scheduler.py's
234 with kvcore's own Scheduler, one more where vLLM alone's outcomes are not yet cached) and
skipped, with the reason, without vLLM 0.34.0's scratch environment (``bash
scripts/vllm_env.sh``; VLLM_VENV, default /tmp/vllm034-venv) or without vLLM 0.34.0's sdist in
VLLM_SDIST_CACHE (default /tmp/vllm-sdist-cache; the script downloads it there on its first
run)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

REPO = ROOT
VENV = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")
CACHE = Path(os.environ.get("VLLM_SDIST_CACHE", "/tmp/vllm-sdist-cache"))
# docs/fidelity.md: passed with kvcore's code running, on the three files of issue 36, and the
# behaviour differences (a ratchet: it may never rise above 0 again)
DOCUMENTED_PASSED = 353
DOCUMENTED_DIFFERS = 0
# the second mode (kvcore's own Scheduler under test_scheduler.py): passed with kvcore's Scheduler
# running, and the behaviour differences still open (the same ratchet, goal 0)
DOCUMENTED_SCHEDULER_PASSED = 75
DOCUMENTED_SCHEDULER_DIFFERS = 0

# early: the longest single test of the suite, handed out first (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.early]


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
@pytest.mark.skipif(
    not (CACHE / "vllm-0.34.0.tar.gz").exists(),
    reason=f"no vLLM 0.34.0 sdist in {CACHE} (scripts/vllm_core_tests.py downloads it)",
)
def test_vllm_core_tests_find_no_behaviour_difference(tmp_path):
    out = tmp_path / "table.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "vllm_core_tests.py"), "--json", str(out)],
        env={**os.environ, "VLLM_VENV": VENV},
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    table = json.loads(out.read_text())
    assert table["counts"]["behaviour_differs"] <= DOCUMENTED_DIFFERS, table["differs"]
    assert table["counts"]["passed_kvcore"] >= DOCUMENTED_PASSED
    sched = table["scheduler"]
    assert sched["counts"]["behaviour_differs"] <= DOCUMENTED_SCHEDULER_DIFFERS, sched["differs"]
    assert sched["counts"]["passed_kvcore"] >= DOCUMENTED_SCHEDULER_PASSED
