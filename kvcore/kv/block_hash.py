"""Chained block hashing, as vLLM v1 computes prefix-cache keys.

hash(block i) = hash_fn((hash(block i-1) or NONE_HASH, tuple(tokens of block i), extra_keys or None))
with the tuple serialised by pickle at the highest protocol ("sha256", "xxhash") or
as canonical CBOR ("sha256_cbor", "xxhash_cbor": the same bytes from any language).
Only full blocks are hashed. A cache key is the block hash plus the KV cache group
id (4 bytes, big-endian), so the same tokens get one hash but a key per group.

NONE_HASH = hash_fn(seed) stands in for the parent of block 0. vLLM takes the seed
from PYTHONHASHSEED when it is set; otherwise "vllm-none-hash" for the sha256
algorithms and 32 random bytes (hex) for the xxhash ones, whose collision
resistance depends on a secret seed. ``engine.hash_seed`` chooses: a string is the
seed itself (default "vllm-none-hash": runs and traces are reproducible), null
resolves it as vLLM does.
"""
from __future__ import annotations

import hashlib
import os
import pickle
from typing import Any, Callable, Optional, Sequence

import cbor2
import xxhash

HashFn = Callable[[Any], bytes]

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
NONE_HASH_SEED = DEFAULT_NONE_HASH_SEED


def sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash_128(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256, "sha256_cbor": sha256_cbor,
                                     "xxhash": xxhash_128, "xxhash_cbor": xxhash_cbor}
# Not collision resistant: vLLM keeps their seed secret (random) unless told otherwise.
NON_CRYPTO_HASH_ALGOS = frozenset({"xxhash", "xxhash_cbor"})


def get_hash_fn(name: str) -> HashFn:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown hash_algo {name!r}; choose one of {sorted(HASH_FUNCTIONS)}") from None


def resolve_none_hash_seed(hash_algo: str, hash_seed: Optional[str] = DEFAULT_NONE_HASH_SEED) -> str:
    """The seed NONE_HASH is derived from: ``hash_seed`` if given, else vLLM's rule."""
    if hash_seed is not None:
        return hash_seed
    env = os.getenv("PYTHONHASHSEED")
    if env is not None:
        return env
    if hash_algo in NON_CRYPTO_HASH_ALGOS:
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def none_hash(hash_fn: HashFn, seed: str = DEFAULT_NONE_HASH_SEED) -> bytes:
    return hash_fn(seed)


def hash_block_tokens(hash_fn: HashFn, parent_block_hash: Optional[bytes],
                      block_token_ids: Sequence[int], extra_keys: Optional[tuple] = None,
                      none: Optional[bytes] = None) -> bytes:
    if not parent_block_hash:
        parent_block_hash = none if none is not None else none_hash(hash_fn)
    return hash_fn((parent_block_hash, tuple(block_token_ids), extra_keys))


def cache_salt_extra_keys(cache_salt: Optional[str], block_index: int) -> Optional[tuple]:
    """Extra keys of a block: the salt goes into the first block only; an empty salt is no salt."""
    if block_index == 0 and cache_salt:
        return (("cache_salt", cache_salt),)
    return None


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def get_block_hash(key: bytes) -> bytes:
    return key[:-4]


def get_group_id(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


class BlockHasher:
    """Computes a request's block hashes incrementally as its tokens grow."""

    def __init__(self, hash_fn: HashFn, block_size: int, none_hash_seed: str = DEFAULT_NONE_HASH_SEED) -> None:
        self.hash_fn = hash_fn
        self.block_size = block_size
        self.none_hash_seed = none_hash_seed
        self.none_hash = none_hash(hash_fn, none_hash_seed)

    def extend(self, block_hashes: list[bytes], token_ids: Sequence[int],
               cache_salt: Optional[str]) -> list[bytes]:
        """Append the hashes of newly completed full blocks; returns the new ones."""
        bs = self.block_size
        new = []
        start = len(block_hashes) * bs
        while start + bs <= len(token_ids):
            idx = start // bs
            parent = block_hashes[-1] if block_hashes else None
            h = hash_block_tokens(self.hash_fn, parent, token_ids[start:start + bs],
                                  cache_salt_extra_keys(cache_salt, idx), self.none_hash)
            block_hashes.append(h)
            new.append(h)
            start += bs
        return new
