"""Requests, one after another, through SGLang's radix tree or nano-vllm's block manager.

Each runner is the part of its engine's scheduler that touches the cache, for one request at a
time (the replay's ``sequential`` arrival rule: the next request comes when the last finished):

- SGLang: match the prompt (at most ``len - 1`` tokens, as ``Req._compute_max_prefix_len``),
  lock the matched node, allocate the rest; when the pool is short, ask the tree to evict
  exactly the shortfall (``evict_to_free_tokens``); at the end, insert the tokens whose K/V the
  request holds (prompt and all answers but the last), free the duplicates and the unaligned
  tail, unlock (``cache_finished_req``).
- nano-vllm (at bb823b3 unless ``commit`` says 2f352ae): ``can_allocate`` and ``allocate`` the
  prompt (bb823b3: every block but the last may hit; 2f352ae: every full block, the last
  included), one ``may_append`` per generated token after the first, after each step the
  ``postprocess`` that hashes what it computed (bb823b3), ``deallocate`` at the end.

Each runner is a driver (paged_kv_lab/run/driver.py) whose unit is one request: ``add_request``
queues a ``DesignRequest``, ``step`` runs the next one start to end and returns its
``DesignRequestResult`` (the engine steps inside it are counted in ``steps``), ``outputs`` are the
results by request; neither publishes vLLM KV events.

A runner records the ops it made on the tree (``op_log``) in the form tests/_designs_sglang.py
replays into SGLang's own code, so the fidelity test can check the two trees take the same
decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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

ANSWER_TOKEN = 0  # generated tokens: a value no prompt token takes (as workload.tokens)


class DesignError(ValueError):
    """A request the design cannot run (its message names the request and the sizes)."""


@dataclass(frozen=True)
class DesignRequest:
    request_id: str
    prompt: tuple[int, ...]
    output_tokens: int


@dataclass(frozen=True)
class DesignRequestResult:
    """One request: ``hit_tokens`` cached at admission; steps as the sequential replay counts
    them (one prefill step, then one step per further token)."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    hit_tokens: int
    admitted_step: int
    finished_step: int
    num_preemptions: int = 0


class OneAtATime:
    """The driver of a runner that takes one request at a time (its ``run``): a queue in front.

    Invariants: requests run in the order taken, each start to end in one ``step``; ``outputs``
    holds every request run, in that order."""

    _queue: list[DesignRequest]
    results: list[DesignRequestResult]

    def run(self, req: DesignRequest) -> DesignRequestResult:
        raise NotImplementedError

    def add_request(self, req: DesignRequest) -> None:
        """Take ``req``; a later ``step`` runs it."""
        self._queue.append(req)

    def step(self) -> DesignRequestResult:
        """The oldest request taken, run start to end; its result."""
        if not self._queue:
            raise DesignError("no request is waiting to run")
        return self.run(self._queue.pop(0))

    def has_unfinished(self) -> bool:
        return bool(self._queue)

    def kv_events(self) -> tuple:
        return ()

    def outputs(self) -> dict[str, DesignRequestResult]:
        return {r.request_id: r for r in self.results}


