"""kvcore's prompt block hashes against the vectors vLLM 0.34.0 pins for them.

vLLM 0.34.0 keeps, in its source distribution, the prompt block hashes its engine computes for a
set of prompts (rust/src/engine-core-client/src/tests/prompt_block_hash_vectors.json: its Rust
frontend hashes prompts itself and is tested against them, and its own
tests/v1/core/test_prompt_block_hash_vectors.py checks that the engine still makes them). They
cover token ids at every width boundary of both encodings (pickle for "sha256", canonical CBOR
for "sha256_cbor"), block sizes from 1 to 300, a LoRA adapter and a cache salt as extra keys,
and NONE_HASH from the default seed. kvcore's request block hasher (get_request_block_hasher)
must give the same bytes for every case it models: all but the ones with lookahead tokens in
the hash (num_hash_lookahead_tokens, which kvcore does not model).

Read from the sdist scripts/vllm_core_tests.py caches (VLLM_SDIST_CACHE, default
/tmp/vllm-sdist-cache); skipped, with the reason, without it. No vLLM interpreter is needed."""

import json
import os
import tarfile
from pathlib import Path

import pytest

from kvcore.core.kv_cache_utils import (
    DEFAULT_NONE_HASH_SEED,
    get_request_block_hasher,
    init_none_hash,
)
from kvcore.lora.request import LoRARequest
from kvcore.request import Request
from kvcore.utils.hashing import sha256, sha256_cbor

SDIST = Path(os.environ.get("VLLM_SDIST_CACHE", "/tmp/vllm-sdist-cache")) / "vllm-0.34.0.tar.gz"
MEMBER = "vllm-0.34.0/rust/src/engine-core-client/src/tests/prompt_block_hash_vectors.json"
HASH_FNS = {"sha256": sha256, "sha256_cbor": sha256_cbor}

pytestmark = pytest.mark.skipif(
    not SDIST.exists(),
    reason=f"no vLLM 0.34.0 sdist at {SDIST} (scripts/vllm_core_tests.py downloads it)",
)


@pytest.fixture(scope="module")
def vectors() -> dict:
    with tarfile.open(SDIST) as tar:
        fh = tar.extractfile(MEMBER)
        assert fh is not None, f"{MEMBER} is not a file in {SDIST}"
        return json.load(fh)


def kvcore_block_hashes(case: dict) -> list[str]:
    """The block hashes kvcore's Request gets for the case's prompt, LoRA adapter and salt."""
    lora = case["lora"]
    request = Request(
        "0",
        case["prompt_token_ids"],
        max_tokens=17,
        cache_salt=case["cache_salt"],
        lora_request=None if lora is None else LoRARequest(lora["name"], 1, lora["path"]),
        block_hasher=get_request_block_hasher(case["block_size"], HASH_FNS[case["hash_algo"]]),
    )
    return [h.hex() for h in request.block_hashes]


def test_none_hash_from_the_default_seed_is_vllms(vectors):
    for algo, expected in vectors["none_hashes"].items():
        assert init_none_hash(HASH_FNS[algo], DEFAULT_NONE_HASH_SEED).hex() == expected, algo


def test_every_prompt_block_hash_kvcore_models_is_vllms(vectors):
    cases = [c for c in vectors["cases"] if c["num_lookahead_tokens"] == 0]
    # both hash functions, plain prompts and every kind of extra key the vectors hold
    assert {c["hash_algo"] for c in cases} == set(HASH_FNS)
    assert any(c["lora"] and c["cache_salt"] for c in cases)
    for case in cases:
        ours = kvcore_block_hashes(case)
        assert ours == case["block_hashes"], (case["name"], case["hash_algo"])
        assert len(ours) == len(case["prompt_token_ids"]) // case["block_size"]
