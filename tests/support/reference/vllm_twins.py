"""Run under vLLM 0.34.0's own Python (a scratch venv, scripts/vllm_env.sh): vLLM's KVCacheManager
driven through the schedule of the lesson "One hash, two blocks" (tests/lab/test_topics.py).

Two requests with the same prompt are admitted in one step, A first: each looks the cache up
(``get_computed_blocks``) and is given one chunk (``allocate_slots``); then, step by step, each
continues its prefill by one chunk, A first, as vLLM's scheduler serves running requests. Prints,
as JSON, B's hit and every prefix-cache key held by more than one block.

    python -I tests/support/reference/vllm_twins.py '{"prompt": [...], "block_size": 4, "chunk": 8}'
"""

import json
import sys

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request


def main(args: dict) -> dict:
    bs, chunk, prompt = args["block_size"], args["chunk"], args["prompt"]
    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float32)
    config = KVCacheConfig(
        num_blocks=args.get("num_blocks", 40),
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    manager = KVCacheManager(
        config, max_model_len=4096, scheduler_block_size=bs, hash_block_size=bs
    )
    hasher = get_request_block_hasher(bs, sha256)
    reqs = [
        Request(rid, list(prompt), SamplingParams(max_tokens=1), None, block_hasher=hasher)
        for rid in ("A", "B")
    ]
    hits = {}
    for r in reqs:  # admitted in one step, in order
        blocks, num_hit, _ = manager.get_computed_blocks(r)
        hits[r.request_id] = [num_hit, [b.block_id for b in blocks.blocks[0]]]
        num_new = min(chunk, r.num_tokens - num_hit)
        manager.allocate_slots(r, num_new, num_hit, blocks)
        r.num_computed_tokens = num_hit + num_new
    while any(r.num_computed_tokens < r.num_tokens for r in reqs):
        for r in reqs:  # running requests, in order
            num_new = min(chunk, r.num_tokens - r.num_computed_tokens)
            if num_new:
                manager.allocate_slots(r, num_new)
                r.num_computed_tokens += num_new
    twins = []
    # vLLM 0.34 keeps the block ids of a key several blocks hold apart, in insertion order
    for block_ids in manager.block_pool.cached_block_hash_to_block._dup_ids.values():
        twins.append(list(block_ids))
    return {"hits": hits, "twins": sorted(twins)}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
