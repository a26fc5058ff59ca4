"""The EAGLE/MTP block drop against vLLM 0.34.0's own KVCacheManager (bench/eagle_vs_vllm.py):
random traces through one scheduler loop on both sides, every step compared (each admission's
hit and its blocks per group, the blocks handed out, the block tables, the free queue, the KV
events), on full attention, a sliding window and both together, with and without the drop.
Needs a scratch environment with the real vllm==0.34.0 (``VLLM_VENV``, default
/tmp/vllm034-venv); skipped without one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import eagle_vs_vllm  # noqa: E402

VENV = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")


def vllm_version() -> str:
    python = Path(VENV) / "bin" / "python"
    if not python.exists():
        return ""
    done = subprocess.run(
        [str(python), "-I", "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


@pytest.mark.skipif(
    vllm_version() != eagle_vs_vllm.VLLM_VERSION,
    reason=f"no vLLM {eagle_vs_vllm.VLLM_VERSION} scratch environment at {VENV} (VLLM_VENV)",
)
def test_hits_drop_where_vllms_manager_drops():
    configs = list(eagle_vs_vllm.CONFIGS)
    seeds = range(1000, 1025)  # not the seeds the bench's default runs use
    res = eagle_vs_vllm.differential(VENV, seeds, configs)
    assert res["vllm"] == eagle_vs_vllm.VLLM_VERSION
    assert res["identical"] == res["runs"] == len(seeds) * len(configs), json.dumps(
        res["first_differences"], indent=1
    )[:4000]
    # the traces really hit, preempt and evict (else agreeing would prove little), and the drop
    # really costs hits: fewer hit tokens with it than without, on the same traces
    assert res["prefix_hits"] > 100 and res["preemptions"] > 10 and res["evictions"] > 200
    per = res["configs"]
    assert per["full"]["hit_tokens"] < per["full-plain"]["hit_tokens"]
    assert per["hybrid-sparse"]["hit_tokens"] < per["hybrid-plain"]["hit_tokens"]
