"""The requests of a recorded vLLM run, step by step, through SGLang's tree and nano-vllm's table.

A recorded run (kvcore on the real model) says, after each step, which requests were admitted,
which tokens they have and which finished. ``SideBySide.advance`` makes the same moves on the
other two designs at the same step, with the same KV memory in tokens:

- admitted: SGLang matches the prompt (at most ``len - 1`` tokens), locks the node and takes
  slots for the rest, evicting exactly the shortfall; nano-vllm ``can_allocate``s and
  ``allocate``s the prompt, every admission of the step before any of the step's frees (as its
  scheduler batches prefills);
- one more generated token: SGLang takes one slot for the token before it (the newest token
  has no K/V yet); nano-vllm first ends the step that computed the token before it
  (``postprocess``: at bb823b3 ``hash_blocks`` hashes the blocks it filled), then
  ``may_append``s, as its scheduler does before each decode step;
- finished (or preempted): SGLang inserts the tokens it holds K/V for, frees the duplicates and
  the unaligned tail and unlocks; nano-vllm ends the step, then ``deallocate``s.

nano-vllm runs at ``nano_commit`` (bb823b3 unless it says 2f352ae).

Every decision comes back as ``designs.events`` events, and after each step a frozen view of
both structures for the page to draw.

``SideBySide`` is a driver (paged_kv_lab/run/driver.py) that follows a recorded run: what it takes
is the run's next step (its snapshot, holding the requests that step admitted, grew and
finished), ``step`` makes that step's moves on both designs and returns a ``DesignStep``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from paged_kv_lab.designs import design_events as ev
from paged_kv_lab.designs.nanovllm import HEAD
from paged_kv_lab.designs.nanovllm.engine.block_manager import BlockManager
from paged_kv_lab.designs.nanovllm.engine.scheduler import (
    postprocess,
    schedule_decode,
    schedule_prefill,
)
from paged_kv_lab.designs.nanovllm.engine.sequence import Sequence
from paged_kv_lab.designs.sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
from paged_kv_lab.designs.sglang.srt.mem_cache.radix_cache import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
    RadixCache,
    RadixKey,
)


@dataclass(frozen=True)
class TreeNodeView:
    node_id: int
    parent_id: int | None
    token_ids: tuple[int, ...]
    lock_ref: int
    last_access_time: int


@dataclass(frozen=True)
class TreeView:
    """SGLang's tree after a step: nodes root first (depth first), sizes in tokens."""

    nodes: tuple[TreeNodeView, ...]
    evictable_size: int
    protected_size: int
    free_slots: int


@dataclass(frozen=True)
class NanoBlockView:
    block_id: int
    ref_count: int
    hash: int
    token_ids: tuple[int, ...]
    free_pos: int | None  # 0 = leftmost of the free deque (taken next); None = in use


@dataclass(frozen=True)
class NanoView:
    blocks: tuple[NanoBlockView, ...]
    num_hashes: int


@dataclass(frozen=True)
class DesignStep:
    """One step on both designs: what they decided and how they look after it."""

    step: int
    events: tuple[ev.DesignEvent, ...]
    tree: TreeView
    nano: NanoView
    sglang_hits: dict[str, int]
    nano_hits: dict[str, int]
    errors: tuple[str, ...] = ()  # what either design could not do, up to this step


class HitTokens(NamedTuple):
    """A request's prefix-cache hit at admission on each design (None: not admitted there)."""

    sglang: Optional[int]
    nano: Optional[int]


class _Held:
    """What SGLang keeps for a running request: its slots and its locked node."""

    def __init__(self, node, row, prefix_len):
        self.node, self.row, self.prefix_len = node, row, prefix_len


