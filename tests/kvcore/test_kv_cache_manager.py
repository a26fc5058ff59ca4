"""KVCacheManager with one full-attention group: hits, allocation, caching, freeing, stats,
events."""

import pytest

from kvcore.core.block_pool import AllBlocksCleared, BlockStored
from kvcore.core.kv_cache_utils import make_block_hash_with_group_id
from kvcore.metrics.stats import CachingMetrics, PrefixCacheStats
from kvcore.request import RequestStatus
from paged_kv_lab.recording import events
from paged_kv_lab.recording.recorder import Recorder
from support.kv import (
    admit,
    hybrid,
    ids,
    make_manager,
    make_request,
    queue_ids,
    removed,
    stored,
)

COMMON = list(range(12))  # three full blocks of 4


def test_prefill_share_and_free_order_v033():
    """vLLM's test_prefill story with 0.33's free order."""
    kvm = make_manager(11, 4)
    pool = kvm.block_pool
    r0 = make_request("r0", COMMON + [100, 101, 102], 4)
    hits, n, _ = kvm.get_computed_blocks(r0)
    assert n == 0 and hits.blocks == ((),)
    new = kvm.allocate_slots(r0, 15, 0, hits)
    assert new.get_block_ids() == ([1, 2, 3, 4],)
    r0.num_computed_tokens = 15
    # Full blocks are cached inside allocate_slots (before the forward pass); the partial one is
    # not.
    assert [b.block_hash is not None for b in pool.blocks[1:5]] == [True, True, True, False]

    r1 = make_request("r1", COMMON + [200, 201], 4)
    hits, n, _ = kvm.get_computed_blocks(r1)
    assert n == 12 and hits.get_block_ids() == ([1, 2, 3],)
    new = kvm.allocate_slots(r1, 2, n, hits)
    assert new.get_block_ids() == ([5],)
    assert kvm.get_block_ids("r1") == ([1, 2, 3, 5],)
    assert [pool.blocks[i].ref_cnt for i in (1, 2, 3, 4, 5)] == [2, 2, 2, 1, 1]
    assert queue_ids(pool) == [6, 7, 8, 9, 10]

    kvm.free(r0)
    assert queue_ids(pool) == [4, 6, 7, 8, 9, 10]  # unhashed block 4 -> head
    kvm.free(r1)
    assert queue_ids(pool) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert kvm.get_block_ids("r0") == ([],)


def test_prefill_share_and_free_order_legacy():
    kvm = make_manager(11, 4, free_order="legacy")
    r0 = make_request("r0", COMMON + [100, 101, 102], 4)
    admit(kvm, r0)
    r1 = make_request("r1", COMMON + [200, 201], 4)
    admit(kvm, r1)
    kvm.free(r0)
    kvm.free(r1)
    # Older releases: unallocated, then r0's tail, r1's tail, the common prefix reversed.
    assert queue_ids(kvm.block_pool) == [6, 7, 8, 9, 10, 4, 5, 3, 2, 1]


def test_second_identical_request_shares_blocks_with_ref_cnt_2():
    kvm = make_manager(10, 4)
    a = make_request("a", list(range(10)), 4)
    admit(kvm, a)
    b = make_request("b", list(range(10)), 4)
    new, hits, n = admit(kvm, b)
    assert n == 8 and hits.get_block_ids() == ([1, 2],)
    assert kvm.get_block_ids("a") == ([1, 2, 3],)
    assert kvm.get_block_ids("b") == ([1, 2, 4],)
    assert [kvm.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4)] == [2, 2, 1, 1]


def test_hit_is_capped_at_num_tokens_minus_one():
    kvm = make_manager(10, 4)
    admit(kvm, make_request("a", list(range(8)), 4))  # two full blocks, both cached
    b = make_request("b", list(range(8)), 4)  # identical: 8 tokens, max hit 7
    hits, n, _ = kvm.get_computed_blocks(b)
    assert n == 4 and hits.get_block_ids() == ([1],)
    c = make_request("c", list(range(9)), 4)  # one more token: both blocks hit
    hits, n, _ = kvm.get_computed_blocks(c)
    assert n == 8 and hits.get_block_ids() == ([1, 2],)


