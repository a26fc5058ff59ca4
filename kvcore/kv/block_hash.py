"""Chained block hashing, as vLLM v1 computes prefix-cache keys.

hash(block i) = hash_fn((hash(block i-1) or NONE_HASH, tuple(tokens of block i), extra_keys or None))
with the tuple serialised by pickle at the highest protocol. Only full blocks
are hashed. A cache key is the block hash plus the KV cache group id (4 bytes,
big-endian), so the same tokens get one hash but a key per group.
"""
from __future__ import annotations

import hashlib
import pickle
from typing import Any, Callable, Optional, Sequence

import xxhash

HashFn = Callable[[Any], bytes]

# vLLM derives NONE_HASH from PYTHONHASHSEED (random bytes when unset). We fix
# the seed string so that runs and traces are reproducible; with
# PYTHONHASHSEED=vllm-none-hash vLLM computes the same sha256 chain.
NONE_HASH_SEED = "vllm-none-hash"


def sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def xxhash_128(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256, "xxhash": xxhash_128}


def get_hash_fn(name: str) -> HashFn:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown hash_algo {name!r}; choose one of {sorted(HASH_FUNCTIONS)}") from None


def none_hash(hash_fn: HashFn) -> bytes:
    return hash_fn(NONE_HASH_SEED)


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

    def __init__(self, hash_fn: HashFn, block_size: int) -> None:
        self.hash_fn = hash_fn
        self.block_size = block_size
        self.none_hash = none_hash(hash_fn)

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
