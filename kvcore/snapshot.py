"""Freeze the scheduler and block pool into a Snapshot (O(blocks + requests))."""
from __future__ import annotations

from typing import Callable, Optional

from kvcore.kv.block_hash import get_block_hash, get_group_id
from kvcore.sched.scheduler import Scheduler
from kvcore.trace import BlockView, RequestView, Snapshot


def take_snapshot(scheduler: Scheduler, step: int,
                  decode: Optional[Callable[[list[int]], str]] = None) -> Snapshot:
    kvm = scheduler.kv_cache_manager
    pool = kvm.block_pool
    bs = kvm.block_size
    managers = kvm.coordinator.single_type_managers

    queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    queue_pos = {bid: i for i, bid in enumerate(queue)}

    owners: dict[int, list[str]] = {}
    held_tokens: dict[int, tuple[int, ...]] = {}
    for rid, req in scheduler.requests.items():
        for m in managers:
            for i, blk in enumerate(m.req_to_blocks.get(rid, ())):
                if blk.is_null:
                    continue
                owners.setdefault(blk.block_id, []).append(rid)
                toks = tuple(req.all_token_ids[i * bs:min((i + 1) * bs, req.num_computed_tokens)])
                if len(toks) > len(held_tokens.get(blk.block_id, ())):
                    held_tokens[blk.block_id] = toks

    blocks = []
    for blk in pool.blocks:
        h = parent = None
        group = None
        toks = held_tokens.get(blk.block_id, ())
        if blk.block_hash is not None:
            raw = get_block_hash(blk.block_hash)
            group = get_group_id(blk.block_hash)
            h = raw.hex()
            meta = pool.hash_meta.get(raw)
            if meta is not None:
                parent = meta.parent.hex() if meta.parent else None
                toks = meta.token_ids
        blocks.append(BlockView(
            block_id=blk.block_id, ref_cnt=0 if blk.is_null else blk.ref_cnt, is_null=blk.is_null,
            block_hash=h, parent_hash=parent, group=group, token_ids=tuple(toks),
            queue_pos=queue_pos.get(blk.block_id), owners=tuple(owners.get(blk.block_id, ()))))

    hash_map = {
        f"{get_block_hash(key).hex()}@{get_group_id(key)}": tuple(blocks_by_id)
        for key, blocks_by_id in pool.cached_block_hash_to_block.items()
    }

    requests = []
    for rid, req in scheduler.requests.items():
        tables = tuple(tuple(b.block_id for b in m.req_to_blocks.get(rid, ())) for m in managers)
        requests.append(RequestView(
            request_id=rid, status=req.status.value, num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens, num_computed_tokens=req.num_computed_tokens,
            num_cached_tokens=max(req.num_cached_tokens, 0), block_tables=tables,
            num_preemptions=req.num_preemptions, priority=req.priority, arrival=req.arrival_time,
            output_token_ids=tuple(req.output_token_ids), prompt_token_ids=tuple(req.prompt_token_ids),
            text=decode(req.output_token_ids) if decode and req.output_token_ids else "",
            cache_salt=req.cache_salt))

    return Snapshot(
        step=step, block_size=bs, num_gpu_blocks=pool.num_gpu_blocks, blocks=tuple(blocks),
        free_queue=tuple(queue), hash_map=hash_map, requests=tuple(requests),
        waiting=tuple(r.request_id for r in scheduler.waiting.ordered()),
        running=tuple(r.request_id for r in scheduler.running),
        usage=kvm.usage, num_free_blocks=pool.get_num_free_blocks(),
        prefix_cache=kvm.prefix_cache_stats.to_dict(),
        groups=tuple(g.to_dict() for g in kvm.coordinator.groups))
