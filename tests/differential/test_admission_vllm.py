"""Our cache-aware admission makes vLLM 0.34.0's own decisions.

Runs ``scripts/vllm_lookahead_diff.py --cache-aware`` under the scratch vLLM environment (built
by ``bash scripts/vllm_env.sh``; ``VLLM_VENV`` names another place): random traces of warm and
cold requests queued together, each with ``cache_aware_admission_window`` (0, 1, 2, 3 or 8) and
``cache_aware_admission_threshold`` (0 to 1) drawn, compared step by step with vLLM's Scheduler
(scheduled tokens and drafts, preempted requests, every block table, free blocks,
num_computed_tokens). Skipped, with the reason, where that environment is absent. Importing vLLM
takes a while, so it is in the slow set.
"""

import re

import pytest

from support.lookahead_driver import drive

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-admission")]

# One interpreter for both checks: the comparison on 40 traces, then the same driver with our
# window switched off, which must see a difference.
BOTH = (
    "import sys; sys.path.insert(0, 'scripts'); import vllm_lookahead_diff as d\n"
    "sys.argv = ['x', '--traces', '40', '--seed', '34', '--cache-aware']\n"
    "same = d.main()\n"
    "print('=== switched off', flush=True)\n"
    "orig = d.our_scheduler\n"
    "def ours(t):\n"
    "    s = orig(t); s.cache_aware_window = 0; return s\n"
    "d.our_scheduler = ours\n"
    "sys.argv = ['x', '--traces', '40', '--seed', '34', '--cache-aware']\n"
    "print('exit', d.main())\n"
    "sys.exit(same)\n"
)


@pytest.fixture(scope="module")
def driven():
    """(exit status, the comparison's output, the switched-off run's output)."""
    return drive(BOTH)


def test_same_admissions_as_vllms_scheduler_with_the_window_on_and_off(driven):
    code, out, rest = driven
    assert code == 0, out + "\n" + rest
    last = out.splitlines()[-1]
    assert last.startswith("SAME: 40 random traces") and "vLLM 0.34.0" in last, out
    reordered, below = map(
        int, re.search(r"(\d+) steps where the window reordered.*?(\d+) where", last).groups()
    )
    # the traces really reorder, and really sit below the threshold at times
    assert reordered >= 5 and below >= 5, last


def test_the_driver_tells_a_difference(driven):
    """With our window switched off the comparison must fail: it can see a difference."""
    _, _, off = driven
    assert "exit 1" in off and " vs ours " in off, off
