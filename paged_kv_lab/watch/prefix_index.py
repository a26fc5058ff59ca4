"""A vLLM server's prefix cache rebuilt from its KV events, and questions asked of it.

The rules are those of the fixtures' README (shared/fixtures/vllm-kv-events):
a count per (medium, group, hash), not a set, because vLLM does not
de-duplicate; token ids and parent only from an aligned store (a sparse
sliding-window store lists fewer hashes than its tokens cover); AllBlocksCleared
drops the GPU tier. Pure Python: the watcher (watch/watcher.py) feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from kvcore.distributed.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    external_hash_text,
    hash_text,
)

MAX_HASHES = 200_000  # entries kept per watcher (all ranks, media and groups)


@dataclass
class CacheEntry:
    """What is known of one hash in one (medium, group): count = blocks holding it."""

    count: int
    parent_block_hash: Optional[str]
    token_ids: Optional[tuple[int, ...]]
    block_size: int
    extra_keys: Optional[list] = None
    lora_name: Optional[str] = None


@dataclass
class GroupInfo:
    """What BlockStored events tell about a KV cache group."""

    kv_cache_spec_kind: Optional[str] = None
    sliding_window: Optional[int] = None
    block_size: Optional[int] = None


class PrefixCacheIndex:
    """One publisher's prefix cache rebuilt from its events.

    Invariant: every kept entry has count >= 1, and an entry's token ids and
    parent were set by an aligned BlockStored of that hash (else they are None).

    ``keep_tokens=False``: entries keep no token ids (always None), for a reader that matches
    prompts by hash alone (the fleet's router, fleet/index.py), where copying each stored
    block's tokens was most of the cost of applying a store. Counts, tiers and group info are
    as with them; a parent is the first one an aligned store of the hash named (with token
    ids: the one of the store that gave them; a hash names its whole chain, so the two agree).
    """

    def __init__(self, budget: Optional["HashBudget"] = None, keep_tokens: bool = True) -> None:
        self.tiers: dict[tuple[str, str], dict[str, CacheEntry]] = {}
        self.group_info: dict[str, GroupInfo] = {}
        self._budget = budget or HashBudget(MAX_HASHES)
        self.keep_tokens = keep_tokens

    def apply(self, ev) -> None:
        # Removals first: a pool under pressure publishes one per evicted block, the most
        # frequent event by far.
        if isinstance(ev, BlockRemoved):
            key = self._key(ev.medium, ev.group_idx)
            tier = self.tiers.get(key)
            if tier is None:
                return  # removals from a tier we never saw (joined late, or over the cap)
            for h in ev.block_hashes:
                text = hash_text(h)
                entry = tier.get(text)
                if entry is None:
                    continue  # removal of a hash we never saw (joined late, or over the cap)
                entry.count -= 1
                if entry.count <= 0:
                    del tier[text]
                    self._budget.release(1)
            if not tier:
                del self.tiers[key]
        elif isinstance(ev, BlockStored):
            self._stored(ev)
        elif isinstance(ev, AllBlocksCleared):
            self.clear(MEDIUM_GPU)

    def clear(self, medium: Optional[str] = None) -> None:
        for key in [k for k in self.tiers if medium is None or k[0] == medium]:
            self._budget.release(len(self.tiers.pop(key)))

    @staticmethod
    def _key(medium: Optional[str], group_idx: Optional[int]) -> tuple[str, str]:
        return (medium or MEDIUM_GPU, "none" if group_idx is None else str(group_idx))

    def _stored(self, ev: BlockStored) -> None:
        key = self._key(ev.medium, ev.group_idx)
        info = self.group_info.setdefault(key[1], GroupInfo())
        info.block_size = ev.block_size
        if ev.kv_cache_spec_kind is not None:
            info.kv_cache_spec_kind = ev.kv_cache_spec_kind
            info.sliding_window = ev.kv_cache_spec_sliding_window
        tier = self.tiers.setdefault(key, {})
        bs = ev.block_size
        hashes = ev.block_hashes
        token_ids = ev.token_ids
        aligned = len(token_ids) == len(hashes) * bs
        # The parent of block 0 is the event's; of block i > 0, block i - 1's hash. Each hash is
        # turned into text once (a replay's router applies every store of every replica).
        parent = None if ev.parent_block_hash is None else hash_text(ev.parent_block_hash)
        extra = ev.extra_keys or []
        budget = self._budget
        keep = self.keep_tokens
        for i, h in enumerate(hashes):
            text = hash_text(h)
            par = parent if aligned else None
            parent = text
            entry = tier.get(text)
            if entry is None:
                if not budget.take(1):
                    continue
                keys = extra[i] if i < len(extra) else None
                tier[text] = CacheEntry(
                    1,
                    par,
                    tuple(token_ids[i * bs : (i + 1) * bs]) if aligned and keep else None,
                    bs,
                    None if keys is None else list(keys),
                    ev.lora_name,
                )
                continue
            entry.count += 1
            if not aligned or entry.token_ids is not None:
                continue
            if keep:
                entry.token_ids = tuple(token_ids[i * bs : (i + 1) * bs])
                entry.parent_block_hash = par
            elif entry.parent_block_hash is None:
                entry.parent_block_hash = par
        if not tier:
            del self.tiers[key]

    def num_blocks(self) -> dict[tuple[str, str], int]:
        return {k: sum(e.count for e in t.values()) for k, t in self.tiers.items()}

    def state(self, medium: str = MEDIUM_GPU) -> dict:
        """One medium in the fixtures' ``final_state`` shape."""
        groups = {}
        for (med, group), tier in sorted(self.tiers.items()):
            if med != medium or not tier:
                continue
            groups[group] = {
                h: {
                    "parent_block_hash": e.parent_block_hash,
                    "token_ids": None if e.token_ids is None else list(e.token_ids),
                    "block_size": e.block_size,
                    "count": e.count,
                }
                for h, e in sorted(tier.items())
            }
        return {"groups": groups}

    def media(self) -> list[str]:
        return sorted({m for m, _ in self.tiers})


class HashBudget:
    """A cap on entries shared by every index of one watcher (thread-confined)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.refused = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            self.refused += n
            return False
        self.used += n
        return True

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)


def describe_batch(
    rank: int,
    seq: int,
    batch: KVEventBatch,
    replayed: bool = False,
    decode: Optional[Callable[[Sequence[int]], str]] = None,
) -> str:
    """One readable line per batch: what was stored, removed or cleared."""
    parts = []
    for ev in batch.events:
        # a tier other than the GPU (a KV offloading connector's "CPU", "STORAGE") is named
        medium = getattr(ev, "medium", None)
        on = f" on {medium}" if medium not in (None, MEDIUM_GPU) else ""
        if isinstance(ev, BlockStored):
            hs = ", ".join(hash_text(h)[:8] for h in ev.block_hashes) or "none kept"
            text = ""
            if decode is not None and ev.token_ids:
                text = f" {decode(ev.token_ids)!r}"
            parts.append(
                f"stored {len(ev.block_hashes)}{on} in group {ev.group_idx} ({hs}; "
                f"{len(ev.token_ids)} tokens){text}"
            )
        elif isinstance(ev, BlockRemoved):
            parts.append(
                f"removed {', '.join(hash_text(h)[:8] for h in ev.block_hashes)}{on} "
                f"from group {ev.group_idx}"
            )
        else:
            parts.append("cleared all blocks")
    src = " (replayed)" if replayed else ""
    return f"rank {rank} seq {seq}{src}: " + "; ".join(parts)


def leading_hits(
    entries: dict[str, CacheEntry] | Iterable[str],
    token_ids: Sequence[int],
    block_size: int,
    hash_algo: str = "sha256",
    hash_seed: str = "vllm-none-hash",
    cache_salt: Optional[str] = None,
    use_int_block_hashes: bool = True,
) -> tuple[int, list[str]]:
    """How many leading full blocks of ``token_ids`` the server holds, hashed as the server does.

    vLLM's NONE_HASH is hash_fn(seed) with seed = PYTHONHASHSEED when set, else
    "vllm-none-hash" for sha256. Returns (number of leading blocks held, the hash
    text of every full block of the prompt).
    """
    from kvcore.core.kv_cache_utils import cache_salt_extra_keys, hash_block_tokens
    from kvcore.utils.hashing import get_hash_fn_by_name

    hash_fn = get_hash_fn_by_name(hash_algo)
    none = hash_fn(hash_seed)
    held = set(entries)
    parent = None
    texts = []
    hits = 0
    for i in range(len(token_ids) // block_size):
        h = hash_block_tokens(
            hash_fn,
            parent,
            token_ids[i * block_size : (i + 1) * block_size],
            cache_salt_extra_keys(cache_salt, i),
            none,
        )
        parent = h
        texts.append(external_hash_text(h, use_int_block_hashes))
        if hits == i and texts[-1] in held:
            hits += 1
    return hits, texts
