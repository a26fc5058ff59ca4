"""kvcore/core/kv_cache_inspect.py: each view says what kvcore's own structures hold, asks
nothing of them that changes them, and hands back only ints, bytes and tuples or fresh lists."""

from kvcore.core.block_pool import BlockPool
from kvcore.core.kv_cache_inspect import (
    all_block_tables,
    block_cache_keys,
    block_tables,
    cached_block_ids,
    free_queue_block_ids,
    free_queue_ends,
    free_queue_head,
    free_queue_next,
    free_queue_problem,
    in_free_queue,
    num_blocks_cached_under,
    num_blocks_held,
    num_cached_blocks,
    offload_is_lazy,
)
from kvcore.core.kv_cache_utils import make_block_hash_with_group_id
from kvcore.kv_cache_interface import KVCacheConfig
from kvcore.simple_kv_offload.manager import SimpleCPUOffloadScheduler
from support.kv import FULL, admit, group_specs, hybrid, make_manager, make_request, queue_ids


def _churned():
    """A pool whose free queue is not in block order: a, b, c admitted, b then a freed."""
    kvm = make_manager(12, 2)
    reqs = {
        rid: make_request(rid, toks, 2)
        for rid, toks in (("a", [1, 2, 3, 4, 5]), ("b", [6, 7, 8]), ("c", [9, 10, 11, 12]))
    }
    for r in reqs.values():
        admit(kvm, r)
    kvm.free(reqs["b"])
    kvm.free(reqs["a"])
    return kvm, reqs


def test_free_queue_views_follow_the_queue_from_head_to_tail():
    kvm, _ = _churned()
    pool = kvm.block_pool
    order = queue_ids(pool)  # vLLM's get_all_free_blocks
    assert order != sorted(order)  # the frees moved blocks around
    assert free_queue_block_ids(pool) == order
    assert len(order) == pool.get_num_free_blocks()
    assert free_queue_ends(pool, 3) == (tuple(order[:3]), tuple(order[-3:]))
    assert free_queue_ends(pool, 100) == (tuple(order), tuple(order))
    assert free_queue_head(pool) == order[0]
    assert [free_queue_next(pool, b) for b in order] == order[1:] + [None]
    in_use = [b.block_id for b in pool.blocks if b.ref_cnt and not b.is_null]
    assert in_use and all(free_queue_next(pool, b) is None for b in in_use)
    assert {b.block_id for b in pool.blocks if in_free_queue(b)} == set(order)
    assert free_queue_problem(pool) is None


def test_an_empty_free_queue():
    pool = BlockPool(3, True, 2)
    pool.get_new_blocks(2)
    assert free_queue_block_ids(pool) == []
    assert free_queue_ends(pool, 4) == ((), ())
    assert free_queue_head(pool) is None
    assert free_queue_problem(pool) is None


def test_free_queue_problem_names_a_broken_queue_and_stops_on_a_cycle():
    kvm, _ = _churned()
    pool = kvm.block_pool
    first, second = free_queue_block_ids(pool)[:2]
    pool.blocks[second].next_free_block = pool.blocks[first]  # a cycle
    assert free_queue_problem(pool) == f"free queue: block {first}.prev does not point back"
    pool.blocks[second].next_free_block = None
    assert free_queue_problem(pool) == "free queue broken: a link is None before the tail"


def test_block_tables_per_group_as_vllm_get_block_ids():
    kvm = make_manager(24, 2, hybrid(4))
    a = make_request("a", list(range(11)), 2)
    admit(kvm, a)
    assert block_tables(kvm, "a") == tuple(tuple(t) for t in kvm.get_block_ids("a"))
    assert len(block_tables(kvm, "a")) == 2
    assert block_tables(kvm, "nobody") == ((), ())
    # reading an unknown request adds nothing to kvcore's maps (they are defaultdicts)
    assert num_blocks_held(kvm, "nobody", 1) == 0 and num_cached_blocks(kvm, "nobody") == 0
    assert all("nobody" not in m.req_to_blocks for m in kvm.coordinator.single_type_managers)
    tables = list(all_block_tables(kvm))
    assert [(g, rid) for g, rid, _ in tables] == [(0, "a"), (1, "a")]
    assert tuple(t for _, _, t in tables) == block_tables(kvm, "a")
    for g, m in enumerate(kvm.coordinator.single_type_managers):
        assert num_blocks_held(kvm, "a", g) == len(m.req_to_blocks["a"])
        assert num_cached_blocks(kvm, "a", g) == m.num_cached_block["a"]


def test_prefix_cache_views():
    pool = BlockPool(8, True, 2)
    a = make_request("a", [7, 7, 8, 8], 2)
    b = make_request("b", [7, 7, 8, 8], 2)  # the same content, computed alongside
    blocks_a, blocks_b = pool.get_new_blocks(2), pool.get_new_blocks(2)
    pool.cache_full_blocks(a, blocks_a, 0, 2, 2, 0)
    pool.cache_full_blocks(b, blocks_b, 0, 2, 2, 0)
    key = make_block_hash_with_group_id(a.block_hashes[0], 0)
    assert num_blocks_cached_under(pool, key) == 2
    assert dict(cached_block_ids(pool))[key] == (1, 3)
    assert num_blocks_cached_under(pool, b"no such key") == 0
    pool.evict_blocks([1])
    assert num_blocks_cached_under(pool, key) == 1
    assert block_cache_keys(pool, 1) == ()
    assert block_cache_keys(pool, 3) == (key,)


def test_block_cache_keys_lists_partial_entries_after_the_primary_key():
    pool = BlockPool(4, True, 2)  # hashes every 2 tokens, blocks of 4
    r = make_request("r", [1, 2, 3, 4], 2)
    (blk,) = pool.get_new_blocks(1)
    at4 = pool.cache_partial_block(r, blk, 4, 0, 4)
    at2 = pool.cache_partial_block(r, blk, 2, 0, 4)  # an earlier boundary: a further key
    assert blk.block_hash == at4
    assert block_cache_keys(pool, blk.block_id) == (at4, at2)


def test_offload_is_lazy_reads_the_setting():
    config = KVCacheConfig(8, group_specs(FULL, 4), 0)
    for lazy in (False, True):
        manager = SimpleCPUOffloadScheduler(config, 4, 64, 16, lazy_offload=lazy)
        assert offload_is_lazy(manager) is lazy


def test_answers_are_not_kvcore_structures():
    kvm, _ = _churned()
    pool = kvm.block_pool
    ids = free_queue_block_ids(pool)
    ids.clear()  # a fresh list: the queue is untouched
    assert free_queue_block_ids(pool) == queue_ids(pool) != []
    assert isinstance(block_tables(kvm, "c"), tuple)
    assert all(isinstance(t, tuple) for t in block_tables(kvm, "c"))
