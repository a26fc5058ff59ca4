"""vLLM 0.34.0's side of tests/lab/test_hash_keys.py, run by the vLLM scratch environment's Python:
reads the variants (JSON on stdin), builds each as vLLM's own Request with vLLM's own block hasher,
and runs the same admissions on vLLM's own KVCacheManager. Writes, as JSON: each variant's block
hashes (hex) and extra keys, and the blocks each (first, second) pair's second request hits.

Given ``requests`` instead (a scenario's requests as the engine builds them: token ids, or
embedding rows as raw float32 bytes in hex, multimodal items, salt), admits them one after the
other on one KVCacheManager, each freed before the next, and writes each one's block hashes and
the tokens it hit."""

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


def manager(bs: int, num_blocks: int) -> KVCacheManager:
    full = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float32)
    config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["full"], full)],
    )
    return KVCacheManager(
        config, max_model_len=4096, scheduler_block_size=bs, hash_block_size=bs, enable_caching=True
    )


def features(items) -> list[MultiModalFeatureSpec]:
    return [
        MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier=ident,
            mm_position=PlaceholderRange(offset=off, length=n),
        )
        for ident, off, n in items
    ]


def admissions(spec: dict) -> dict:
    bs = spec["block_size"]
    hasher = get_request_block_hasher(bs, sha256)
    kvm = manager(bs, 4096)
    out = {"hashes": [], "hits": []}
    for r in spec["requests"]:
        kw = {"cache_salt": r["salt"], "mm_features": features(r["mm"])}
        if r["embeds"] is not None:
            raw = bytearray(bytes.fromhex("".join(r["embeds"])))
            kw["prompt_embeds"] = torch.frombuffer(raw, dtype=torch.float32).view(
                len(r["embeds"]), -1
            )
        req = Request(
            r["id"], r["token_ids"], SamplingParams(max_tokens=1), None, block_hasher=hasher, **kw
        )
        blocks, n, _ = kvm.get_computed_blocks(req)
        kvm.allocate_slots(req, req.num_tokens - n, n, blocks)
        kvm.free(req)
        out["hashes"].append([bytes(h).hex() for h in req.block_hashes])
        out["hits"].append(n)
    return out


def main() -> None:
    spec = json.load(sys.stdin)
    init_none_hash(sha256)
    if isinstance(spec, list):  # several specs, one answer each (one interpreter for them all)
        json.dump([answer(s) for s in spec], sys.stdout)
        return
    json.dump(answer(spec), sys.stdout)


def answer(spec: dict):
    if "requests" in spec:
        return admissions(spec)
    bs, tokens = spec["block_size"], spec["token_ids"]
    hasher = get_request_block_hasher(bs, sha256)

    def request(variant: str, rid: str) -> Request:
        v = spec["variants"][variant]
        kw = {"cache_salt": v["salt"]}
        if v["lora"]:
            kw["lora_request"] = LoRARequest(*v["lora"])
        if v["mm"]:
            kw["mm_features"] = features(v["mm"])
        if v["embeds"]:
            kw["prompt_embeds"] = torch.tensor(v["embeds"], dtype=torch.float32)
        return Request(
            rid, list(tokens), SamplingParams(max_tokens=1), None, block_hasher=hasher, **kw
        )

    def hits(first: str, second: str) -> int:
        kvm = manager(bs, 4 * (len(tokens) // bs + 2))
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
    return out


if __name__ == "__main__":
    main()
