"""SGLang 0.5.23's radix tree over cached tokens (``sglang/srt/mem_cache/radix_cache.py``).

The tree's edges are token runs: each node holds a ``key`` (its tokens, page-aligned) and a
``value`` (the KV slot indices of those tokens). A request's cached prefix is the path that its
tokens spell from the root; two requests that diverge inside an edge split it into a shared
parent and two children. Only leaves nobody has locked can be evicted; eviction pops them by the
strategy's priority (LRU: last access time) and a parent whose last child went joins the heap.

Our model keeps SGLang's names, signatures and order of work, with three simplifications that do
not change any decision: values are tuples of slot ids instead of tensors; the clock is a
counter that ticks on each of SGLang's ``time.monotonic()`` calls (strictly increasing, so no two
access times tie); and the EAGLE bigram view, cache salt and KV-event publishing are left out.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from paged_kv_lab.designs import design_events as ev
from paged_kv_lab.designs.sglang.srt.mem_cache.evict_policy import get_eviction_strategy


class RadixKey:
    """A run of token ids (and an optional namespace ``extra_key``) that slices into keys."""

    __slots__ = ("token_ids", "extra_key")

    def __init__(self, token_ids: Sequence[int], extra_key: str | None = None):
        self.token_ids = tuple(token_ids)
        self.extra_key = extra_key

    def __len__(self) -> int:
        return len(self.token_ids)

    def __iter__(self):
        return iter(self.token_ids)

    def __getitem__(self, idx: slice) -> RadixKey:
        if isinstance(idx, int):
            idx = slice(idx, idx + 1 if idx != -1 else None)
        return RadixKey(self.token_ids[idx], self.extra_key)

    def __repr__(self) -> str:
        return f"RadixKey({list(self.token_ids[:10])}{'...' if len(self) > 10 else ''})"

    def page_aligned(self, page_size: int) -> RadixKey:
        if page_size == 1:
            return self
        return self[: len(self) // page_size * page_size]

    def match(self, other: RadixKey, page_size: int = 1) -> int:
        """How many leading tokens the two keys share, rounded down to whole pages."""
        if self.extra_key != other.extra_key:
            raise ValueError(
                f"keys of different namespaces: {self.extra_key!r}, {other.extra_key!r}"
            )
        n = 0
        for a, b in zip(self.token_ids, other.token_ids):
            if a != b:
                break
            n += 1
        return n if page_size == 1 else n // page_size * page_size

    def child_key(self, page_size: int = 1):
        """The dict key a parent files this key's node under: its first token (or first page)."""
        plain = self.token_ids[0] if page_size == 1 else tuple(self.token_ids[:page_size])
        return plain if self.extra_key is None else (self.extra_key, plain)


