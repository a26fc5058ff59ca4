"""One pass over a trace: the hit rate an unbounded pool reaches, and the smallest pool reaching it.

When it is exact: **sequential** arrival (one request at a time), prefix caching on, one
full-attention KV cache group, free order "v0.33" (vLLM 0.34's, as 0.33's), and no cache key
ever held by two blocks at once (checked during the pass; a capped hit that recomputes a cached
block makes a second copy, and then the pool found is sufficient but may not be the smallest).

Why one pass suffices. The pass replays the trace through kvcore with a pool so large that
nothing is evicted, numbering each block as it joins the free queue's tail. Freed blocks join
the tail in reverse table order, so a block's parent in the hash chain is always nearer the
tail than the block; allocation pops the head; so a smaller pool (same history so far) holds
exactly the hashed free blocks nearest the tail. Request ``i``'s hit survives in a pool of
``N - 1`` usable blocks exactly when, at every allocation since its deepest hit block ``b`` was
freed, the blocks held plus the free hashed blocks at least as near the tail as ``b`` fit in
``N - 1``. That sum only grows from one request to the next (each request allocates at least
one block, and frees at most one unhashed block), so its largest value is at the peak of
request ``i - 1``: ``held(i - 1) + free hashed blocks numbered >= number(b) then``. The
smallest pool is one more (the null block) than the largest such value over all requests, and
than the largest request. Below it, the first request whose value does not fit loses ``b``,
whose key no other block holds: its hit, and the hit rate, drop.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace
from typing import Callable, Optional

from kvcore.core.kv_cache_inspect import num_blocks_cached_under
from kvcore.core.kv_cache_observer import KVCacheObserver
from kvcore.utils.math_utils import cdiv
from paged_kv_lab.workloads.replay import SEQUENTIAL, Replay, ReplaySettings, upper_bound_hits
from paged_kv_lab.workloads.trace_formats import Trace


@dataclass(frozen=True)
class UnboundedAnswer:
    """``hit_rate`` / ``hit_tokens``: what an unbounded pool reaches; ``smallest_num_gpu_blocks``:
    the smallest pool (null block included) that reaches it; ``exact``: whether both are exact
    (``why`` says why not). None where it cannot be said."""

    hit_tokens: Optional[int]
    prompt_tokens: int
    smallest_num_gpu_blocks: Optional[int]
    exact: bool
    why: str
    duplicate_blocks: int = 0

    @property
    def hit_rate(self) -> Optional[float]:
        if self.hit_tokens is None:
            return None
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict:
        return {
            "hit_tokens": self.hit_tokens,
            "hit_rate": self.hit_rate,
            "smallest_num_gpu_blocks": self.smallest_num_gpu_blocks,
            "exact": self.exact,
            "why": self.why,
            "duplicate_blocks": self.duplicate_blocks,
        }


def why_not_exact(settings: ReplaySettings) -> str:
    """Empty when the one-pass answer applies to these settings, else the reason."""
    s = settings.engine
    if settings.arrival != SEQUENTIAL:
        return "requests overlap under timestamps arrival: run a sweep over num_gpu_blocks"
    if not s.enable_prefix_caching:
        return "prefix caching is off: nothing is ever hit"
    if s.sliding_window is not None or s.layer_types is not None:
        return "a sliding-window group frees blocks while a request runs"
    if s.free_order != "v0.33":
        return "the legacy free order puts unhashed blocks at the tail"
    return ""


class _Fenwick:
    """Counts over positions 1..n: add one at a position, count those at or after one."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.tree = array("q", [0]) * (n + 1)
        self.total = 0

    def add(self, i: int, v: int) -> None:
        self.total += v
        tree, n = self.tree, self.n
        while i <= n:
            tree[i] += v
            i += i & -i

    def count_from(self, i: int) -> int:
        s = 0
        tree = self.tree
        i -= 1
        while i > 0:
            s += tree[i]
            i -= i & -i
        return self.total - s


class _StackObserver(KVCacheObserver):
    """The pool's observer during the pass: numbers blocks joining the queue's tail, and at each
    admission measures the pool the hit needs (see the module docstring)."""

    allows_fast_forward = True  # it hears every block operation; skipped steps have none

    def __init__(self, num_blocks: int, max_positions: int) -> None:
        self.number = array("q", [0]) * num_blocks
        self.fenwick = _Fenwick(max_positions)
        self.next = 1
        self.prev_held = 0
        self.prev_hashed_freed = 0
        self.prev_first = 1 << 62
        self.need = 0
        self.max_held = 0
        self.duplicates = 0
        self.evicted = 0
        self.block_pool = None

    def on_blocks_touched(self, blocks) -> None:
        queued = [b for b in blocks if b.ref_cnt == 0 and not b.is_null]
        if not queued:
            return
        number = self.number
        deepest = min(number[b.block_id] for b in queued)
        if deepest < self.prev_first:  # freed before the previous request: it had to survive it
            at_peak = self.fenwick.count_from(deepest) - self.prev_hashed_freed
            self.need = max(self.need, self.prev_held + at_peak)
        for b in queued:
            self.fenwick.add(number[b.block_id], -1)

    def on_blocks_freed(self, ordered, to_head, to_tail) -> None:
        held = sum(1 for b in ordered if not b.is_null)
        self.prev_held = held
        self.max_held = max(self.max_held, held)
        self.prev_hashed_freed = len(to_tail)
        self.prev_first = self.next
        number, fenwick = self.number, self.fenwick
        for b in to_tail:
            number[b.block_id] = self.next
            fenwick.add(self.next, 1)
            self.next += 1

    def on_blocks_cached(self, request, blocks, block_size) -> None:
        pool = self.block_pool
        for b in blocks:
            if num_blocks_cached_under(pool, b.block_hash) > 1:  # a second block holds it
                self.duplicates += 1

    def on_block_evicted(self, block) -> None:
        self.evicted += 1


def unbounded_answer(
    trace: Trace,
    settings: ReplaySettings,
    progress: Optional[Callable[[int, int], None]] = None,
) -> UnboundedAnswer:
    """The one-pass answer for these settings (``num_gpu_blocks`` is ignored)."""
    s = settings.engine
    why = why_not_exact(settings)
    if why:
        return UnboundedAnswer(None, trace.prompt_tokens, None, False, why)
    bs = s.block_size
    upper = upper_bound_hits(trace, bs, s.max_cache_hit_length)
    blocks = [cdiv(r.input_length + r.output_length - 1, bs) for r in trace.requests]
    # Never evicts: every hashed block ever made, plus the running request's.
    pool = sum(b - h // bs for b, h in zip(blocks, upper)) + max(blocks) + 2
    unbounded = replace(settings, engine=replace(s, num_gpu_blocks=pool))
    run = Replay(trace, unbounded)
    observer = _StackObserver(pool, sum(blocks) + 1)
    observer.block_pool = run.block_pool
    run.block_pool.observer = observer
    run.advance(progress=progress)
    result = run.result()
    assert observer.evicted == 0, "the unbounded pool evicted a block"
    # The pass and the key-level bound must agree: both are an infinite cache, in trace order.
    assert result.hit_tokens == sum(upper), (result.hit_tokens, sum(upper))
    smallest = max(observer.need, observer.max_held) + 1
    exact = observer.duplicates == 0
    why = (
        ""
        if exact
        else f"{observer.duplicates:,} blocks were cached while another block held the same key "
        f"(a capped hit recomputed a cached block): the pool found is enough, perhaps not the "
        f"smallest"
    )
    return UnboundedAnswer(
        result.hit_tokens, trace.prompt_tokens, smallest, exact, why, observer.duplicates
    )
