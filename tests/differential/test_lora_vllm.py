"""Our Scheduler admits requests with LoRA adapters as vLLM 0.34.0's own does (``max_loras``).

Runs ``scripts/vllm_lookahead_diff.py --lora`` under the scratch vLLM environment (built by
``bash scripts/vllm_env.sh``; ``VLLM_VENV`` names another place): random traces whose requests
carry one of three adapters or none, ``max_loras`` 1 or 2, compared step by step with vLLM's
Scheduler (scheduled tokens, preempted requests, every block table, free blocks). Skipped, with
the reason, where that environment is absent. Importing vLLM takes a while: the slow set.
"""

import pytest

from support.lookahead_driver import drive

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-lora")]

# One interpreter for both checks: the comparison on 25 traces, then the same driver with our
# scheduler's LoRA config dropped (no max_loras check), which must see a difference.
BOTH = (
    "import sys; sys.path.insert(0, 'scripts'); import vllm_lookahead_diff as d\n"
    "sys.argv = ['x', '--traces', '25', '--seed', '3', '--lora']\n"
    "same = d.main()\n"
    "print('=== switched off', flush=True)\n"
    "orig = d.our_scheduler\n"
    "def ours(t):\n"
    "    s = orig(t); s.lora_config = None; return s\n"
    "d.our_scheduler = ours\n"
    "sys.argv = ['x', '--traces', '10', '--lora']\n"
    "print('exit', d.main())\n"
    "sys.exit(same)\n"
)


@pytest.fixture(scope="module")
def driven():
    """(exit status, the comparison's output, the switched-off run's output)."""
    return drive(BOTH)


def test_same_admissions_as_vllms_scheduler_with_lora_adapters(driven):
    code, out, rest = driven
    assert code == 0, out + "\n" + rest
    last = out.splitlines()[-1]
    assert last.startswith("SAME: 25 random traces") and "with LoRA adapters" in last, out


def test_the_driver_tells_a_difference(driven):
    """Without our max_loras check the comparison must fail: it can see a difference."""
    _, _, off = driven
    assert "exit 1" in off and " vs ours " in off, off