def test_capped_hit_recomputes_a_block_which_then_has_a_twin():
    """Two blocks, one hash: the capped request recomputes block 1 into a new block."""
    kvm = make_manager(10, 4)
    a = make_request("a", list(range(8)), 4)
    admit(kvm, a)
    b = make_request("b", list(range(8)), 4)
    admit(kvm, b)
    assert kvm.get_block_ids("b") == ([1, 3],)
    pool = kvm.block_pool
    assert pool.blocks[3].block_hash == pool.blocks[2].block_hash
    assert pool.get_cached_block(a.block_hashes[1], [0]) == [pool.blocks[2]]


def test_two_concurrent_identical_prompts_make_two_blocks_with_one_hash():
    kvm = make_manager(10, 4)
    pool = kvm.block_pool
    a = make_request("a", list(range(10)), 4)
    b = make_request("b", list(range(10)), 4)
    ha, na, _ = kvm.get_computed_blocks(a)
    hb, nb, _ = kvm.get_computed_blocks(b)  # looked up before a cached anything
    assert na == nb == 0
    kvm.allocate_slots(a, 10, 0, ha)
    kvm.allocate_slots(b, 10, 0, hb)
    assert kvm.get_block_ids("a") == ([1, 2, 3],) and kvm.get_block_ids("b") == ([4, 5, 6],)
    for i, (x, y) in enumerate(((1, 4), (2, 5))):
        key = make_block_hash_with_group_id(a.block_hashes[i], 0)
        assert pool.blocks[x].block_hash == pool.blocks[y].block_hash == key
        assert dict(pool.cached_block_hash_to_block.block_ids())[key] == (x, y)
        assert pool.get_cached_block(a.block_hashes[i], [0]) == [pool.blocks[x]]  # first inserted
    c = make_request("c", list(range(10)), 4)
    _, hits, n = admit(kvm, c)
    assert hits.get_block_ids() == ([1, 2],) and n == 8


def test_partial_last_block_is_never_cached_until_it_fills():
    kvm = make_manager(10, 4)
    pool = kvm.block_pool
    a = make_request("a", list(range(10)), 4)
    admit(kvm, a)
    assert pool.blocks[3].block_hash is None
    a.append_output_token_ids([50])  # 11 tokens
    kvm.allocate_slots(a, 1)
    a.num_computed_tokens += 1
    assert pool.blocks[3].block_hash is None
    a.append_output_token_ids([51])  # 12 tokens: block 3 is full
    kvm.allocate_slots(a, 1)  # cached now, before its forward pass
    assert pool.blocks[3].block_hash == make_block_hash_with_group_id(a.block_hashes[2], 0)
    assert kvm.get_block_ids("a") == ([1, 2, 3],)


def test_chunked_allocation_caches_only_the_scheduled_full_blocks():
    kvm = make_manager(10, 4)
    pool = kvm.block_pool
    a = make_request("a", list(range(10)), 4)
    assert kvm.allocate_slots(a, 6).get_block_ids() == ([1, 2],)
    a.num_computed_tokens = 6
    assert [pool.blocks[i].block_hash is not None for i in (1, 2)] == [True, False]
    assert kvm.allocate_slots(a, 4).get_block_ids() == ([3],)
    a.num_computed_tokens = 10
    assert [pool.blocks[i].block_hash is not None for i in (1, 2, 3)] == [True, True, False]


