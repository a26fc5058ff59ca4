"""Prefill here, decode there, against vLLM 0.34.0's own Schedulers with its own NixlConnector
(bench/pd_vs_vllm.py): a few random traces through our P/D pair, replayed step for step on two
vLLM Schedulers (kv_producer, kv_consumer) given the same requests, sampled tokens and transfer
reports; per step both sides agree on the tokens scheduled, the pulls (decode blocks filled,
prefill blocks read), the params a finished prefill request hands over, every held request's
table, status and computed tokens, the free queue and the cached blocks. Needs the scratch
environment with the real vllm==0.34.0 (``bash scripts/vllm_env.sh``; ``VLLM_VENV``, default
/tmp/vllm034-venv); the figures over 200 traces are in docs/fidelity.md."""

import os
import sys
from pathlib import Path

import pytest

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import pd_vs_vllm  # noqa: E402

VENV = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_random_traces_schedule_pull_hold_and_cache_as_vllm_does():
    res = pd_vs_vllm.differential(VENV, list(range(12)))
    assert not res["failures"], res["failures"]
    for aspect, t in res["aspects"].items():
        assert t["steps"] > 300 and t["differ"] == 0, aspect
    ex = res["exercised"]
    # the traces really pull past decode-side hits, hold prefill blocks and fail pulls
    assert ex["pulls"] > 50 and ex["partial_pulls"] > 10 and ex["held_steps"] > 50
    assert ex["failed_pulls"] > 0
    # some traces cap the loads in flight (vLLM 0.34's max_num_inflight_kv_loads): pulls start
    # while the decode replica's running batch is full
    assert ex["pulls_while_full"] > 5
