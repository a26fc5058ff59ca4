"""Chained block hashing, checked byte for byte against vLLM's formula computed here with
hashlib + pickle (not with kvcore's code)."""

import hashlib
import os
import pickle

import pytest
import xxhash

import kvcore.core.kv_cache_utils as kv_cache_utils
from kvcore.core.kv_cache_utils import (
    NONE_HASH_SEED,
    cache_salt_extra_keys,
    frontend_block_hashes,
    get_block_hash,
    get_group_id,
    get_none_hash_seed,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
)
from kvcore.utils.hashing import get_hash_fn_by_name
from support.kv import VLLM_NONE_HASH_SHA256, make_request, vllm_chain


def test_none_hash_is_vllms_with_pythonhashseed_set_to_the_seed_string(monkeypatch):
    # vLLM (kv_cache_utils.init_none_hash): NONE_HASH = hash_fn(os.getenv("PYTHONHASHSEED"))
    # when the variable is set. Our fixed seed equals PYTHONHASHSEED=vllm-none-hash.
    monkeypatch.setenv("PYTHONHASHSEED", "vllm-none-hash")
    seed = os.getenv("PYTHONHASHSEED")
    expected = hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert NONE_HASH_SEED == "vllm-none-hash"
    assert init_none_hash(get_hash_fn_by_name("sha256")) == expected == VLLM_NONE_HASH_SHA256
    # as vLLM's, init_none_hash sets the module's NONE_HASH and the seed it came from
    assert kv_cache_utils.NONE_HASH == expected and get_none_hash_seed() == NONE_HASH_SEED
    assert len(expected) == 32


def test_sha256_block_hash_is_byte_identical_to_vllms_formula():
    parent = VLLM_NONE_HASH_SHA256
    toks = [101, 7, 9000, 3]
    expected = hashlib.sha256(
        pickle.dumps((parent, tuple(toks), None), protocol=pickle.HIGHEST_PROTOCOL)
    ).digest()
    fn = get_hash_fn_by_name("sha256")
    assert hash_block_tokens(fn, None, toks) == expected  # None parent -> NONE_HASH
    assert hash_block_tokens(fn, b"", toks) == expected  # falsy parent -> NONE_HASH
    child = hashlib.sha256(
        pickle.dumps((expected, (5, 6, 7, 8), None), protocol=pickle.HIGHEST_PROTOCOL)
    ).digest()
    assert hash_block_tokens(fn, expected, [5, 6, 7, 8]) == child


def test_request_chain_matches_vllm_for_sha256():
    toks = list(range(100, 123))  # 23 tokens, block_size 4 -> 5 full blocks
    req = make_request("r", toks, 4)
    assert req.block_hashes == vllm_chain(toks, 4)
    assert len(req.block_hashes) == 5  # the partial last block has no hash


def test_xxhash_is_xxh3_128_of_the_same_pickle():
    toks = [1, 2, 3, 4]
    fn = get_hash_fn_by_name("xxhash")
    none = xxhash.xxh3_128_digest(pickle.dumps("vllm-none-hash", protocol=pickle.HIGHEST_PROTOCOL))
    assert init_none_hash(fn) == none
    expected = xxhash.xxh3_128_digest(
        pickle.dumps((none, (1, 2, 3, 4), None), protocol=pickle.HIGHEST_PROTOCOL)
    )
    assert make_request("r", toks, 4, hash_algo="xxhash").block_hashes == [expected]
    assert len(expected) == 16


def test_unknown_hash_algo_is_rejected():
    with pytest.raises(ValueError, match="unknown hash_algo 'md5'"):
        get_hash_fn_by_name("md5")


def test_only_full_blocks_are_hashed_and_hashes_grow_with_the_tokens():
    req = make_request("r", [1, 2, 3, 4, 5], 2)
    assert len(req.block_hashes) == 2
    req.append_output_token_ids([6])
    assert len(req.block_hashes) == 3
    req.append_output_token_ids([7])
    assert len(req.block_hashes) == 3
    req.append_output_token_ids([8, 9, 10])
    assert req.block_hashes == vllm_chain(list(range(1, 11)), 2)


def test_hasher_extend_returns_only_the_new_hashes():
    h = get_request_block_hasher(3, get_hash_fn_by_name("sha256"))
    hashes: list = []
    assert h.extend(hashes, [1, 2], None) == []
    new = h.extend(hashes, [1, 2, 3, 4, 5, 6, 7], None)
    assert new == hashes == vllm_chain([1, 2, 3, 4, 5, 6, 7], 3)


def test_block_size_one_hashes_every_token():
    req = make_request("r", [5, 6, 7], 1)
    assert req.block_hashes == vllm_chain([5, 6, 7], 1)


def test_cache_salt_goes_into_the_first_block_only_as_a_tagged_tuple():
    assert cache_salt_extra_keys("s", 0) == (("cache_salt", "s"),)
    assert cache_salt_extra_keys("s", 1) is None
    assert cache_salt_extra_keys("", 0) is None  # an empty salt is no salt
    assert cache_salt_extra_keys(None, 0) is None
    toks = [1, 2, 3, 4, 5, 6]
    salted = make_request("a", toks, 2, salt="tenant-1")
    assert salted.block_hashes == vllm_chain(toks, 2, salt="tenant-1")
    assert salted.extra_keys_for_block(0) == (("cache_salt", "tenant-1"),)
    assert salted.extra_keys_for_block(1) is None


def test_cache_salt_separates_identical_prompts_along_the_whole_chain():
    toks = [1, 2, 3, 4, 5, 6]
    plain = make_request("a", toks, 2)
    s1 = make_request("b", toks, 2, salt="one")
    s2 = make_request("c", toks, 2, salt="two")
    for i in range(3):
        assert len({plain.block_hashes[i], s1.block_hashes[i], s2.block_hashes[i]}) == 3
    assert make_request("d", toks, 2, salt="").block_hashes == plain.block_hashes
    assert make_request("e", toks, 2, salt="one").block_hashes == s1.block_hashes