def test_cache_salt_separates_identical_prompts():
    kvm = make_manager(20, 4)
    admit(kvm, make_request("plain", list(range(9)), 4))
    _, _, n = admit(kvm, make_request("salted", list(range(9)), 4, salt="tenant"))
    assert n == 0
    _, hits, n = admit(kvm, make_request("same-salt", list(range(9)), 4, salt="tenant"))
    assert n == 8 and hits.get_block_ids() == ([4, 5],)
    _, hits, n = admit(kvm, make_request("empty-salt", list(range(9)), 4, salt=""))
    assert n == 8 and hits.get_block_ids() == ([1, 2],)


def test_failed_allocation_changes_nothing_and_counts_hits_sitting_in_the_queue():
    kvm = make_manager(5, 4)  # usable blocks 1..4
    pool = kvm.block_pool
    a = make_request("a", COMMON, 4)
    admit(kvm, a)
    kvm.free(a)
    assert queue_ids(pool) == [4, 3, 2, 1]
    # 20 tokens: 3 hit blocks (all in the free queue) + 2 new = 5 > 4 free.
    b = make_request("b", COMMON + list(range(50, 58)), 4)
    hits, n, _ = kvm.get_computed_blocks(b)
    assert n == 12
    assert kvm.allocate_slots(b, 8, n, hits) is None
    assert queue_ids(pool) == [4, 3, 2, 1]
    assert all(blk.ref_cnt == 0 for blk in pool.blocks[1:])
    assert kvm.get_block_ids("b") == ([],)
    # 16 tokens: 3 hits + 1 new = 4 fits.
    c = make_request("c", COMMON + [50, 51, 52, 53], 4)
    hits, n, _ = kvm.get_computed_blocks(c)
    assert kvm.allocate_slots(c, 4, n, hits).get_block_ids() == ([4],)
    assert kvm.get_block_ids("c") == ([1, 2, 3, 4],)
    assert pool.get_num_free_blocks() == 0


def test_hits_already_in_use_do_not_count_in_the_capacity_check():
    kvm = make_manager(6, 4)  # usable 1..5
    admit(kvm, make_request("a", COMMON, 4))  # holds 1 2 3
    b = make_request("b", COMMON + list(range(50, 58)), 4)  # 3 hits in use + 2 new
    hits, n, _ = kvm.get_computed_blocks(b)
    coord = kvm.coordinator
    assert coord.get_num_blocks_to_allocate("b", 20, hits.blocks, n) == 2
    assert kvm.allocate_slots(b, 8, n, hits).get_block_ids() == ([4, 5],)


def test_full_sequence_must_fit_refuses_what_the_first_chunk_alone_would_get():
    kvm = make_manager(6, 4)  # usable 1..5
    admit(kvm, make_request("a", list(range(100, 108)), 4))  # holds 1 2
    b = make_request("b", list(range(16)), 4)  # whole prompt needs 4 blocks, 3 free
    assert kvm.allocate_slots(b, 4, full_sequence_must_fit=True) is None
    assert kvm.get_block_ids("b") == ([],)
    assert kvm.allocate_slots(b, 4).get_block_ids() == ([3],)


def test_reverse_free_keeps_the_shared_prefix_cached_longest():
    kvm = make_manager(6, 4)  # usable 1..5
    pool = kvm.block_pool
    a = make_request("a", list(range(17)), 4)  # 4 full blocks + 1 partial
    admit(kvm, a)
    assert kvm.get_block_ids("a") == ([1, 2, 3, 4, 5],)
    kvm.free(a)
    assert queue_ids(pool) == [5, 4, 3, 2, 1]
    filler = make_request("f", list(range(900, 908)), 4)  # takes 5 (unhashed) then 4
    admit(kvm, filler)
    assert kvm.get_block_ids("f") == ([5, 4],)
    again = make_request("again", list(range(17)), 4)
    hits, n, _ = kvm.get_computed_blocks(again)
    assert hits.get_block_ids() == ([1, 2, 3],) and n == 12


