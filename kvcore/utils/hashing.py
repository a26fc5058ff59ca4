"""The hash functions a prefix-cache key can be computed with (vLLM: vllm/utils/hashing.py).

"sha256" and "xxhash" hash the pickled object; "sha256_cbor" and "xxhash_cbor" hash canonical
CBOR, the same bytes from any language.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import Any, Callable

import cbor2
import xxhash as _xxhash

HashFn = Callable[[Any], bytes]


def sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash(obj: Any) -> bytes:
    return _xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(obj: Any) -> bytes:
    return _xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


HASH_FUNCTIONS: dict[str, HashFn] = {
    "xxhash": xxhash,
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash_cbor": xxhash_cbor,
}
# The names a block hash can be computed with, the default first: the one list of them (the
# scenario schema, the playground's form and the tests derive theirs from it).
HASH_ALGOS: tuple[str, ...] = tuple(HASH_FUNCTIONS)
# Not collision resistant: vLLM keeps their seed secret (random) unless told otherwise.
NON_CRYPTO_HASH_ALGOS = frozenset({"xxhash", "xxhash_cbor"})


def get_hash_fn_by_name(name: str) -> HashFn:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown hash_algo {name!r}; choose one of {sorted(HASH_FUNCTIONS)}"
        ) from None
