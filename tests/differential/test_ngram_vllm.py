"""kvcore's n-gram proposer drafts what vLLM 0.34.0's ``NgramGPUSpeculator`` drafts.

Runs ``scripts/vllm_ngram_diff.py`` under the scratch vLLM environment (built by
``bash scripts/vllm_env.sh``; ``VLLM_VENV`` names another place): vLLM's own Triton kernels
(vllm/v1/worker/gpu/spec_decode/ngram/speculator.py), run on the CPU by Triton's interpreter,
and kvcore's ``NgramGPUSpeculator.propose`` draft for the same random token histories under random
``prompt_lookup_min``/``prompt_lookup_max``/``num_speculative_tokens``. Skipped, with the reason,
where that environment is absent. Importing vLLM takes a while, so it is in the slow set.
"""

import pytest

from support.lookahead_driver import drive

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vllm-ngram")]

# One interpreter for the comparison and for the two altered runs (importing vLLM is most of the
# cost): ours switched to 0.33.0's first occurrence, then ours without the padding drafts.
BOTH = (
    "import sys; sys.path.insert(0, 'scripts'); import vllm_ngram_diff as d\n"
    "sys.argv = ['x', '--groups', '12', '--seed', '1']\n"
    "same = d.main()\n"
    "print('=== switched off', flush=True)\n"
    "def first(h, min_n, max_n, k, max_model_len):\n"
    "    k = min(k, max_model_len - len(h))\n"
    "    for n in range(min(max_n, len(h) - 1), min_n - 1, -1):\n"
    "        for pos in range(len(h) - n):\n"
    "            if h[pos : pos + n] == h[len(h) - n :]:\n"
    "                drafts = h[pos + n : pos + n + k]\n"
    "                return drafts + [h[-1]] * (k - len(drafts))\n"
    "    return [h[-1]] * k\n"
    "d.ours = first\n"
    "sys.argv = ['x', '--groups', '3']\n"
    "print('first occurrence: exit', d.main())\n"
    "def unpadded(h, min_n, max_n, k, max_model_len):\n"
    "    n, pos = d.NgramGPUSpeculator(min_n, max_n, k, max_model_len).find_match(h)\n"
    "    return h[pos + n : pos + n + min(k, max_model_len - len(h))] if n else []\n"
    "d.ours = unpadded\n"
    "print('no padding: exit', d.main())\n"
    "sys.exit(same)\n"
)


@pytest.fixture(scope="module")
def driven():
    """(exit status, the comparison's output, the altered runs' output)."""
    return drive(BOTH)


def test_same_drafts_as_vllms_ngram_speculator(driven):
    code, out, rest = driven
    assert code == 0, out + "\n" + rest
    assert out.splitlines()[-1].startswith("SAME: 480 random histories"), out


def test_the_driver_tells_each_0_33_rule_apart(driven):
    """With ours switched to 0.33.0's first occurrence, or to 0.33.0's unpadded drafts, the
    comparison must fail: it can see both differences."""
    _, _, off = driven
    assert "first occurrence: exit 1" in off and "no padding: exit 1" in off, off
