"""What the engine looks like after a step, as plain frozen data, and how to take it.

BlockView / RequestView / Snapshot / StepRecord carry no reference back into live
engine objects, so a Snapshot taken at step 3 still describes step 3 after the engine
has moved on. The app draws only from these records; ``take_snapshot`` freezes the
scheduler and block pool into one (O(blocks + requests)).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Union

from kvcore.core.kv_cache_inspect import (
    block_tables,
    cached_block_ids,
    free_queue_block_ids,
    offload_is_lazy,
    waiting_request_ids,
    waiting_request_queues,
)
from kvcore.core.kv_cache_utils import get_block_hash, get_group_id
from kvcore.worker.gpu.input_batch import InputBatch
from paged_kv_lab.recording.events import AnyEvent, Event

if TYPE_CHECKING:
    from kvcore.core.sched.scheduler import Scheduler


@dataclass(frozen=True)
class BlockView:
    block_id: int
    ref_cnt: int
    is_null: bool
    block_hash: str | None  # hex of the hash (without group id); None if not cached
    parent_hash: str | None  # hex of the parent block's hash; None for a first block
    group: int | None  # KV cache group whose cache key holds the hash
    token_ids: tuple[int, ...]  # tokens whose K/V the block holds (full blocks: block_size of them)
    queue_pos: int | None  # 0 = head of the free queue; None = not in the queue
    owners: tuple[str, ...]  # request ids whose block tables hold this block
    # prefix length the hash covers (vLLM's name); None if not cached
    block_hash_num_tokens: int | None = None


@dataclass(frozen=True)
class CPUPoolView:
    """The CPU tier's own BlockPool after a step (SimpleCPUOffloadConnector): per block its
    ref_cnt (pins while a copy or a found hit uses it) and its hash, and its own free queue."""

    num_blocks: int
    ref_cnts: tuple[int, ...]  # by block id; block 0 is the CPU pool's null block
    block_hashes: tuple[Optional[str], ...]  # by block id: hex of the hash, None if not cached
    free_queue: tuple[int, ...]  # head (reused next, its hash evicted) -> tail
    lazy_offload: bool = False


@dataclass(frozen=True)
class RequestView:
    request_id: str
    status: str  # waiting | running | preempted | finished_stopped | finished_length ...
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int  # prefix-hit tokens at its (last) admission
    block_tables: tuple[tuple[int, ...], ...]  # per group: logical block -> physical block id
    num_preemptions: int
    priority: int
    arrival: int
    output_token_ids: tuple[int, ...]
    prompt_token_ids: tuple[int, ...]
    text: str  # detokenised output so far ("" where no tokenizer)
    cache_salt: str | None = None
    # The engine's chained hash (hex) of every full block of prompt + output so far; empty with
    # prefix caching off (and in traces recorded before snapshots kept them).
    block_hashes: tuple[str, ...] = ()
    # The extra keys of each of those hashes (keys_text), for a request whose hashes carry more
    # than a salt (a LoRA adapter, multimodal items, prompt embeddings); empty otherwise, and then
    # not written out.
    block_extra_keys: tuple[str, ...] = ()


def keys_text(keys: Optional[tuple]) -> str:
    """One hash's extra keys as data to show and compare ("" for none): each key as
    ``kind(value, ...)``, bytes (a prompt-embeddings digest) in hex."""
    return "; ".join(
        f"{key[0]}({', '.join(v.hex() if isinstance(v, bytes) else repr(v) for v in key[1:])})"
        for key in keys or ()
    )


# vLLM 0.34's three waiting queues, in the order Scheduler.schedule() takes them
WAITING_QUEUES = ("kv_holding_waiting", "waiting", "async_kv_waiting")
WaitingQueue = Literal["kv_holding_waiting", "waiting", "async_kv_waiting"]


@dataclass(frozen=True)
class Snapshot:
    step: int
    block_size: int
    num_gpu_blocks: int
    blocks: tuple[BlockView, ...]
    free_queue: tuple[int, ...]  # head -> tail
    hash_map: dict[str, tuple[int, ...]]  # "hexhash@group" -> block ids, insertion order
    requests: tuple[RequestView, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    usage: float
    num_free_blocks: int
    # vLLM's PrefixCacheStats since the last reset (tokens; requests resumed after preemption
    # counted apart) + recent_hit_rate / recent_requests: the hit rate over the last N requests
    # as vLLM logs it (kvcore/metrics/stats.py)
    prefix_cache: dict[str, int | float]
    # per KV cache group: {"kind": "full"|"sliding", "sliding_window": W|None}
    groups: tuple[dict[str, Any], ...]
    # the CPU tier's pool (engine.cpu_offload); None without one, and then not written out
    cpu_pool: Optional[CPUPoolView] = None
    # Per KV cache group, its own block size, where the groups' sizes differ (vLLM 0.34 gives a
    # group whose page per token is smaller a proportionally longer block; block_size above is
    # then the scheduler's, their least common multiple). Empty where every group's block size
    # is block_size: then not written out, and a trace without it means exactly that.
    group_block_sizes: tuple[int, ...] = ()
    # For each request in ``waiting``, in its order, the vLLM 0.34 queue it waits in:
    # "kv_holding_waiting" (it holds KV blocks: a load landed or in flight), "waiting" or
    # "async_kv_waiting" (a connector may load it while the batch is full). Empty where every
    # waiting request is in plain "waiting": then not written out, and a trace without it means
    # exactly that.
    waiting_queues: tuple[WaitingQueue, ...] = ()

    def queue_of(self, request_id: str) -> Optional[str]:
        """The queue ``request_id`` waits in (None: it is not waiting)."""
        if request_id not in self.waiting:
            return None
        if not self.waiting_queues:
            return "waiting"
        return self.waiting_queues[self.waiting.index(request_id)]

    def group_block_size(self, group: int) -> int:
        """Tokens one block of KV cache group ``group`` holds."""
        return self.group_block_sizes[group] if self.group_block_sizes else self.block_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.cpu_pool is None:
            del d["cpu_pool"]
        if not self.group_block_sizes:
            del d["group_block_sizes"]
        if not self.waiting_queues:
            del d["waiting_queues"]
        for r in d["requests"]:
            if not r["block_extra_keys"]:
                del r["block_extra_keys"]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Snapshot":
        blocks = tuple(
            BlockView(**{**b, "token_ids": tuple(b["token_ids"]), "owners": tuple(b["owners"])})
            for b in d["blocks"]
        )
        reqs = tuple(
            RequestView(
                **{
                    **r,
                    "block_tables": tuple(tuple(t) for t in r["block_tables"]),
                    "output_token_ids": tuple(r["output_token_ids"]),
                    "prompt_token_ids": tuple(r["prompt_token_ids"]),
                    "block_hashes": tuple(r.get("block_hashes", ())),
                    "block_extra_keys": tuple(r.get("block_extra_keys", ())),
                }
            )
            for r in d["requests"]
        )
        return Snapshot(
            step=d["step"],
            block_size=d["block_size"],
            num_gpu_blocks=d["num_gpu_blocks"],
            blocks=blocks,
            free_queue=tuple(d["free_queue"]),
            hash_map={k: tuple(v) for k, v in d["hash_map"].items()},
            requests=reqs,
            waiting=tuple(d["waiting"]),
            running=tuple(d["running"]),
            usage=d["usage"],
            num_free_blocks=d["num_free_blocks"],
            prefix_cache=dict(d["prefix_cache"]),
            groups=tuple(d["groups"]),
            cpu_pool=_cpu_pool_from_dict(d.get("cpu_pool")),
            group_block_sizes=tuple(d.get("group_block_sizes", ())),
            waiting_queues=tuple(d.get("waiting_queues", ())),
        )

    def request(self, request_id: str) -> RequestView:
        for r in self.requests:
            if r.request_id == request_id:
                return r
        raise KeyError(request_id)


@dataclass(frozen=True)
class StepRecord:
    """One engine step: what ran, what happened, and the state after it."""

    step: int
    scheduled: dict[str, int]  # request id -> tokens computed this step
    events: tuple[AnyEvent, ...]  # the decisions of the step, in order (record.events)
    snapshot: Snapshot
    new_tokens: dict[str, list[int]] = field(default_factory=dict)
    # vLLM's KV cache events queued this step (kvcore.distributed.kv_events structs), the step's
    # KVEventBatch. Kept in memory for the app; trace files do not carry them.
    kv_events: tuple[Any, ...] = field(default=(), compare=False, repr=False)
    # what the model runner was given (kvcore.worker.gpu.input_batch.InputBatch: slot_mapping,
    # block tables, query_start_loc, seq_lens); None when no forward ran or no model runs, and in
    # older traces
    model_inputs: Optional[InputBatch] = None
    # how long the step took on this machine (wall seconds; 0.0 when unknown, as in trace files,
    # which do not carry it: a timing is no part of what the run decided)
    seconds: float = field(default=0.0, compare=False, repr=False)
    # In a P/D pair's run (paged_kv_lab/disagg/pd.py) the replica that made this step, whose pool
    # the snapshot is ("prefill" / "decode"); in a fleet's (paged_kv_lab/fleet/model_fleet.py) its
    # index; None for one engine. Written out only when set, so a plain run's file is unchanged.
    replica: Optional[Union[Literal["prefill", "decode"], int]] = None
    # the K/V the replica's connector pulled in this step: request -> (prefill block ids, decode
    # block ids), the i-th of one copied into the i-th of the other; written out only when some
    pulls: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    # in a fleet's run, the requests the router sent to this replica just before this step, each
    # with its decision (fleet/model_fleet.py: Routed); written out only when some
    routed: tuple[Any, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "step": self.step,
            "scheduled": dict(self.scheduled),
            "events": [e.to_dict() for e in self.events],
            "snapshot": self.snapshot.to_dict(),
            "new_tokens": {k: list(v) for k, v in self.new_tokens.items()},
        }
        if self.model_inputs is not None:
            d["model_inputs"] = self.model_inputs.to_dict()
        if self.replica is not None:
            d["replica"] = self.replica
        if self.pulls:
            d["pulls"] = {k: [list(p), list(q)] for k, (p, q) in self.pulls.items()}
        if self.routed:
            d["routed"] = [r.to_dict() for r in self.routed]
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "StepRecord":
        return StepRecord(
            d["step"],
            dict(d["scheduled"]),
            tuple(Event.from_dict(e) for e in d["events"]),
            Snapshot.from_dict(d["snapshot"]),
            {k: list(v) for k, v in d.get("new_tokens", {}).items()},
            model_inputs=(
                None if d.get("model_inputs") is None else InputBatch.from_dict(d["model_inputs"])
            ),
            replica=d.get("replica"),
            pulls={k: (tuple(p), tuple(q)) for k, (p, q) in d.get("pulls", {}).items()},
        )


def take_snapshot(
    scheduler: "Scheduler",
    step: int,
    decode: Optional[Callable[[list[int]], str]] = None,
    hash_meta: Optional[dict] = None,
    requests: Optional[dict] = None,
) -> Snapshot:
    """The state after ``step``; ``hash_meta`` (the recorder's) says what each cached hash stands
    for; ``requests`` (default: the scheduler's unfinished ones) are the requests to show, finished
    included."""
    if requests is None:
        requests = scheduler.requests
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    bs = kvm.block_size
    null = pool.null_block.block_id
    sizes = tuple(kvm.coordinator.group_block_sizes)

    queue = free_queue_block_ids(pool)
    queue_pos = {bid: i for i, bid in enumerate(queue)}

    tables = {rid: block_tables(kvm, rid) for rid in requests}
    owners: dict[int, list[str]] = {}
    held_tokens: dict[int, tuple[int, ...]] = {}
    for rid, req in requests.items():
        # each group's table at its own block size (groups may differ: the snapshot's block_size
        # is the scheduler's, their least common multiple)
        for table, gbs in zip(tables[rid], sizes):
            for i, bid in enumerate(table):
                if bid == null:
                    continue
                owners.setdefault(bid, []).append(rid)
                end = min((i + 1) * gbs, req.num_computed_tokens)
                toks = tuple(req.all_token_ids[i * gbs : end])
                if len(toks) > len(held_tokens.get(bid, ())):
                    held_tokens[bid] = toks

    blocks = []
    for blk in pool.blocks:
        h = parent = None
        group = None
        toks = held_tokens.get(blk.block_id, ())
        if blk.block_hash is not None:
            raw = get_block_hash(blk.block_hash)
            group = get_group_id(blk.block_hash)
            h = raw.hex()
            meta = hash_meta.get(raw) if hash_meta is not None else None
            if meta is not None:
                # hashes finer than the block: draw the block's own chain link and tokens, at
                # the block size of the group the hash keys it in
                up, toks = meta.blocks.get(sizes[group], (meta.parent, meta.token_ids))
                parent = up.hex() if up else None
        blocks.append(
            BlockView(
                block_id=blk.block_id,
                ref_cnt=0 if blk.is_null else blk.ref_cnt,
                is_null=blk.is_null,
                block_hash=h,
                parent_hash=parent,
                group=group,
                token_ids=tuple(toks),
                queue_pos=queue_pos.get(blk.block_id),
                owners=tuple(owners.get(blk.block_id, ())),
                block_hash_num_tokens=blk.block_hash_num_tokens,
            )
        )

    hash_map = {
        f"{get_block_hash(key).hex()}@{get_group_id(key)}": tuple(blocks_by_id)
        for key, blocks_by_id in cached_block_ids(pool)
    }

    views = []
    for rid, req in requests.items():
        views.append(
            RequestView(
                request_id=rid,
                status=req.status.value,
                num_prompt_tokens=req.num_prompt_tokens,
                num_output_tokens=req.num_output_tokens,
                num_computed_tokens=req.num_computed_tokens,
                num_cached_tokens=max(req.num_cached_tokens, 0),
                block_tables=tables[rid],
                num_preemptions=req.num_preemptions,
                priority=req.priority,
                arrival=req.arrival_time,
                output_token_ids=tuple(req.output_token_ids),
                prompt_token_ids=tuple(req.prompt_token_ids),
                text=decode(req.output_token_ids) if decode and req.output_token_ids else "",
                cache_salt=req.cache_salt,
                block_hashes=tuple(h.hex() for h in req.block_hashes),
                block_extra_keys=tuple(
                    keys_text(req.extra_keys_for_block(j)) for j in range(len(req.block_hashes))
                )
                if req.has_extra_hash_keys
                else (),
            )
        )

    queues = waiting_request_queues(scheduler)
    return Snapshot(
        step=step,
        block_size=bs,
        num_gpu_blocks=pool.num_gpu_blocks,
        blocks=tuple(blocks),
        free_queue=tuple(queue),
        hash_map=hash_map,
        requests=tuple(views),
        waiting=waiting_request_ids(scheduler),  # the three queues, as schedule() takes them
        waiting_queues=queues if any(q != "waiting" for q in queues) else (),
        running=tuple(r.request_id for r in scheduler.running),
        usage=kvm.usage,
        num_free_blocks=pool.get_num_free_blocks(),
        prefix_cache={
            **kvm.prefix_cache_totals.to_dict(),
            "recent_hit_rate": kvm.caching_metrics.hit_rate,
            "recent_requests": kvm.caching_metrics.aggregated_requests,
        },
        groups=tuple(g.to_dict() for g in kvm.kv_cache_config.kv_cache_groups),
        cpu_pool=cpu_pool_view(getattr(scheduler, "connector", None)),
        group_block_sizes=sizes if any(s != bs for s in sizes) else (),
    )


def cpu_pool_view(connector) -> Optional[CPUPoolView]:
    """The CPU tier's pool, frozen (None without a CPU-offloading connector)."""
    manager = getattr(connector, "scheduler_manager", None)
    if manager is None:
        return None
    pool = manager.cpu_block_pool
    return CPUPoolView(
        num_blocks=pool.num_gpu_blocks,
        ref_cnts=tuple(0 if b.is_null else b.ref_cnt for b in pool.blocks),
        block_hashes=tuple(
            None if b.block_hash is None else get_block_hash(b.block_hash).hex()
            for b in pool.blocks
        ),
        free_queue=tuple(free_queue_block_ids(pool)),
        lazy_offload=offload_is_lazy(manager),
    )


def _cpu_pool_from_dict(d: Optional[dict[str, Any]]) -> Optional[CPUPoolView]:
    if d is None:
        return None
    return CPUPoolView(
        num_blocks=d["num_blocks"],
        ref_cnts=tuple(d["ref_cnts"]),
        block_hashes=tuple(d["block_hashes"]),
        free_queue=tuple(d["free_queue"]),
        lazy_offload=d.get("lazy_offload", False),
    )
