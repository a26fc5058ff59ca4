"""SGLang 0.5.23's eviction strategies (``sglang/srt/mem_cache/evict_policy.py``).

Each strategy maps an evictable leaf to a priority; ``RadixCache.evict`` pops the smallest first.
The cheap ones are here under SGLang's names; SGLang's TLRU (tail-latency LRU) needs per-branch
conversation lengths that this model does not keep, so it is left out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paged_kv_lab.designs.sglang.srt.mem_cache.radix_cache import TreeNode


class EvictionStrategy(ABC):
    """Orders evictable leaves: a smaller priority leaves the tree first."""

    @abstractmethod
    def get_priority(self, node: TreeNode): ...


class LRUStrategy(EvictionStrategy):
    """Least recently matched or inserted first."""

    def get_priority(self, node: TreeNode) -> float:
        return node.last_access_time


class LFUStrategy(EvictionStrategy):
    """Fewest hits first; among equals, least recently used."""

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.hit_count, node.last_access_time)


class FIFOStrategy(EvictionStrategy):
    """Oldest node first, however often it was used."""

    def get_priority(self, node: TreeNode) -> float:
        return node.creation_time


class MRUStrategy(EvictionStrategy):
    """Most recently used first."""

    def get_priority(self, node: TreeNode) -> float:
        return -node.last_access_time


class FILOStrategy(EvictionStrategy):
    """Newest node first."""

    def get_priority(self, node: TreeNode) -> float:
        return -node.creation_time


class PriorityStrategy(EvictionStrategy):
    """Lower request priority first, then least recently used."""

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        return (node.priority, node.last_access_time)


class SLRUStrategy(EvictionStrategy):
    """Segmented LRU: nodes hit fewer than ``protected_threshold`` times go first, LRU within."""

    def __init__(self, protected_threshold: int = 2):
        self.protected_threshold = protected_threshold

    def get_priority(self, node: TreeNode) -> tuple[int, float]:
        protected = 1 if node.hit_count >= self.protected_threshold else 0
        return (protected, node.last_access_time)


EVICTION_POLICIES = {
    "lru": LRUStrategy,
    "lfu": LFUStrategy,
    "fifo": FIFOStrategy,
    "mru": MRUStrategy,
    "filo": FILOStrategy,
    "priority": PriorityStrategy,
    "slru": SLRUStrategy,
}


def get_eviction_strategy(eviction_policy: str, config: dict | None = None) -> EvictionStrategy:
    """The strategy named ``eviction_policy`` (case-insensitive); ValueError names the choices."""
    policy = eviction_policy.lower()
    if policy not in EVICTION_POLICIES:
        choices = ", ".join(EVICTION_POLICIES)
        raise ValueError(f"unknown eviction policy {eviction_policy!r}; choose one of: {choices}")
    return EVICTION_POLICIES[policy](**(config or {}))
