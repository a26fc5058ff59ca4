"""Our Scheduler makes vLLM 0.34.0's own allocations with ``num_lookahead_tokens > 0``.

Runs ``scripts/vllm_lookahead_diff.py`` under the scratch vLLM environment (built by
``bash scripts/vllm_env.sh``; ``VLLM_VENV`` names another place): random traces with drafts
accepted and rejected, prefix hits and preemption, compared step by step with vLLM's Scheduler
(scheduled tokens and drafts, preempted requests, every block table, free blocks,
num_computed_tokens). Skipped, with the reason, where that environment is absent. Importing vLLM
takes a while, so it is in the slow set.
"""

import pytest

from support.lookahead_driver import drive

# one worker runs both tests, so the module fixture runs once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-lookahead")]


# One interpreter for both checks (importing vLLM is most of their cost): the comparison on 25
# traces, then the same driver with our lookahead switched off, which must see a difference.
BOTH = (
    "import sys; sys.path.insert(0, 'scripts'); import vllm_lookahead_diff as d\n"
    "sys.argv = ['x', '--traces', '25', '--seed', '3']\n"
    "same = d.main()\n"
    "print('=== switched off', flush=True)\n"
    "orig = d.our_scheduler\n"
    "def ours(t):\n"
    "    s = orig(t); s.config.num_lookahead_tokens = 0; return s\n"
    "d.our_scheduler = ours\n"
    "sys.argv = ['x', '--traces', '5']\n"
    "print('exit', d.main())\n"
    "sys.exit(same)\n"
)


@pytest.fixture(scope="module")
def driven():
    """(exit status, the comparison's output, the switched-off run's output)."""
    return drive(BOTH)


def test_same_allocations_as_vllms_scheduler_with_lookahead_slots(driven):
    code, out, rest = driven
    assert code == 0, out + "\n" + rest
    assert out.splitlines()[-1].startswith("SAME: 25 random traces"), out


def test_the_driver_tells_a_difference(driven):
    """With our lookahead switched off the comparison must fail: it can see a difference."""
    _, _, off = driven
    assert "exit 1" in off and " vs ours " in off, off