class SideBySide:
    """Both designs fed from one recorded run's snapshots; ``steps`` grows with ``advance``.

    Invariants: the followed run's steps are taken in order, one ``DesignStep`` each; a request
    is admitted on both designs at the step the run admitted it and released at the step it
    finished or was preempted there; what a design cannot do is kept in ``errors``, never
    raised."""

    def __init__(
        self, num_gpu_blocks: int, block_size: int, page_size: int = 1, nano_commit: str = HEAD
    ):
        if block_size < 2:  # nano-vllm's may_append: 2f352ae asserts, bb823b3 never grows
            raise ValueError(
                f"nano-vllm's block manager needs block_size of at least 2, not {block_size}"
            )
        self.block_size = block_size
        self.page_size = page_size
        self._events: list[ev.DesignEvent] = []
        size = num_gpu_blocks * block_size
        self.allocator = PagedTokenToKVPoolAllocator(size - size % page_size, page_size)
        self.tree = RadixCache(
            page_size=page_size,
            token_to_kv_pool_allocator=self.allocator,
            observer=self._events.append,
        )
        self.block_manager = BlockManager(
            num_gpu_blocks, block_size, observer=self._events.append, commit=nano_commit
        )
        self.nano_commit = self.block_manager.commit
        self._held: dict[str, _Held] = {}
        self._seqs: dict[str, Sequence] = {}
        self._done: set[str] = set()
        self.sglang_hits: dict[str, int] = {}
        self.nano_hits: dict[str, int] = {}
        self.steps: list[DesignStep] = []
        self.errors: list[str] = []
        self._pending: list = []  # the followed run's steps taken and not yet made
        self.initial = DesignStep(0, (), self.tree_view(), self.nano_view(), {}, {})

    def at(self, step: int) -> DesignStep:
        """Both designs after ``step`` (0: before the first step, both empty)."""
        return self.steps[step - 1] if step > 0 else self.initial

    # ----- SGLang -------------------------------------------------------------------------------

    def _sg_alloc(self, n: int, rid: str) -> list[int]:
        if n <= 0:
            return []
        need = -(-n // self.page_size) * self.page_size
        available = self.allocator.available_size()
        if need > available:
            self._events.append(
                ev.EvictionAsked(
                    request_id=rid,
                    num_tokens=need,
                    available=available,
                    leaves=self._evictable_leaves(),
                )
            )
            self.tree.evict(EvictParams(num_tokens=need - available, request_id=rid))
        slots = self.allocator.alloc(n)
        if slots is None:
            raise MemoryError(f"SGLang: no room for request {rid}'s {n} tokens")
        return slots

    def _evictable_leaves(self) -> tuple[ev.EvictableLeaf, ...]:
        """The leaves ``evict`` would pop, in its order (the strategy's priority, then the node's
        own order on a tie, as its heap has them)."""
        rank = self.tree.eviction_strategy.get_priority
        return tuple(
            ev.EvictableLeaf(node_id=n.id, num_tokens=len(n.value), priority=rank(n))
            for n in sorted(self.tree.evictable_leaves, key=lambda n: (rank(n), n))
        )

    def _sg_admit(self, rid: str, prompt: list[int]) -> None:
        key = RadixKey(prompt[: max(len(prompt) - 1, 0)])
        m = self.tree.match_prefix(MatchPrefixParams(key=key, request_id=rid))
        self.tree.inc_lock_ref(m.last_device_node, rid)
        row = list(m.values) + self._sg_alloc(len(prompt) - m.device_prefix_len, rid)
        self._held[rid] = _Held(m.last_device_node, row, m.device_prefix_len)
        self.sglang_hits[rid] = m.device_prefix_len

    def _sg_grow(self, rid: str, kv_len: int) -> None:
        held = self._held[rid]
        extra = kv_len - len(held.row)
        if extra <= 0:
            return
        ps = self.page_size
        own = len(held.row) - held.prefix_len
        room = -(-own // ps) * ps - own if own else 0
        take = min(room, extra)
        held.row += [held.row[-1] + 1 + i for i in range(take)]
        held.row += self._sg_alloc(extra - take, rid)

    def _sg_release(self, rid: str, tokens: list[int]) -> None:
        held = self._held.pop(rid)
        tokens = tokens[: len(held.row)]
        key_len = len(tokens) // self.page_size * self.page_size
        ins = self.tree.insert(
            InsertParams(
                key=RadixKey(tokens[:key_len]), value=tuple(held.row[:key_len]), request_id=rid
            )
        )
        self.allocator.free_segment(held.row[held.prefix_len : ins.prefix_len])
        self.allocator.free_segment(held.row[key_len:])
        self.tree.dec_lock_ref(held.node, rid)

    # ----- the step -----------------------------------------------------------------------------

    def add_request(self, snapshot) -> None:
        """Take the followed run's next step (``snapshot``: the state after it); the next
        ``step`` makes its moves."""
        self._pending.append(snapshot)

    def step(self) -> DesignStep:
        """The oldest step taken, made on both designs."""
        return self._make(self._pending.pop(0))

    def has_unfinished(self) -> bool:
        return bool(self._pending)

    def kv_events(self) -> tuple:
        return ()

    def outputs(self) -> dict[str, HitTokens]:
        """Per request admitted on either design, in order, its hit on each."""
        ids = dict.fromkeys([*self.nano_hits, *self.sglang_hits])
        return {r: HitTokens(self.sglang_hits.get(r), self.nano_hits.get(r)) for r in ids}

    def advance(self, snapshot) -> DesignStep:
        """Make the moves that ``snapshot`` (the state after a step of the vLLM run) shows."""
        self.add_request(snapshot)
        return self.step()

    def _make(self, snapshot) -> DesignStep:
        self._events.clear()
        admitted = set()
        for r in snapshot.requests:  # nano-vllm's schedule: the step's prefill batch
            rid = r.request_id
            if rid in self._done or rid in self._seqs:
                continue
            if r.num_computed_tokens == 0 and r.status != "running":
                continue
            admitted.add(rid)
            seq = Sequence(list(r.prompt_token_ids), self.block_size, seq_id=rid)
            if schedule_prefill(self.block_manager, seq):
                self.nano_hits[rid] = seq.num_cached_tokens
                self._seqs[rid] = seq
            else:
                self.errors.append(f"nano-vllm: no free blocks for request {rid}")
                self._seqs[rid] = None
        for r in snapshot.requests:
            rid = r.request_id
            if rid in self._done or rid not in self._seqs:
                continue
            finished = r.status.startswith("finished") or r.status == "preempted"
            if rid in admitted:
                try:
                    self._sg_admit(rid, list(r.prompt_token_ids))
                except MemoryError as e:
                    self.errors.append(str(e))
            tokens = list(r.prompt_token_ids) + list(r.output_token_ids)
            seq = self._seqs.get(rid)
            if seq is not None:
                while len(seq) < len(tokens) and not (finished and len(seq) == len(tokens) - 1):
                    postprocess(self.block_manager, seq)
                    seq.append_token(tokens[len(seq)])
                    if not schedule_decode(self.block_manager, seq):
                        self.errors.append(f"nano-vllm: no free block to grow request {rid}")
                        break
            if rid in self._held:
                try:
                    self._sg_grow(rid, len(tokens) - 1)
                except MemoryError as e:
                    self.errors.append(str(e))
            if finished:
                if rid in self._held:
                    self._sg_release(rid, tokens)
                if seq is not None and seq.block_table:
                    postprocess(self.block_manager, seq)
                    self.block_manager.deallocate(seq)
                self._done.add(rid)
        step = DesignStep(
            step=snapshot.step,
            events=tuple(self._events),
            tree=self.tree_view(),
            nano=self.nano_view(),
            sglang_hits=dict(self.sglang_hits),
            nano_hits=dict(self.nano_hits),
            errors=tuple(self.errors),
        )
        self.steps.append(step)
        return step

    def tree_view(self) -> TreeView:
        nodes = tuple(
            TreeNodeView(
                n.id,
                None if n.parent is None else n.parent.id,
                n.key.token_ids,
                n.lock_ref,
                n.last_access_time,
            )
            for n in self.tree.nodes()
        )
        return TreeView(
            nodes,
            self.tree.evictable_size(),
            self.tree.protected_size(),
            self.allocator.available_size(),
        )

    def nano_view(self) -> NanoView:
        bm = self.block_manager
        pos = {b: i for i, b in enumerate(bm.free_block_ids)}
        blocks = tuple(
            NanoBlockView(b.block_id, b.ref_count, b.hash, tuple(b.token_ids), pos.get(b.block_id))
            for b in bm.blocks
        )
        return NanoView(blocks, len(bm.hash_to_block_id))


def follow(
    snapshots, num_gpu_blocks: int, block_size: int, page_size: int = 1, nano_commit: str = HEAD
) -> SideBySide:
    """Both designs through a run's snapshots (the state after each step, oldest first)."""
    side = SideBySide(num_gpu_blocks, block_size, page_size, nano_commit)
    for snap in snapshots:
        side.advance(snap)
    return side