def test_prefix_cache_stats_count_admissions_as_vllm_does():
    kvm = make_manager(20, 4)
    a = make_request("a", COMMON + [1, 2, 3], 4)
    admit(kvm, a)
    b = make_request("b", COMMON + [7, 8], 4)
    admit(kvm, b)
    st = kvm.prefix_cache_stats
    assert (st.requests, st.queries, st.hits) == (2, 29, 12)
    assert st.hit_rate == pytest.approx(12 / 29)
    assert kvm.get_computed_blocks(make_request("x", COMMON + [5], 4))[1] == 12
    assert kvm.prefix_cache_stats.requests == 2  # a lookup alone is not counted
    interval = kvm.make_prefix_cache_stats()  # one step's stats, handed out once
    assert interval is st and kvm.prefix_cache_stats.requests == 0
    assert kvm.prefix_cache_totals.to_dict()["hits"] == 12
    assert kvm.caching_metrics.hit_rate == pytest.approx(12 / 29)
    kvm.free(b)
    b.status, b.num_computed_tokens, b.num_preemptions = RequestStatus.PREEMPTED, 0, 1
    admit(kvm, b)  # a resumed request is counted apart
    st = kvm.make_prefix_cache_stats()
    assert (st.requests, st.preempted_requests, st.preempted_queries, st.preempted_hits) == (
        0,
        1,
        14,
        12,
    )
    assert kvm.caching_metrics.aggregated_requests == 2  # preempted ones do not enter the hit rate
    assert kvm.reset_prefix_cache() is False  # blocks still in use: stats kept
    kvm.free(a)
    kvm.free(b)
    assert kvm.reset_prefix_cache() is True
    _, _, n = admit(kvm, make_request("c", COMMON + [1, 2, 3], 4))
    assert n == 0  # the reset really forgot the hashes
    st = kvm.make_prefix_cache_stats()
    assert (
        st.reset
        and kvm.prefix_cache_totals.requests == 1
        and kvm.caching_metrics.aggregated_requests == 1
    )


def test_caching_metrics_keep_the_last_n_requests_and_always_the_newest():
    m = CachingMetrics(max_recent_requests=3)
    for requests, queries, hits in ((2, 20, 10), (2, 10, 0), (5, 50, 50)):
        m.observe(PrefixCacheStats(requests=requests, queries=queries, hits=hits))
    # only the newest (over the limit) is kept
    assert (m.aggregated_requests, m.hit_rate) == (5, 1.0)
    m.observe(PrefixCacheStats())  # an empty interval pushes nothing out
    assert m.aggregated_requests == 5
    m.observe(PrefixCacheStats(reset=True, requests=1, queries=4, hits=0))
    assert (m.aggregated_requests, m.hit_rate) == (1, 0.0)


def test_watermark_keeps_blocks_free_for_admissions_only_while_others_run():
    kvm = make_manager(11, 4, watermark=0.2)  # int(0.2 * 11) = 2 blocks
    assert kvm.watermark_blocks == 2
    a = make_request("a", list(range(100, 124)), 4)  # 6 blocks of the 10 usable
    assert kvm.allocate_slots(a, 24, has_scheduled_reqs=False) is not None
    a.status = RequestStatus.RUNNING
    b = make_request("b", list(range(200, 212)), 4)  # 3 blocks: 4 free, but 3 + 2 > 4
    assert kvm.allocate_slots(b, 12, has_scheduled_reqs=True) is None
    assert kvm.allocate_slots(b, 12, has_scheduled_reqs=False) is not None
    assert kvm.allocate_slots(a, 2) is not None  # a running request ignores it


def test_max_cache_hit_length_caps_the_hit():
    kvm = make_manager(20, 4)
    admit(kvm, make_request("a", COMMON + [1, 2, 3], 4))
    b = make_request("b", COMMON + [7, 8], 4)
    assert kvm.get_computed_blocks(b)[1] == 12
    assert kvm.get_computed_blocks(b, max_cache_hit_length=9)[1] == 8
    assert kvm.get_computed_blocks(b, max_cache_hit_length=0)[1] == 0


