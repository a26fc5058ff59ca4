"""Hybrid (full attention + Mamba) KV cache groups against vLLM 0.34.0's own KVCacheManager
(bench/hybrid_vs_vllm.py): random traces through one scheduler loop on both sides, every step
compared (each group's block tables, the free queue, hits, blocks handed out, block copies, KV
events), with and without prefix_match_unit, lookahead and extra keys; and groups of different
block sizes (full attention with a sliding window or a second full-attention group). Needs
the scratch environment with the real vllm==0.34.0 (``bash scripts/vllm_env.sh``; ``VLLM_VENV``,
default /tmp/vllm034-venv); the figure over 200 traces a config is in docs/fidelity.md."""

import os
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import hybrid_vs_vllm  # noqa: E402

VENV = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_hybrid_mamba_groups_step_as_vllms_do():
    configs = hybrid_vs_vllm.HYBRID_CONFIGS
    res = hybrid_vs_vllm.differential(VENV, range(15), configs)
    assert res["identical"] == res["runs"] == 15 * len(configs), res["first_differences"]
    # the traces really hit, preempt and evict, hit inside blocks and copy tail blocks, and
    # store blocks with extra keys (else agreeing would prove little)
    assert res["prefix_hits"] > 50 and res["preemptions"] > 50 and res["evictions"] > 50
    assert res["partial_hits"] > 0 and res["block_copies"] > 5
    assert res["stored_with_extra_keys"] > 50


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_groups_of_different_block_sizes_step_as_vllms_do():
    """Two groups, one block twice the other's (full + sliding window either way round, two
    full-attention groups): hits align to the least common multiple, hashes are made every
    greatest common divisor, and every step's tables, hits, free queue and events match."""
    configs = list(hybrid_vs_vllm.GROUP_SIZE_CONFIGS)
    res = hybrid_vs_vllm.differential(VENV, range(15), configs)
    assert res["identical"] == res["runs"] == 15 * len(configs), res["first_differences"]
    assert res["prefix_hits"] > 50 and res["preemptions"] > 50 and res["evictions"] > 50
    assert res["unaligned_hits"] == 0
