"""vLLM 0.33.0's side of tests/test_hash_keys.py, run by the vLLM scratch environment's Python:
reads the variants (JSON on stdin), builds each as vLLM's own Request with vLLM's own block hasher,
and runs the same admissions on vLLM's own KVCacheManager. Writes, as JSON: each variant's block
hashes (hex) and extra keys, and the blocks each (first, second) pair's second request hits."""

import json
import sys

import torch
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    generate_block_hash_extra_keys,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request


def plain(x):
    if isinstance(x, bytes):
        return x.hex()
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


def main() -> None:
    spec = json.load(sys.stdin)
    bs, tokens = spec["block_size"], spec["token_ids"]
    init_none_hash(sha256)
    hasher = get_request_block_hasher(bs, sha256)

    def request(variant: str, rid: str) -> Request:
        v = spec["variants"][variant]
        kw = {"cache_salt": v["salt"]}
        if v["lora"]:
            kw["lora_request"] = LoRARequest(*v["lora"])
        if v["mm"]:
            kw["mm_features"] = [
                MultiModalFeatureSpec(
                    data=None,
                    modality="image",
                    identifier=ident,
                    mm_position=PlaceholderRange(offset=off, length=n),
                )
                for ident, off, n in v["mm"]
            ]
        if v["embeds"]:
            kw["prompt_embeds"] = torch.tensor(v["embeds"], dtype=torch.float32)
        return Request(
            rid, list(tokens), SamplingParams(max_tokens=1), None, block_hasher=hasher, **kw
        )

    def hits(first: str, second: str) -> int:
        full = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float32)
        config = KVCacheConfig(
            num_blocks=4 * (len(tokens) // bs + 2),
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["full"], full)],
        )
        kvm = KVCacheManager(
            config,
            max_model_len=4096,
            scheduler_block_size=bs,
            hash_block_size=bs,
            enable_caching=True,
        )
        a = request(first, "first")
        blocks, n, _ = kvm.get_computed_blocks(a)
        kvm.allocate_slots(a, a.num_tokens - n, n, blocks)
        kvm.free(a)
        _, n, _ = kvm.get_computed_blocks(request(second, "second"))
        return n // bs

    out = {"hashes": {}, "keys": {}, "hits": {}}
    for variant in spec["variants"]:
        r = request(variant, variant)
        out["hashes"][variant] = [bytes(h).hex() for h in r.block_hashes]
        out["keys"][variant] = [
            plain(generate_block_hash_extra_keys(r, i * bs, (i + 1) * bs, 0)[0])
            for i in range(len(r.block_hashes))
        ]
    for first, second in spec["pairs"]:
        out["hits"][f"{first}>{second}"] = hits(first, second)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