class TreeNode:
    """One edge of the tree: ``key`` tokens whose K/V sit in the slots ``value``.

    ``lock_ref`` counts the requests whose matched path runs through this node; while it is
    above 0 the node's tokens are protected and the node is never an evictable leaf.
    """

    def __init__(self, node_id: int, now: Callable[[], int], priority: int = 0):
        self.children: dict[Any, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key: RadixKey | None = None
        self.value: tuple[int, ...] | None = None
        self.lock_ref = 0
        self.last_access_time = now()
        self.creation_time = now()
        self.hit_count = 0
        self.priority = priority
        self.id = node_id

    @property
    def evicted(self) -> bool:
        return self.value is None

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access_time < other.last_access_time


@dataclass(frozen=True)
class MatchPrefixParams:
    key: RadixKey
    request_id: str | None = None


@dataclass(frozen=True)
class MatchResult:
    """``device_prefix_len`` tokens of the key are cached, on the path ending at
    ``last_device_node``."""

    device_prefix_len: int
    last_device_node: TreeNode
    values: tuple[int, ...] = ()


@dataclass(frozen=True)
class InsertParams:
    key: RadixKey
    value: tuple[int, ...] | None = None
    priority: int = 0
    inserted_len: int = 0
    request_id: str | None = None


@dataclass(frozen=True)
class InsertResult:
    """``prefix_len`` tokens of the key were already in the tree (their new slots are
    duplicates the caller frees); ``last_device_node`` ends the key's path."""

    prefix_len: int
    last_device_node: TreeNode


@dataclass(frozen=True)
class EvictParams:
    num_tokens: int = 0
    request_id: str | None = None


@dataclass(frozen=True)
class EvictResult:
    num_tokens_evicted: int = 0


class RadixCache:
    """SGLang's prefix tree of cached tokens.

    Invariants: ``evictable_size_`` is the number of tokens in nodes with ``lock_ref == 0`` and
    ``protected_size_`` those with ``lock_ref > 0`` (the root excluded); ``evictable_leaves`` is
    exactly the set of unlocked nodes without children; every child is filed under its key's
    ``child_key`` and every key is page-aligned.
    """

    def __init__(
        self,
        page_size: int = 1,
        token_to_kv_pool_allocator: Any = None,
        eviction_policy: str = "lru",
        eviction_policy_config: dict | None = None,
        disable: bool = False,
        observer: Callable[[ev.DesignEvent], None] | None = None,
        clock: Callable[[], int] | None = None,
    ):
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, not {page_size}")
        self.disable = disable
        self.page_size = page_size
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.eviction_policy = eviction_policy.lower()
        self.eviction_strategy = get_eviction_strategy(
            "lru" if disable else self.eviction_policy,
            None if disable else eviction_policy_config,
        )
        self.observer = observer
        self._now = clock if clock is not None else itertools.count(1).__next__
        self._node_ids = itertools.count()
        self.evictable_leaves: set[TreeNode] = set()
        self.reset()

    @classmethod
    def create_simulated(cls, page_size: int = 1, **kwargs) -> RadixCache:
        """A tree without a memory pool, as SGLang's own ``create_simulated``."""
        return cls(page_size=page_size, **kwargs)

    def _emit(self, event: ev.DesignEvent) -> None:
        if self.observer is not None:
            self.observer(event)

    def _new_node(self, priority: int = 0) -> TreeNode:
        return TreeNode(next(self._node_ids), self._now, priority)

    # ----- public API ---------------------------------------------------------------------------

    def reset(self) -> None:
        self.root_node = self._new_node(priority=-(2**63))
        self.root_node.key = RadixKey(())
        self.root_node.value = ()
        self.root_node.lock_ref = 1
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self.evictable_leaves.clear()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """The longest cached page-aligned prefix of ``params.key``; may split the node the match
        ends inside, and refreshes the access time of every node on the path."""
        key = params.key
        if self.disable or len(key) == 0:
            return MatchResult(0, self.root_node)
        key = key.page_aligned(self.page_size)
        if len(key) == 0:
            return MatchResult(0, self.root_node)
        value, last_node, visited = self._match_prefix_helper(
            self.root_node, key, params.request_id
        )
        flat = tuple(itertools.chain.from_iterable(value))
        self._emit(
            ev.PrefixMatched(
                request_id=params.request_id,
                num_tokens=len(key),
                prefix_len=len(flat),
                node_id=last_node.id,
                nodes_visited=visited,
            )
        )
        return MatchResult(len(flat), last_node, flat)

    def insert(self, params: InsertParams) -> InsertResult:
        """Add the page-aligned ``params.key`` with its slots; returns how much was there."""
        if self.disable:
            return InsertResult(0, self.root_node)
        key = params.key.page_aligned(self.page_size)
        if params.value is not None:
            value = tuple(params.value[: len(key)])
        else:
            value = key.token_ids  # SGLang's test fallback: the token ids stand in for slots
        return self._insert_helper(
            self.root_node, key, value, params.priority, params.inserted_len, params.request_id
        )

    def evict(self, params: EvictParams) -> EvictResult:
        """Free at least ``params.num_tokens`` tokens (whole leaves) while evictable leaves
        remain, smallest priority first; a parent left childless and unlocked joins the heap."""
        if self.disable:
            return EvictResult()
        num_tokens = params.num_tokens
        heap = [(self.eviction_strategy.get_priority(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            priority, x = heapq.heappop(heap)
            if self.token_to_kv_pool_allocator is not None:
                self.token_to_kv_pool_allocator.free_segment(x.value)
            num_evicted += len(x.value)
            self._delete_leaf(x)
            self._emit(
                ev.LeafEvicted(
                    request_id=params.request_id,
                    node_id=x.id,
                    parent_id=x.parent.id,
                    num_tokens=len(x.value),
                    priority=priority,
                )
            )
            if len(x.parent.children) == 0 and x.parent.lock_ref == 0:
                heapq.heappush(heap, (self.eviction_strategy.get_priority(x.parent), x.parent))
        self._emit(
            ev.EvictionDone(
                request_id=params.request_id, num_tokens=num_tokens, num_tokens_evicted=num_evicted
            )
        )
        return EvictResult(num_evicted)

    def inc_lock_ref(self, node: TreeNode, request_id: str | None = None) -> int:
        """Lock the path from ``node`` to the root; returns the change in evictable tokens."""
        if self.disable:
            return 0
        start, delta = node, 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            self._update_leaf_status(node)
            node = node.parent
        self._emit_lock(start, True, delta, request_id)
        return delta

    def dec_lock_ref(self, node: TreeNode, request_id: str | None = None) -> int:
        """Unlock the path from ``node`` to the root; returns the change in evictable tokens."""
        if self.disable:
            return 0
        start, delta = node, 0
        while node is not self.root_node:
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            self._update_leaf_status(node)
            node = node.parent
        self._emit_lock(start, False, delta, request_id)
        return delta

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        total, stack = 0, [self.root_node]
        while stack:
            node = stack.pop()
            total += len(node.value)
            stack.extend(c for c in node.children.values() if not c.evicted)
        return total

    def nodes(self) -> list[TreeNode]:
        """Every node, root first, children in insertion order (depth first)."""
        out, stack = [], [self.root_node]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(list(node.children.values())))
        return out

    # ----- internals ----------------------------------------------------------------------------

    def _emit_lock(self, node: TreeNode, locked: bool, delta: int, request_id) -> None:
        self._emit(
            ev.LockChanged(
                request_id=request_id,
                node_id=node.id,
                locked=locked,
                delta=delta,
                evictable_size=self.evictable_size_,
                protected_size=self.protected_size_,
            )
        )

    def _match_prefix_helper(self, node: TreeNode, key: RadixKey, request_id):
        access_time = self._now()
        node.last_access_time = access_time
        child_key = key.child_key(self.page_size)
        value, visited = [], 0
        while len(key) > 0 and child_key in node.children:
            child = node.children[child_key]
            child.last_access_time = access_time
            visited += 1
            prefix_len = child.key.match(key, page_size=self.page_size)
            if prefix_len < len(child.key):
                new_node = self._split_node(child.key, child, prefix_len, request_id)
                value.append(new_node.value)
                node = new_node
                break
            value.append(child.value)
            node = child
            key = key[prefix_len:]
            if len(key):
                child_key = key.child_key(self.page_size)
        return value, node, visited

    def _split_node(self, key: RadixKey, child: TreeNode, split_len: int, request_id) -> TreeNode:
        new_node = self._new_node(priority=child.priority)
        new_node.hit_count = child.hit_count
        new_node.children = {key[split_len:].child_key(self.page_size): child}
        new_node.parent = child.parent
        new_node.lock_ref = child.lock_ref
        new_node.key = child.key[:split_len]
        new_node.value = child.value[:split_len]
        child.parent = new_node
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        new_node.parent.children[key.child_key(self.page_size)] = new_node
        self._emit(
            ev.NodeSplit(
                request_id=request_id, node_id=new_node.id, child_id=child.id, split_len=split_len
            )
        )
        return new_node

    def _insert_helper(self, node, key, value, priority, inserted_len, request_id) -> InsertResult:
        priority = priority or 0
        access_time = self._now()
        node.last_access_time = access_time
        node.priority = max(node.priority, priority)
        if len(key) == 0:
            return InsertResult(0, node)
        child_key = key.child_key(self.page_size)
        total_prefix_length = 0
        while len(key) > 0 and child_key in node.children:
            node = node.children[child_key]
            node.last_access_time = access_time
            prefix_len = node.key.match(key, page_size=self.page_size)
            total_prefix_length += prefix_len
            key = key[prefix_len:]
            value = value[prefix_len:]
            if prefix_len < len(node.key):
                node = self._split_node(node.key, node, prefix_len, request_id)
            node.priority = max(node.priority, priority)
            if total_prefix_length > inserted_len:
                node.hit_count += 1
            if len(key):
                child_key = key.child_key(self.page_size)
        if len(key):
            new_node = self._new_node(priority=priority)
            new_node.parent = node
            new_node.key = key
            new_node.value = tuple(value)
            if total_prefix_length + len(key) > inserted_len:
                new_node.hit_count += 1
            node.children[child_key] = new_node
            self.evictable_size_ += len(key)
            self._update_leaf_status(node)
            self._update_leaf_status(new_node)
            self._emit(
                ev.NodeInserted(
                    request_id=request_id,
                    node_id=new_node.id,
                    parent_id=node.id,
                    num_tokens=len(key),
                    prefix_len=total_prefix_length,
                )
            )
            node = new_node
        return InsertResult(total_prefix_length, node)

    def _delete_leaf(self, node: TreeNode) -> None:
        removed = node.parent.children.pop(node.key.child_key(self.page_size), None)
        assert removed is node, "a leaf must be filed under its own child key"
        self.evictable_size_ -= len(node.key)
        self.evictable_leaves.discard(node)
        self._update_leaf_status(node.parent)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node.evicted or node.lock_ref > 0:
            self.evictable_leaves.discard(node)
            return
        if any(not c.evicted for c in node.children.values()):
            self.evictable_leaves.discard(node)
            return
        self.evictable_leaves.add(node)
