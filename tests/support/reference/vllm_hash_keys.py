"""vLLM 0.34.0's side of tests/lab/test_hash_keys.py, run by the vLLM scratch environment's Python:
reads the variants (JSON on stdin), builds each as vLLM's own Request with vLLM's own block hasher,
and runs the same admissions on vLLM's own KVCacheManager. Writes, as JSON: each variant's block
hashes (hex) and extra keys, and the blocks each (first, second) pair's second request hits.

Given ``requests`` instead (a scenario's requests as the engine builds them: token ids, or
embedding rows as raw float32 bytes in hex, multimodal items, salt), admits them one after the
other on one KVCacheManager, each freed before the next, and writes each one's block hashes and
the tokens it hit.

Given ``frontend`` (a list of cases: hash algorithm, hash block size, lookahead tokens,
PYTHONHASHSEED, whether the engine hashes at all, a prompt, a salt, a LoRA adapter, the prompt
block hashes a frontend sends, the output tokens appended after), does what vLLM 0.34.0's
EngineCore does with them: builds the PrefixHashConfig as its __init__ builds it (init_none_hash,
get_request_block_hasher), passes the EngineCoreRequest through frontend_block_hashes and
Request.from_engine_core_request, appends the outputs; writes, per case, the config's NONE_HASH,
the hashes frontend_block_hashes let through (or None) and the request's block hashes at the
end."""

import json
import os
import sys

import torch
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name, sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import (
    frontend_block_hashes,
    generate_block_hash_extra_keys,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.engine import EngineCoreRequest, PrefixHashConfig
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


def frontend_case(case: dict) -> dict:
    """One request that arrives with (or without) a frontend's prompt hashes, as EngineCore
    (vllm/v1/engine/core.py, 0.34.0) takes it in."""
    saved = os.environ.pop("PYTHONHASHSEED", None)
    if case["pythonhashseed"] is not None:
        os.environ["PYTHONHASHSEED"] = case["pythonhashseed"]
    try:
        hasher, config = None, None
        if case["engine_hashes"]:  # prefix caching on (or a KV connector): EngineCore.__init__
            fn = get_hash_fn_by_name(case["hash_algo"])
            init_none_hash(fn)
            hasher = get_request_block_hasher(case["hash_block_size"], fn, case["lookahead"])
            config = PrefixHashConfig(
                hash_algo=case["hash_algo"],
                hash_block_size=case["hash_block_size"],
                none_hash=kv_cache_utils.NONE_HASH,
                num_lookahead_tokens=case["lookahead"],
            )
    finally:
        os.environ.pop("PYTHONHASHSEED", None)
        if saved is not None:
            os.environ["PYTHONHASHSEED"] = saved
    sent = case["block_hashes"]
    lora = case["lora"]
    request = EngineCoreRequest(
        request_id="r",
        prompt_token_ids=list(case["prompt"]),
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=1 + len(case["outputs"])),
        pooling_params=None,
        arrival_time=0.0,
        lora_request=None if lora is None else LoRARequest(*lora),
        cache_salt=case["salt"],
        data_parallel_rank=None,
        block_hashes=None if sent is None else [bytes.fromhex(h) for h in sent],
    )
    taken = frontend_block_hashes(request, config)  # EngineCore.preprocess_add_request
    out = {
        "none_hash": None if config is None else config.none_hash.hex(),
        # written before the request grows: vLLM's Request keeps the very list it was given
        "taken": None if taken is None else [bytes(h).hex() for h in taken],
    }
    req = Request.from_engine_core_request(request, hasher, taken)
    if case["outputs"]:
        req.append_output_token_ids(list(case["outputs"]))
    out["hashes"] = [bytes(h).hex() for h in req.block_hashes]
    return out


def main() -> None:
    spec = json.load(sys.stdin)
    init_none_hash(sha256)
    if isinstance(spec, list):  # several specs, one answer each (one interpreter for them all)
        json.dump([answer(s) for s in spec], sys.stdout)
        return
    json.dump(answer(spec), sys.stdout)


def answer(spec: dict):
    if "frontend" in spec:
        return [frontend_case(c) for c in spec["frontend"]]
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