@dataclass
class SGLangRun(OneAtATime):
    """SGLang's tree under a token pool of ``size`` slots; feed it with ``run(request)`` (or, as
    a driver, ``add_request`` and ``step``)."""

    size: int
    page_size: int = 1
    eviction_policy: str = "lru"
    observer: Callable[[ev.DesignEvent], None] | None = None
    op_log: list | None = None
    evicted_tokens: int = 0
    steps: int = 0
    results: list[DesignRequestResult] = field(default_factory=list)
    _queue: list[DesignRequest] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.allocator = PagedTokenToKVPoolAllocator(self.size, self.page_size)
        self.tree = RadixCache(
            page_size=self.page_size,
            token_to_kv_pool_allocator=self.allocator,
            eviction_policy=self.eviction_policy,
            observer=self.observer,
        )

    def _log(self, *op) -> int:
        if self.op_log is not None:
            self.op_log.append(list(op))
            return len(self.op_log) - 1
        return -1

    def _alloc(self, need: int, rid: str) -> list[int]:
        """Slots for ``need`` tokens (whole pages), evicting exactly the shortfall first."""
        pages = -(-need // self.page_size)
        shortfall = pages * self.page_size - self.allocator.available_size()
        if shortfall > 0:
            self._log("evict", shortfall)
            got = self.tree.evict(EvictParams(num_tokens=shortfall, request_id=rid))
            self.evicted_tokens += got.num_tokens_evicted
        slots = self.allocator.alloc(need)
        if slots is None:
            raise DesignError(
                f"request {rid}: needs {pages * self.page_size} free KV slots, only "
                f"{self.allocator.available_size()} are free after evicting every unlocked leaf "
                f"(pool: {self.size} slots)"
            )
        return slots

    def run(self, req: DesignRequest) -> DesignRequestResult:
        rid, prompt = req.request_id, list(req.prompt)
        key = RadixKey(prompt[: max(len(prompt) - 1, 0)])
        m_op = self._log("match", list(key.token_ids))
        match = self.tree.match_prefix(MatchPrefixParams(key=key, request_id=rid))
        prefix_len = match.device_prefix_len
        self._log("lock", m_op)
        self.tree.inc_lock_ref(match.last_device_node, rid)
        row = list(match.values) + self._alloc(len(prompt) - prefix_len, rid)
        admitted = self.steps + 1
        self.steps += max(req.output_tokens, 1)
        tokens = prompt + [ANSWER_TOKEN] * max(req.output_tokens - 1, 0)
        extra = len(tokens) - len(prompt)
        if extra:
            have = len(row) - prefix_len
            room = -(-have // self.page_size) * self.page_size - have
            fresh = self._alloc(extra - room, rid) if extra > room else []
            row += [row[-1] + 1 + i for i in range(min(room, extra))] + fresh
        key_len = len(tokens) // self.page_size * self.page_size
        self._log("insert", tokens[:key_len], row[:key_len])
        ins = self.tree.insert(
            InsertParams(key=RadixKey(tokens[:key_len]), value=tuple(row[:key_len]), request_id=rid)
        )
        # Slots of tokens the tree already held, and the tail no whole page covers, go back.
        self.allocator.free_segment(row[prefix_len : ins.prefix_len])
        self.allocator.free_segment(row[key_len:])
        self._log("unlock", m_op)
        self.tree.dec_lock_ref(match.last_device_node, rid)
        result = DesignRequestResult(
            rid, len(prompt), req.output_tokens, prefix_len, admitted, self.steps
        )
        self.results.append(result)
        return result


@dataclass
class NanoRun(OneAtATime):
    """nano-vllm's block manager (at ``commit``) with ``num_blocks`` blocks; feed it with
    ``run(request)`` (or, as a driver, ``add_request`` and ``step``)."""

    num_blocks: int
    block_size: int
    observer: Callable[[ev.DesignEvent], None] | None = None
    commit: str = HEAD
    evictions: int = 0
    steps: int = 0
    results: list[DesignRequestResult] = field(default_factory=list)
    _queue: list[DesignRequest] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.block_manager = BlockManager(
            self.num_blocks, self.block_size, observer=self._see, commit=self.commit
        )

    def _see(self, event: ev.DesignEvent) -> None:
        if isinstance(event, ev.BlockMiss) and event.evicted_hash:
            self.evictions += 1
        if self.observer is not None:
            self.observer(event)

    def run(self, req: DesignRequest) -> DesignRequestResult:
        bm = self.block_manager
        seq = Sequence(req.prompt, self.block_size, seq_id=req.request_id)
        need = max(seq.num_blocks, -(-(len(seq) + max(req.output_tokens - 1, 0)) // bm.block_size))
        if need > self.num_blocks or not schedule_prefill(bm, seq):
            raise DesignError(
                f"request {req.request_id}: needs {need} KV blocks, the manager has "
                f"{self.num_blocks}"
            )
        hit = seq.num_cached_tokens
        admitted = self.steps + 1
        for _ in range(req.output_tokens - 1):
            postprocess(bm, seq)
            seq.append_token(ANSWER_TOKEN)
            if not schedule_decode(bm, seq):
                raise DesignError(f"request {req.request_id}: no free block to append to")
        postprocess(bm, seq)
        self.steps += max(req.output_tokens, 1)
        bm.deallocate(seq)
        result = DesignRequestResult(
            req.request_id, len(req.prompt), req.output_tokens, hit, admitted, self.steps
        )
        self.results.append(result)
        return result