def test_get_num_cached_tokens_probes_without_touching_anything():
    """vLLM 0.34's KVCacheManager.get_num_cached_tokens: the hit get_computed_blocks would
    find (the last token left out), with no reference taken, no block moved in the free queue,
    no stats counted and nothing told to the observer."""
    rec = Recorder()
    kvm = make_manager(20, 4, recorder=rec)
    a = make_request("a", COMMON + [1, 2, 3], 4)
    admit(kvm, a)
    kvm.free(a)  # its blocks are cached and free, in the free queue
    pool = kvm.block_pool
    rec.events.clear()
    stats = kvm.prefix_cache_stats.requests
    before = (queue_ids(pool), [b.ref_cnt for b in pool.blocks], pool.get_num_free_blocks())
    b = make_request("b", COMMON + [7, 8], 4)
    assert kvm.get_num_cached_tokens(b) == 12
    exact = make_request("c", COMMON, 4)  # its whole prompt is cached: the last block is not
    assert kvm.get_num_cached_tokens(exact) == 8
    cold = make_request("d", [90, 91, 92, 93, 94], 4)
    assert kvm.get_num_cached_tokens(cold) == 0
    after = (queue_ids(pool), [b.ref_cnt for b in pool.blocks], pool.get_num_free_blocks())
    assert after == before and rec.events == []
    assert kvm.prefix_cache_stats.requests == stats
    # the same length the admission's own lookup then finds
    assert kvm.get_computed_blocks(b)[1] == 12


def test_get_num_cached_tokens_is_0_when_the_request_may_not_read_the_cache():
    kvm = make_manager(20, 4)
    admit(kvm, make_request("a", COMMON + [1, 2, 3], 4))
    b = make_request("b", COMMON + [7, 8], 4)
    b.skip_reading_prefix_cache = True
    assert kvm.get_num_cached_tokens(b) == 0
    off = make_manager(20, 4, caching=False)
    admit(off, make_request("a", COMMON + [1, 2, 3], 4, caching=False))
    assert off.get_num_cached_tokens(make_request("b", COMMON + [7, 8], 4, caching=False)) == 0


def test_hybrid_get_num_cached_tokens_is_the_hit_every_group_agrees_on():
    kvm = make_manager(40, 4, hybrid(4))  # full attention + a 4-token sliding window
    admit(kvm, make_request("a", COMMON + [1, 2, 3], 4))
    b = make_request("b", COMMON + [7, 8], 4)
    assert kvm.get_num_cached_tokens(b) == 12 == kvm.get_computed_blocks(b)[1]
    assert not hasattr(kvm, "get_num_common_prefix_blocks")  # 0.34 removed it


def test_kv_cache_events_through_the_manager():
    kvm = make_manager(4, 2)  # usable 1..3
    a = make_request("a", [1, 2, 3, 4], 2)
    admit(kvm, a)
    h = a.block_hashes
    assert kvm.take_events() == [stored([h[0], h[1]], None, [1, 2, 3, 4], 2, kind="full_attention")]
    kvm.free(a)  # queue: 3 2 1
    b = make_request("b", [9, 9, 9, 9, 9, 9], 2)  # needs all three blocks
    admit(kvm, b)
    evs = kvm.take_events()
    assert evs[:2] == [removed(h[1]), removed(h[0])]
    assert isinstance(evs[2], BlockStored) and len(evs[2].block_hashes) == 3
    kvm.free(b)
    assert kvm.reset_prefix_cache() is True
    assert kvm.take_events() == [AllBlocksCleared()]


