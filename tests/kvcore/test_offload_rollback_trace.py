"""A trace that once looked like a difference from vLLM (issue 36): ``bench/offload_vs_vllm.py
--traces 100 --seed 99173`` reported trace seed 99214, step 14, as ours cutting back R2 and R3 after
a failed load where vLLM cut back only R2. Reading vLLM 0.33's ``Scheduler._handle_invalid_blocks``
settled it: it walks the requests still loading (R3, asynchronous, evict_blocks=False) and then the
running ones (R2), and ``_update_requests_with_invalid_blocks`` cuts back every request holding the
failed block among its computed blocks; R3, failed in the step before already, was cut from 2
tokens to 0 on vLLM's side too. The bench counted only requests newly marked in
``failed_recving_kv_req_ids``, so it missed R3; it now counts every request vLLM's method returns.
This runs our side of the trace without vLLM, with what vLLM's methods decided (printed by the
bench's replay, vLLM 0.33.0) written in."""

import sys

from support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import offload_vs_vllm  # noqa: E402


def test_trace_99214_cuts_back_every_request_holding_the_failed_block_as_vllm_does():
    case = offload_vs_vllm.random_case(99214)
    assert case["kv_load_failure_policy"] == "recompute" and case["max_num_seqs"] == 1
    script, seen = offload_vs_vllm.our_run(case)
    # step 13 (index 12): block 2 fails; R3 is loading its blocks [1, 2, 3, 10], R2 runs
    assert script[12]["invalid_block_ids"] == [2]
    assert (script[12]["running"], script[12]["loading"]) == (["R2"], ["R3"])
    assert seen[12]["rolled_back"] == [["R2", 2], ["R3", 2]]
    # step 14 (index 13): block 1 fails; both hold it among their computed blocks, R3 first
    assert script[13]["invalid_block_ids"] == [1]
    assert seen[13]["rolled_back"] == [["R2", 0], ["R3", 0]]
    # under "recompute" nothing is evicted by id, and the trace still ends
    assert not seen[13]["evict_blocks"]
    assert not script[-1]["running"] or script[-1]["finished"]
