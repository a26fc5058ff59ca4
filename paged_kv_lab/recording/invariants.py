"""check_invariants: the properties the block manager must keep after every operation."""

from __future__ import annotations

from kvcore.core.kv_cache_inspect import (
    all_block_tables,
    block_cache_keys,
    cached_block_ids,
    free_queue_problem,
)
from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.kv_cache_utils import get_block_hash, get_group_id, hash_block_tokens


class InvariantError(AssertionError):
    pass


def _fail(msg: str) -> None:
    raise InvariantError(msg)


def check_invariants(
    kvm: KVCacheManager,
    hash_fn=None,
    requests=None,
    none_hash=None,
    hash_meta=None,
    extra_refs=None,
) -> None:
    """Raise InvariantError if the pool, tables, queue or hash map disagree.

    - ref_cnt of each non-null block = number of block-table slots holding it, plus its
      ``extra_refs`` (block id -> count: a KV connector's pins while it copies the block);
    - the free queue holds exactly the non-null blocks with ref_cnt 0, once each,
      links consistent both ways, and num_free_blocks is its length;
    - every hash-map entry points at a block carrying that key;
    - a cached block's hash equals the chained hash of its parent and tokens (``hash_meta``, the
      recorder's record of what each hash stands for, given);
    - a hashed block in a request's table at index i carries that request's hash at the key's
      prefix boundary, which lies in block i (its end; with hashes finer than the block, maybe
      inside it), with the table's group id; a block's further keys (partial entries) are
      listed in the map and checked against what they stand for too;
    - the null block is in no queue and in no hash map entry.
    """
    pool = kvm.block_pool
    if hash_meta is None and getattr(pool.observer, "hash_meta", None) is not None:
        hash_meta = pool.observer.hash_meta
    null = pool.null_block
    tables = list(all_block_tables(kvm))
    holders = [0] * pool.num_gpu_blocks
    for _, _, table in tables:
        for bid in table:
            if bid != null.block_id:
                holders[bid] += 1
    for block_id, n in (extra_refs or {}).items():
        holders[block_id] += n
    for blk in pool.blocks:
        if blk.is_null:
            continue
        if blk.ref_cnt != holders[blk.block_id]:
            _fail(
                f"block {blk.block_id}: ref_cnt {blk.ref_cnt} "
                f"but held by {holders[blk.block_id]} table slots"
            )

    problem = free_queue_problem(pool)
    if problem is not None:
        _fail(problem)

    registered = set()
    for key, ids in cached_block_ids(pool):
        if not ids:
            _fail("hash map holds an empty entry")
        for bid in ids:
            blk = pool.blocks[bid]
            if blk.block_hash != key and key not in block_cache_keys(pool, bid):
                _fail(
                    f"hash map entry {key.hex()[:12]} points at block {bid}, which carries "
                    f"{blk.block_hash.hex()[:12] if blk.block_hash else None}"
                )
            if blk is null:
                _fail("the null block is in the hash map")
            registered.add(bid)
    for blk in pool.blocks:
        if blk.block_hash is not None and blk.block_id not in registered:
            _fail(f"block {blk.block_id} carries a hash that the map does not list")
        if blk.block_hash is not None and hash_fn is not None and hash_meta is not None:
            for key in block_cache_keys(pool, blk.block_id):
                raw = get_block_hash(key)
                meta = hash_meta.get(raw)
                if meta is None:
                    _fail(f"block {blk.block_id}: no record of what its hash stands for")
                if (
                    hash_block_tokens(
                        hash_fn, meta.parent, meta.token_ids, meta.extra_keys, none_hash
                    )
                    != raw
                ):
                    _fail(f"block {blk.block_id}: hash does not match its parent and tokens")
    if requests is not None:
        # A key covers the prefix up to its boundary: the block's end, or (hashes finer than the
        # block) a boundary inside the block (a partial entry); the request's hash there.
        unit = pool.hash_block_size
        for gid, rid, table in tables:
            req = requests[rid]
            bs = kvm.coordinator.group_block_sizes[gid]  # the group's own block size
            for i, bid in enumerate(table):
                blk = pool.blocks[bid]
                if blk.block_hash is None:
                    continue
                end = blk.block_hash_num_tokens
                j = end // unit - 1
                if (
                    not i * bs < end <= (i + 1) * bs
                    or j >= len(req.block_hashes)
                    or get_block_hash(blk.block_hash) != req.block_hashes[j]
                ):
                    _fail(
                        f"request {rid} slot {i}: block {blk.block_id} "
                        "carries another content's hash"
                    )
                if get_group_id(blk.block_hash) != gid:
                    _fail(
                        f"request {rid} group {gid}: block "
                        f"{blk.block_id} is cached under another group"
                    )
    if null.block_hash is not None:
        _fail("the null block carries a hash")