def test_caching_off_no_hits_no_hashes_every_freed_block_to_the_head():
    kvm = make_manager(8, 4, caching=False)
    a = make_request("a", list(range(12)), 4, caching=False)
    hits, n, _ = kvm.get_computed_blocks(a)
    assert n == 0
    kvm.allocate_slots(a, 12, 0, hits)
    assert all(b.block_hash is None for b in kvm.block_pool.blocks)
    kvm.free(a)
    assert queue_ids(kvm.block_pool) == [3, 2, 1, 4, 5, 6, 7]
    b = make_request("b", list(range(12)), 4, caching=False)
    assert kvm.get_computed_blocks(b)[1] == 0
    assert kvm.prefix_cache_stats.requests == 0


def test_block_size_one():
    kvm = make_manager(8, 1)
    a = make_request("a", [5, 6, 7], 1)
    admit(kvm, a)
    assert kvm.get_block_ids("a") == ([1, 2, 3],)
    assert all(kvm.block_pool.blocks[i].block_hash is not None for i in (1, 2, 3))
    b = make_request("b", [5, 6, 7], 1)
    _, hits, n = admit(kvm, b)
    assert n == 2 and kvm.get_block_ids("b") == ([1, 2, 4],)
    kvm.free(a)
    kvm.free(b)
    assert queue_ids(kvm.block_pool) == [5, 6, 7, 3, 4, 2, 1]


def test_usage_and_block_ids():
    kvm = make_manager(11, 4)
    assert kvm.usage == 0.0
    admit(kvm, make_request("a", list(range(10)), 4))
    assert kvm.usage == pytest.approx(0.3)
    assert kvm.get_block_ids("a") == ([1, 2, 3],)
    assert ids(kvm.get_blocks("a").blocks[0]) == [1, 2, 3]
    assert kvm.get_block_ids("nobody") == ([],)


def test_allocate_slots_needs_new_tokens():
    kvm = make_manager(4, 4)
    with pytest.raises(ValueError):
        kvm.allocate_slots(make_request("a", [1], 4), 0)


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block_size"):
        make_manager(4, 0)


def test_recorder_names_the_request_for_pool_events():
    rec = Recorder()
    kvm = make_manager(10, 4, recorder=rec)
    admit(kvm, make_request("a", list(range(10)), 4))
    rec.drain()
    admit(kvm, make_request("b", list(range(10)), 4))
    evs = rec.drain()
    kinds = [e.kind for e in evs]
    assert kinds == [events.CACHE_HIT, events.TOUCHED, events.ALLOCATED]
    assert all(e.request_id == "b" for e in evs)
    hit = evs[0]
    assert hit.block_ids == (1, 2) and hit.num_tokens == 8
    assert hit.preempted_before is False


def test_lookahead_slots_are_allocated_but_not_cached():
    kvm = make_manager(10, 4)
    a = make_request("a", list(range(8)), 4)
    new = kvm.allocate_slots(a, 8, num_lookahead_tokens=5)  # slots for 13 tokens
    assert new.get_block_ids() == ([1, 2, 3, 4],)
    hashed = [b.block_id for b in kvm.block_pool.blocks if b.block_hash is not None]
    assert hashed == [1, 2]  # only the 8 real tokens


def test_max_model_len_caps_the_slots():
    kvm = make_manager(10, 4, max_model_len=10)
    a = make_request("a", list(range(8)), 4)
    assert kvm.allocate_slots(a, 8, num_lookahead_tokens=8).get_block_ids() == ([1, 2, 3],)


def test_cached_blocks_carry_block_hash_num_tokens_until_they_lose_the_hash():
    kvm = make_manager(10, 4)
    a = make_request("a", COMMON + [1], 4)
    admit(kvm, a)
    table = kvm.get_block_ids("a")[0]
    assert [kvm.block_pool.blocks[b].block_hash_num_tokens for b in table] == [4, 8, 12, None]
    kvm.free(a)
    kvm.evict_blocks([table[1]])
    assert kvm.block_pool.blocks[table[1]].block_hash_num_tokens is None