def test_cache_key_is_hash_plus_4_byte_big_endian_group_id():
    h = VLLM_NONE_HASH_SHA256
    k0 = make_block_hash_with_group_id(h, 0)
    k1 = make_block_hash_with_group_id(h, 1)
    assert k0 == h + b"\x00\x00\x00\x00" and k1 == h + b"\x00\x00\x00\x01"
    assert get_block_hash(k1) == h and get_group_id(k1) == 1
    assert get_group_id(make_block_hash_with_group_id(h, 258)) == 258


# -- CBOR algorithms and NONE_HASH seeding as vLLM 0.33 does them ----------------------------------
def test_cbor_algorithms_hash_canonical_cbor_of_the_same_tuple():
    import cbor2

    parent = hashlib.sha256(cbor2.dumps("vllm-none-hash", canonical=True)).digest()
    toks = [5, 6, 7, 8]
    req = make_request("r", toks, 4, hash_algo="sha256_cbor")
    assert req.block_hashes == [
        hashlib.sha256(cbor2.dumps((parent, tuple(toks), None), canonical=True)).digest()
    ]
    none_x = xxhash.xxh3_128_digest(cbor2.dumps("vllm-none-hash", canonical=True))
    salted = make_request("s", toks, 4, hash_algo="xxhash_cbor", salt="k")
    key = (none_x, tuple(toks), (("cache_salt", "k"),))
    assert salted.block_hashes == [xxhash.xxh3_128_digest(cbor2.dumps(key, canonical=True))]


def test_none_hash_seed_resolves_as_vllm_when_hash_seed_is_null(monkeypatch):
    from kvcore.core.kv_cache_utils import resolve_none_hash_seed

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    assert (
        resolve_none_hash_seed("sha256", None)
        == resolve_none_hash_seed("sha256_cbor", None)
        == "vllm-none-hash"
    )
    a, b = resolve_none_hash_seed("xxhash", None), resolve_none_hash_seed("xxhash_cbor", None)
    assert a != b and len(a) == len(b) == 64 and int(a, 16) >= 0  # fresh random bytes each time
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert resolve_none_hash_seed("xxhash", None) == resolve_none_hash_seed("sha256", None) == "0"
    assert resolve_none_hash_seed("xxhash", "mine") == "mine"  # an explicit seed wins


def test_engine_hash_seed_reproduces_a_vllm_server_started_with_pythonhashseed(monkeypatch):
    # The fixtures were recorded from vLLM 0.33 with PYTHONHASHSEED=0 and sha256: NONE_HASH is
    # sha256(pickle("0")) = 1973e238..., so engine.hash_seed "0" gives the server's hashes.
    from support.kv import make_engine, spec

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    eng = make_engine([spec("a", list(range(8)))], hash_algo="sha256", hash_seed="0")
    assert eng.hasher.none_hash.hex().startswith("1973e23848344dc4")
    # default seed
    assert make_engine([], hash_algo="sha256").hasher.none_hash == VLLM_NONE_HASH_SHA256
    x1, x2 = (
        make_engine([], hash_algo="xxhash", hash_seed=None).hasher.none_hash for _ in range(2)
    )
    assert x1 != x2  # vLLM's random xxhash seed


def test_frontend_hashes_of_the_prompts_count_are_kept_and_the_engine_hashes_on_from_them():
    """vLLM 0.34's rule (EngineCore.preprocess_add_request, frontend_block_hashes), on
    made-up bytes so that keeping them shows: one hash per full prompt block is taken as sent
    and the engine's hasher chains the output blocks from the last of them; any other count is
    dropped and the engine hashes the prompt itself. tests/lab/test_hash_keys.py checks the same
    against vLLM 0.34.0's own code."""
    from kvcore.engine import EngineCoreRequest, PrefixHashConfig
    from support.kv import make_engine, vllm_sha256

    core = make_engine(block_size=4).engine_core
    assert core.prefix_hash_config == PrefixHashConfig("sha256", 4, VLLM_NONE_HASH_SHA256, 0)
    prompt = list(range(1, 11))  # 2 full blocks and 2 tokens over
    fake = [b"\x01" * 32, b"\x02" * 32]
    req = core.preprocess_add_request(EngineCoreRequest("r", prompt, 4, block_hashes=list(fake)))
    req.append_output_token_ids([11, 12])
    assert req.block_hashes == fake + [vllm_sha256((fake[1], (9, 10, 11, 12), None))]
    for wrong in (fake[:1], fake + fake[:1], []):
        req = core.preprocess_add_request(EngineCoreRequest("r", prompt, 4, block_hashes=wrong))
        assert req.block_hashes == vllm_chain(prompt, 4)
    # the count that fits leaves out the blocks whose lookahead tokens are not there yet
    config = PrefixHashConfig("sha256", 4, VLLM_NONE_HASH_SHA256, num_lookahead_tokens=3)
    sent = EngineCoreRequest("r", prompt, 4, block_hashes=fake)
    assert frontend_block_hashes(sent, config) is None
    sent.block_hashes = fake[:1]  # (10 - 3) // 4
    assert frontend_block_hashes(sent, config) == fake[:1]
    # an engine that hashes nothing (no prefix caching, no KV connector) takes no hashes
    off = make_engine(block_size=4, enable_prefix_caching=False).engine_core
    assert off.prefix_hash_config is None and off.request_block_hasher is None
    req = off.preprocess_add_request(EngineCoreRequest("r", prompt, 4, block_hashes=list(fake)))
    assert req.block_hashes == []
