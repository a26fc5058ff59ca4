"""Block metadata, the free-block queue and chained block hashing (vLLM: v1/core/kv_cache_utils.py).

Chained block hashing, as vLLM v1 computes prefix-cache keys.

hash(block i) = hash_fn((hash(block i-1) or NONE_HASH, tuple(tokens of block i),
                        extra_keys or None))
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
import math
import os
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union

from kvcore.utils.hashing import NON_CRYPTO_HASH_ALGOS, HashFn

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
NONE_HASH_SEED = DEFAULT_NONE_HASH_SEED
# The root of the chain (the parent of block 0), set by ``init_none_hash``; vLLM's name. Empty
# until an engine is built.
NONE_HASH: bytes = b""
# The seed NONE_HASH was derived from (None: init_none_hash has not run).
_NONE_HASH_SEED: Optional[str] = None


# A block hash as published in KV events (vLLM keeps the alias and its conversion here, and its
# kv_events imports them): the low 64 bits of the hash as an unsigned int
# (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, vLLM's default) or all its bytes.
ExternalBlockHash = Union[bytes, int]


def maybe_convert_block_hash(
    block_hash: bytes, use_int_block_hashes: bool = True
) -> ExternalBlockHash:
    """The hash as the wire carries it: its last 8 bytes as a big-endian uint64, or all of it.

    vLLM reads ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` from its environment here; kvcore takes
    the setting as ``use_int_block_hashes`` (its block pool passes its own)."""
    if not use_int_block_hashes:
        return block_hash
    # vLLM masks the whole hash to its low 64 bits; those are its last 8 bytes, read alone here
    # (the same int, without building a 256-bit one first: every KV event pays for this).
    return int.from_bytes(block_hash[-8:], "big")


@dataclass(eq=False, slots=True)
class KVCacheBlock:
    """Metadata of one physical KV block.

    ``block_hash`` is the cache key (block hash + group id) and is set only
    while the block is full and registered in the prefix cache;
    ``block_hash_num_tokens`` is then the prefix length the hash covers (the
    end of the block: (index + 1) * block_size), else None. The two link
    fields are owned by FreeKVCacheBlockQueue and are None outside the queue.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[bytes] = None
    block_hash_num_tokens: Optional[int] = None
    prev_free_block: Optional["KVCacheBlock"] = None
    next_free_block: Optional["KVCacheBlock"] = None
    is_null: bool = False

    def reset_hash(self) -> None:
        self.block_hash = None
        self.block_hash_num_tokens = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks between two sentinel nodes.

    Invariant: the blocks between the sentinels are exactly the free blocks,
    each once, head = next to be handed out (and so the next cached block to
    lose its hash), tail = the last; ``num_free_blocks`` is their count.
    Every operation except ``get_all_free_blocks`` is O(1) per block, which is
    why a list or deque is not used: ``remove`` must take a block out of the
    middle when a prefix-cache hit revives it.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail or first is None:
            raise ValueError("No free blocks available")
        self.remove(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks: only {self.num_free_blocks} free")
        out: list[KVCacheBlock] = []
        # No per-block None check: n <= num_free_blocks, so the walk ends before the tail
        # sentinel (allocation pays for this loop, block by block).
        curr = self.fake_free_list_head.next_free_block
        for _ in range(n):
            out.append(curr)
            nxt = curr.next_free_block
            curr.prev_free_block = curr.next_free_block = None
            curr = nxt
        if n:
            self.fake_free_list_head.next_free_block = curr
            curr.prev_free_block = self.fake_free_list_head
            self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Take a block out of the middle (a prefix-cache hit revives it): O(1)."""
        prev_block, next_block = block.prev_free_block, block.next_free_block
        if prev_block is None or next_block is None:
            raise RuntimeError(f"remove() called on {block!r}, which is not in the free queue")
        prev_block.next_free_block = next_block
        next_block.prev_free_block = prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        self.append_n([block])

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put blocks at the tail, keeping their order (blocks[-1] becomes the tail)."""
        if not blocks:
            return
        tail = self.fake_free_list_tail
        last = tail.prev_free_block
        assert last is not None, "the tail sentinel must always have a previous node"
        for block in blocks:
            last.next_free_block = block
            block.prev_free_block = last
            last = block
        last.next_free_block = tail
        tail.prev_free_block = last
        self.num_free_blocks += len(blocks)

    def prepend_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Put blocks at the head, keeping their order (blocks[0] becomes the head)."""
        first = self.fake_free_list_head.next_free_block
        prev = self.fake_free_list_head
        n = 0
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
            n += 1
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += n

    def iter_blocks_after(self, cursor: Optional[KVCacheBlock]) -> Iterable[KVCacheBlock]:
        """The free blocks after ``cursor`` (from the head when None), in eviction order."""
        curr = (
            self.fake_free_list_head.next_free_block if cursor is None else cursor.next_free_block
        )
        while curr is not None and curr is not self.fake_free_list_tail:
            yield curr
            curr = curr.next_free_block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out = []
        curr = self.fake_free_list_head.next_free_block
        while curr is not None and curr is not self.fake_free_list_tail:
            out.append(curr)
            curr = curr.next_free_block
        return out


def resolve_none_hash_seed(
    hash_algo: str, hash_seed: Optional[str] = DEFAULT_NONE_HASH_SEED
) -> str:
    """The seed NONE_HASH is derived from: ``hash_seed`` if given, else vLLM's rule."""
    if hash_seed is not None:
        return hash_seed
    env = os.getenv("PYTHONHASHSEED")
    if env is not None:
        return env
    if hash_algo in NON_CRYPTO_HASH_ALGOS:
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def init_none_hash(hash_fn: HashFn, seed: str = DEFAULT_NONE_HASH_SEED) -> bytes:
    """Set ``NONE_HASH = hash_fn(seed)`` (and the seed it came from), as vLLM's does, and return it.

    vLLM resolves the seed inside (``resolve_none_hash_seed``); here the caller resolves it
    first, because ``engine.hash_seed`` may fix it. vLLM runs one engine per process, so its
    hashers read the module's ``NONE_HASH``; one kvcore process may hold engines of several
    algorithms and seeds (a fleet's router, two runs compared), so a hasher keeps the value this
    returns instead of reading the module's, which the engine built last set."""
    global NONE_HASH, _NONE_HASH_SEED
    _NONE_HASH_SEED = seed
    NONE_HASH = hash_fn(seed)
    return NONE_HASH


def get_none_hash_seed() -> str:
    """The seed ``NONE_HASH`` was derived from; the default seed before ``init_none_hash`` ran."""
    return DEFAULT_NONE_HASH_SEED if _NONE_HASH_SEED is None else _NONE_HASH_SEED


def hash_block_tokens(
    hash_function: HashFn,
    parent_block_hash: Optional[bytes],
    curr_block_token_ids: Sequence[int],
    extra_keys: Optional[tuple] = None,
    none_hash: Optional[bytes] = None,
) -> bytes:
    """hash_function((parent or the root, tuple(tokens), extra_keys)); a falsy parent is block
    0's. The root is ``none_hash`` when given (the engine's, from ``init_none_hash``), else
    ``hash_function`` of the default seed (vLLM reads its module's ``NONE_HASH``: see
    ``init_none_hash`` for why kvcore takes it as an argument)."""
    if not parent_block_hash:
        if none_hash is None:
            none_hash = hash_function(DEFAULT_NONE_HASH_SEED)
        parent_block_hash = none_hash
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def cache_salt_extra_keys(cache_salt: Optional[str], block_index: int) -> Optional[tuple]:
    """Extra keys of a block: the salt goes into the first block only; an empty salt is no salt."""
    if block_index == 0 and cache_salt:
        return (("cache_salt", cache_salt),)
    return None


def _gen_mm_extra_hash_keys(
    request, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[list, int]:
    """("mm", identifier, offset from the block's start) for each multimodal item whose
    placeholder range the block [start, end) touches; -> (keys, the item to look at next)."""
    keys: list = []
    features = request.mm_features
    if not features:
        return keys, start_mm_idx
    last = features[-1].mm_position
    if last.offset + last.length <= start_token_idx:
        return keys, start_mm_idx
    if start_mm_idx < 0:
        start_mm_idx += len(features)
    idx = start_mm_idx
    while idx < len(features):
        feature = features[idx]
        offset, length = feature.mm_position.offset, feature.mm_position.length
        if end_token_idx <= offset:
            break  # the block has not reached this item
        if start_token_idx >= offset + length:
            idx += 1  # the block is past this item
            continue
        keys.append(("mm", feature.identifier, offset - start_token_idx))
        if end_token_idx < offset + length:
            break  # the item goes on into the next block
        idx += 1  # the item ends here; the next one may start in this block too
    return keys, idx


def _gen_lora_extra_hash_keys(request) -> list:
    lora = request.lora_request
    if not lora:
        return []
    # The path too: re-pointing a name at another adapter must not reuse the old KV.
    return [("lora", lora.lora_name, lora.lora_path)]


def _gen_prompt_embeds_extra_hash_keys(request, start_token_idx: int, end_token_idx: int) -> list:
    """sha256 of the block's embedding rows (their raw bytes, in order), cached per range."""
    if request.prompt_embeds is None:
        return []
    block_range = (start_token_idx, end_token_idx)
    cached = request._prompt_embeds_per_block_hashes.get(block_range)
    if cached is None:
        rows = request.prompt_embeds[start_token_idx:end_token_idx]
        cached = hashlib.sha256(b"".join(bytes(r) for r in rows)).digest()
        request._prompt_embeds_per_block_hashes[block_range] = cached
    return [("prompt_embeds", cached)]


def generate_block_hash_extra_keys(
    request, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[Optional[tuple], int]:
    """The extra keys of the block [start, end): LoRA (every block), multimodal items the
    block touches, ``cache_salt`` (block 0 only), the block's prompt embeddings; None if
    there are none. -> (keys, the multimodal item the next block starts looking at)."""
    mm_keys, next_mm_idx = _gen_mm_extra_hash_keys(
        request, start_token_idx, end_token_idx, start_mm_idx
    )
    salt = request.cache_salt
    keys = (
        _gen_lora_extra_hash_keys(request)
        + mm_keys
        + ([("cache_salt", salt)] if start_token_idx == 0 and salt else [])
        + _gen_prompt_embeds_extra_hash_keys(request, start_token_idx, end_token_idx)
    )
    return (tuple(keys) if keys else None), next_mm_idx


class BlockHashListWithBlockSize:
    """A request's hashes (made every ``hash_block_size`` tokens) seen at a cache block size
    that is a multiple of it: each hash chains over its whole prefix, so a block's hash is
    the one at the block's last hash boundary. Invariant: read-only, computed on access."""

    def __init__(self, block_hashes: list[bytes], hash_block_size: int, target_block_size: int):
        assert target_block_size % hash_block_size == 0
        self.block_hashes = block_hashes
        self.scale_factor = target_block_size // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        if idx < 0:
            idx += len(self)
        return self.block_hashes[(idx + 1) * self.scale_factor - 1]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def resolve_block_hashes(
    block_hashes,
    hash_block_size: int,
    block_size: int,
    *,
    supports_fine_grained_hash_lookup: bool = False,
    alignment_tokens: Optional[int] = None,
):
    """The request's hashes viewed at ``block_size``; the raw (finer) list when the caller
    looks hits up at ``alignment_tokens`` = ``hash_block_size`` inside a block."""
    if block_size == hash_block_size or isinstance(block_hashes, BlockHashListWithBlockSize):
        return block_hashes
    if (
        supports_fine_grained_hash_lookup
        and alignment_tokens is not None
        and alignment_tokens < block_size
        and block_size % alignment_tokens == 0
    ):
        return block_hashes
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size)


def resolve_kv_cache_block_sizes(
    kv_cache_groups, prefix_match_unit: Optional[int], enable_prefix_caching: bool
) -> tuple[int, int]:
    """(scheduler_block_size, hash_block_size) as vLLM 0.34 resolves them (no context
    parallelism). One group: both are its block size, and a ``prefix_match_unit`` other than
    it is refused while prefix caching is on. Several: the scheduler's is the least common
    multiple of the groups' block sizes; the hash block is the same without prefix caching or
    with a Mamba group outside align mode, else ``prefix_match_unit`` if set, else the greatest
    common divisor of the groups' sizes; every group's size must be a multiple of it."""
    sizes = [g.kv_cache_spec.block_size for g in kv_cache_groups]
    if len(kv_cache_groups) <= 1:
        bs = sizes[0]
        if prefix_match_unit not in (None, bs) and enable_prefix_caching:
            raise ValueError(
                f"Invalid prefix_match_unit={prefix_match_unit}; with a single KV cache group, "
                f"prefix-cache hits land on the block size ({bs}). Unset it or set it to {bs}."
            )
        return bs, bs
    scheduler_block_size = math.lcm(*sizes)
    if not enable_prefix_caching or any(
        g.kv_cache_spec.kind == "mamba" and g.kv_cache_spec.mamba_cache_mode != "align"
        for g in kv_cache_groups
    ):
        return scheduler_block_size, scheduler_block_size
    unit = prefix_match_unit if prefix_match_unit is not None else math.gcd(*sizes)
    if any(bs % unit for bs in sizes):
        raise ValueError(
            f"Invalid prefix_match_unit={unit}; KV cache group block sizes must be divisible "
            f"by prefix_match_unit. Got group block sizes={sizes}."
        )
    return scheduler_block_size, unit


def partial_hash_hits_enabled(kv_cache_groups, hash_block_size: int) -> bool:
    """Hits inside a block (``prefix_match_unit`` finer than the block) need a Mamba group in
    align mode with blocks wider than a hash block, and every other group able to look up
    at hash granularity (full attention and Mamba can; a sliding window cannot)."""
    if not any(
        g.kv_cache_spec.kind == "mamba"
        and g.kv_cache_spec.mamba_cache_mode == "align"
        and g.kv_cache_spec.block_size > hash_block_size
        for g in kv_cache_groups
    ):
        return False
    return all(
        g.kv_cache_spec.kind in ("full", "mamba") or g.kv_cache_spec.block_size == hash_block_size
        for g in kv_cache_groups
    )


def eagle_proof_margin(block_size: int, hash_block_size: int, fine_grained_lookup: bool) -> int:
    """How far past a candidate hit an EAGLE/MTP group looks before dropping back to it: one
    hash block when its lookup is fine-grained (hits inside a block) and its blocks are wider
    than a hash block, else one of its own blocks (vLLM's ``eagle_proof_margin``)."""
    if fine_grained_lookup and block_size > hash_block_size:
        return hash_block_size
    return block_size


def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def get_block_hash(key: bytes) -> bytes:
    return key[:-4]


def get_group_id(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big")  # unsigned: int.from_bytes's default


class RequestBlockHasher:
    """A request's block hasher: called with a request, it returns the hashes of the full blocks
    past ``request.block_hashes`` (vLLM: the ``request_block_hasher`` closure that
    ``get_request_block_hasher`` returns; kvcore's is an object, so the lab can read its block
    size and seed and a replay can call ``extend`` on bare token lists).

    Invariant: the hashes it gives are those of ``hash_block_tokens`` block by block, chained
    from ``none_hash`` (= ``hash_fn(none_hash_seed)``)."""

    def __init__(
        self, hash_fn: HashFn, block_size: int, none_hash_seed: str = DEFAULT_NONE_HASH_SEED
    ) -> None:
        self.hash_fn = hash_fn
        self.block_size = block_size
        self.none_hash_seed = none_hash_seed
        self.none_hash = hash_fn(none_hash_seed)

    def __call__(self, request) -> list[bytes]:
        """The new hashes of ``request``'s full blocks, not yet appended (the caller extends)."""
        return self.new_block_hashes(
            request.block_hashes, request.all_token_ids, request.cache_salt, request
        )

    def extend(
        self,
        block_hashes: list[bytes],
        token_ids: Sequence[int],
        cache_salt: Optional[str],
        request=None,
    ) -> list[bytes]:
        """Append the hashes of newly completed full blocks to ``block_hashes``; returns the new
        ones."""
        new = self.new_block_hashes(block_hashes, token_ids, cache_salt, request)
        block_hashes += new
        return new

    def new_block_hashes(
        self,
        block_hashes: Sequence[bytes],
        token_ids: Sequence[int],
        cache_salt: Optional[str],
        request=None,
    ) -> list[bytes]:
        """The hashes of the full blocks of ``token_ids`` past the ``block_hashes`` given.

        The same chain as ``hash_block_tokens`` block by block, computed in one loop: a replay
        hashes millions of blocks, and the per-block calls were most of its time. A
        ``request`` with a LoRA adapter, multimodal items or prompt embeddings takes the
        general path (``generate_block_hash_extra_keys`` for each block)."""
        bs = self.block_size
        start = len(block_hashes) * bs
        end = len(token_ids) - bs
        if start > end:
            return []
        hash_fn = self.hash_fn
        parent = block_hashes[-1] if block_hashes else self.none_hash
        new = []
        if request is not None and request.has_extra_hash_keys:
            mm_idx = 0
            for i in range(start, end + 1, bs):
                keys, mm_idx = generate_block_hash_extra_keys(request, i, i + bs, mm_idx)
                parent = hash_fn((parent, tuple(token_ids[i : i + bs]), keys))
                new.append(parent)
            return new
        if start == 0 and cache_salt:  # the salt goes into block 0's extra keys only
            parent = hash_fn((parent, tuple(token_ids[:bs]), cache_salt_extra_keys(cache_salt, 0)))
            new.append(parent)
            start = bs
        for i in range(start, end + 1, bs):
            parent = hash_fn((parent, tuple(token_ids[i : i + bs]), None))
            new.append(parent)
        return new


def get_request_block_hasher(
    hash_block_size: int,
    caching_hash_fn: HashFn,
    num_hash_lookahead_tokens: int = 0,
    none_hash_seed: str = DEFAULT_NONE_HASH_SEED,
) -> RequestBlockHasher:
    """The function that hashes a request's new full blocks, every ``hash_block_size`` tokens
    (vLLM's name and first three arguments). ``none_hash_seed`` is kvcore's: the root of the
    chain is ``caching_hash_fn(none_hash_seed)`` (vLLM reads its module's ``NONE_HASH``; see
    ``init_none_hash``).

    kvcore hashes plain blocks only: ``num_hash_lookahead_tokens`` > 0 (vLLM 0.34's hashes that
    also cover the tokens after each block, with an EAGLE or MTP drafter whose block drop is on)
    raises NotImplementedError; the lab refuses that configuration by name before it gets here
    (``engine.lookahead_block_hashes``)."""
    if num_hash_lookahead_tokens:
        raise NotImplementedError("kvcore does not model lookahead block hashes")
    return RequestBlockHasher(caching_hash_fn, hash_block_size, none_hash_seed)


def frontend_block_hashes(request, prefix_hash_config) -> Optional[list[bytes]]:
    """The prompt block hashes a frontend sent with ``request`` (an ``EngineCoreRequest``), or
    None when it sent none or they cannot be the prompt's (vLLM 0.34).

    Taken when the engine hashes blocks (``prefix_hash_config`` is not None: prefix caching or
    a KV connector on) and there is one hash per block the engine would hash now: a block
    counts once its ``num_lookahead_tokens`` following tokens are in the prompt too, so
    ``max(len(prompt) - num_lookahead_tokens, 0) // hash_block_size`` of them. Only the count is
    checked, never the bytes: a frontend that hashes with another algorithm or root but the
    right count is believed. With None the engine hashes the prompt itself (vLLM logs a warning
    once; kvcore's caller sees the None)."""
    block_hashes = request.block_hashes
    if block_hashes is None:
        return None
    prompt_ids = request.prompt_token_ids
    prompt_len = len(prompt_ids) if prompt_ids is not None else 0
    if prefix_hash_config is None:
        return None
    expected = (
        max(prompt_len - prefix_hash_config.num_lookahead_tokens, 0)
        // prefix_hash_config.hash_block_size
    )
    if len(block_hashes) != expected:
        return None
    return block_hashes
