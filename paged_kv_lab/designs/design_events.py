"""The decisions the two other designs make, one frozen class per kind.

SGLang's radix tree and nano-vllm's block manager tell their observer (a callable given at
construction) each decision as they make it, as kvcore tells its ``KVCacheObserver``. Every event
has ``kind`` (its tag) and ``request_id`` (None where the caller named no request); the other
fields say why. ``to_dict`` gives the JSON form the side-by-side lesson records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True, kw_only=True)
class DesignEvent:
    """One decision of one design; frozen, so a recorded run cannot change after the fact."""

    kind: ClassVar[str] = ""
    design: ClassVar[str] = ""
    request_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "design": self.design, **dataclasses.asdict(self)}


# --- SGLang's RadixCache -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PrefixMatched(DesignEvent):
    """``match_prefix`` walked the tree: ``prefix_len`` of ``num_tokens`` (page-aligned) were
    cached, ending at node ``node_id``; the walk refreshed each node's access time."""

    kind: ClassVar[str] = "prefix_matched"
    design: ClassVar[str] = "sglang"
    num_tokens: int
    prefix_len: int
    node_id: int
    nodes_visited: int


@dataclass(frozen=True, kw_only=True)
class NodeSplit(DesignEvent):
    """A match or insert ended inside node ``child_id``'s key, so its first ``split_len`` tokens
    became a new parent ``node_id`` (``_split_node``); the tree keeps one edge per divergence."""

    kind: ClassVar[str] = "node_split"
    design: ClassVar[str] = "sglang"
    node_id: int
    child_id: int
    split_len: int


@dataclass(frozen=True, kw_only=True)
class NodeInserted(DesignEvent):
    """``insert`` found ``prefix_len`` tokens already in the tree and hung the remaining
    ``num_tokens`` under ``parent_id`` as a new leaf ``node_id``."""

    kind: ClassVar[str] = "node_inserted"
    design: ClassVar[str] = "sglang"
    node_id: int
    parent_id: int
    num_tokens: int
    prefix_len: int


@dataclass(frozen=True, kw_only=True)
class LockChanged(DesignEvent):
    """``inc_lock_ref`` / ``dec_lock_ref`` on the path from ``node_id`` to the root: ``delta``
    tokens moved between evictable and protected (negative: now protected)."""

    kind: ClassVar[str] = "lock_changed"
    design: ClassVar[str] = "sglang"
    node_id: int
    locked: bool
    delta: int
    evictable_size: int
    protected_size: int


@dataclass(frozen=True, kw_only=True)
class LeafEvicted(DesignEvent):
    """``evict`` removed leaf ``node_id`` (``num_tokens`` tokens, the smallest priority among the
    evictable leaves); its parent may now be a leaf itself."""

    kind: ClassVar[str] = "leaf_evicted"
    design: ClassVar[str] = "sglang"
    node_id: int
    parent_id: int
    num_tokens: int
    priority: Any


@dataclass(frozen=True, kw_only=True)
class EvictionDone(DesignEvent):
    """``evict(EvictParams(num_tokens))`` freed ``num_tokens_evicted`` tokens (at least the ask
    when enough was evictable: whole leaves go)."""

    kind: ClassVar[str] = "eviction_done"
    design: ClassVar[str] = "sglang"
    num_tokens: int
    num_tokens_evicted: int


@dataclass(frozen=True, kw_only=True)
class EvictableLeaf:
    """A leaf the eviction could take: unlocked, no children; ``priority`` is the strategy's
    (LRU: its last access time), smaller leaves first."""

    node_id: int
    num_tokens: int
    priority: Any


@dataclass(frozen=True, kw_only=True)
class EvictionAsked(DesignEvent):
    """SGLang's scheduler (``evict_from_tree_cache``) needed ``num_tokens`` slots with only
    ``available`` free, so it asked the tree to evict the difference; ``leaves`` are the
    evictable leaves at that moment, in the order the strategy takes them."""

    kind: ClassVar[str] = "eviction_asked"
    design: ClassVar[str] = "sglang"
    num_tokens: int
    available: int
    leaves: tuple[EvictableLeaf, ...]


# --- nano-vllm's BlockManager --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BlockHit(DesignEvent):
    """``allocate``: block ``index`` of the sequence was found by its chained hash with the same
    token ids, so block ``block_id`` is shared (``revived``: it came back from the free deque).
    ``wrong_prefix`` (2f352ae only): the entry was stale and the reused block holds the same
    token ids after another prefix, so the hit is wrong (its own hash differs)."""

    kind: ClassVar[str] = "block_hit"
    design: ClassVar[str] = "nano"
    index: int
    block_id: int
    revived: bool
    wrong_prefix: bool = False


@dataclass(frozen=True, kw_only=True)
class BlockMiss(DesignEvent):
    """``allocate``: block ``index`` took the free deque's leftmost id ``block_id``. ``reason``:
    ``partial`` (not full, never hashed), ``absent`` (hash unknown), ``stale`` (the table still
    names a block that was reused since), ``collision`` (that block has the hash but other token
    ids) or ``after_miss`` (an earlier block missed, so every later one does)."""

    kind: ClassVar[str] = "block_miss"
    design: ClassVar[str] = "nano"
    index: int
    block_id: int
    reason: str
    evicted_hash: bool


@dataclass(frozen=True, kw_only=True)
class BlockReleased(DesignEvent):
    """``deallocate``: block ``block_id``'s reference count fell to ``ref_count``; at 0 it went to
    the right end of the free deque, its hash still in the table until the id is reused."""

    kind: ClassVar[str] = "block_released"
    design: ClassVar[str] = "nano"
    block_id: int
    ref_count: int


@dataclass(frozen=True, kw_only=True)
class BlockAppended(DesignEvent):
    """``may_append``: the sequence's last block filled up, so a new block ``block_id`` was taken
    from the free deque's left end."""

    kind: ClassVar[str] = "block_appended"
    design: ClassVar[str] = "nano"
    block_id: int


@dataclass(frozen=True, kw_only=True)
class BlockSealed(DesignEvent):
    """``may_append``: block ``block_id`` just became full, so it got its chained hash and entered
    the hash table; from now on another sequence can hit it."""

    kind: ClassVar[str] = "block_sealed"
    design: ClassVar[str] = "nano"
    block_id: int
    block_hash: int
