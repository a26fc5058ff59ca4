"""BlockPool and BlockHashToBlockMap, written from vLLM v1's block_pool.py (0.33 free order)."""

import pytest

from kvcore.core.block_pool import (
    AllBlocksCleared,
    BlockHashToBlockMap,
    BlockPool,
)
from kvcore.core.kv_cache_observer import KVCacheObserver
from kvcore.core.kv_cache_utils import KVCacheBlock, get_block_hash, make_block_hash_with_group_id
from kvcore.request import Request
from kvcore.utils.math_utils import cdiv
from paged_kv_lab.recording import events
from paged_kv_lab.recording.recorder import Recorder
from support.kv import (
    admit,
    ext,
    ids,
    make_manager,
    make_request,
    queue_ids,
    removed,
    stored,
    vllm_chain,
)


def pool(n=8, caching=True, free_order="v0.33", recorder=None, block_size=2):
    p = BlockPool(n, caching, block_size, True, free_order=free_order)
    if recorder is not None:
        recorder.attach_block_pool(p)
    return p


def cached_blocks(p, tokens, block_size=2, rid="r"):
    """Allocate and cache the full blocks of a prompt, as allocate_slots would."""
    req = make_request(rid, tokens, block_size)
    n_full = len(tokens) // block_size
    blocks = p.get_new_blocks(cdiv(len(tokens), block_size))
    p.cache_full_blocks(req, blocks, 0, n_full, block_size, 0)
    return req, blocks


# -- construction, null block, usage -------------------------------------------------------
def test_null_block_is_block_0_and_never_free():
    p = pool(5)
    assert p.null_block is p.blocks[0] and p.null_block.is_null
    assert p.get_num_free_blocks() == 4
    assert queue_ids(p) == [1, 2, 3, 4]
    assert p.null_block.prev_free_block is None and p.null_block.next_free_block is None
    assert p.get_usage() == 0.0


@pytest.mark.parametrize("n", [0, 1, -3, 2.5, None])
def test_pool_sizes_without_a_usable_block_are_rejected(n):
    with pytest.raises(ValueError, match="num_gpu_blocks must be an integer >= 2"):
        BlockPool(n, True, 4)
    with pytest.raises(ValueError, match="null block"):
        make_manager(n, 4)


def test_two_blocks_is_the_smallest_pool():
    p = pool(2)
    assert p.get_num_free_blocks() == 1
    assert ids(p.get_new_blocks(1)) == [1]
    assert p.get_usage() == 1.0


def test_unknown_free_order_rejected():
    with pytest.raises(ValueError, match="free_order"):
        BlockPool(4, True, 4, free_order="lifo")


def test_get_usage_counts_used_blocks_over_usable_ones():
    p = pool(11)
    blocks = p.get_new_blocks(4)
    assert p.get_usage() == pytest.approx(0.4)
    p.free_blocks(blocks)
    assert p.get_usage() == 0.0


# -- get_new_blocks ----------------------------------------------------------------------------
def test_get_new_blocks_pops_from_the_head():
    p = pool(8)
    got = p.get_new_blocks(3)
    assert ids(got) == [1, 2, 3]
    assert all(b.ref_cnt == 1 for b in got)
    assert queue_ids(p) == [4, 5, 6, 7]
    assert ids(p.get_new_blocks(2)) == [4, 5]


def test_get_new_blocks_refuses_clearly_and_changes_nothing():
    p = pool(4)
    p.get_new_blocks(1)
    with pytest.raises(ValueError, match=r"Cannot get 3 free blocks.*only 2 free"):
        p.get_new_blocks(3)
    assert queue_ids(p) == [2, 3]
    assert p.get_new_blocks(0) == []


# -- free_blocks: LRU order, 0.33 head/tail split, legacy ---------------------------------------
def test_freed_cached_blocks_join_the_tail_in_the_given_order():
    p = pool(8)
    _, blocks = cached_blocks(p, [1, 2, 3, 4, 5, 6])  # blocks 1 2 3, all full and hashed
    assert all(b.block_hash is not None for b in blocks)
    p.free_blocks([blocks[1], blocks[2], blocks[0]])
    assert queue_ids(p) == [4, 5, 6, 7, 2, 3, 1]
    assert all(b.ref_cnt == 0 for b in blocks)


def test_lru_order_after_frees_from_several_requests():
    """Blocks freed earlier are evicted earlier (the tail is the most recently freed)."""
    p = pool(10)
    _, a = cached_blocks(p, [1, 2, 3, 4], rid="a")  # blocks 1 2
    _, b = cached_blocks(p, [9, 9, 8, 8], rid="b")  # blocks 3 4
    p.free_blocks(reversed(b))
    p.free_blocks(reversed(a))
    assert queue_ids(p) == [5, 6, 7, 8, 9, 4, 3, 2, 1]
    # Allocating everything else, then 4 more, pops in exactly that order.
    p.get_new_blocks(5)
    assert ids(p.get_new_blocks(4)) == [4, 3, 2, 1]


def test_v033_unhashed_blocks_go_to_the_head_hashed_to_the_tail():
    p = pool(8)
    req, blocks = cached_blocks(p, [1, 2, 3, 4, 5])  # blocks 1 2 hashed, block 3 partial
    assert blocks[2].block_hash is None
    p.free_blocks(reversed(blocks))  # order 3, 2, 1
    assert queue_ids(p) == [3, 4, 5, 6, 7, 2, 1]
    # The partial block is reused first; the cached ones survive.
    assert ids(p.get_new_blocks(1)) == [3]


def test_v033_several_unhashed_blocks_keep_their_free_order_at_the_head():
    p = pool(8, caching=False)
    blocks = p.get_new_blocks(3)
    p.free_blocks(reversed(blocks))
    assert queue_ids(p) == [3, 2, 1, 4, 5, 6, 7]


def test_legacy_free_order_appends_everything_to_the_tail():
    p = pool(8, free_order="legacy")
    _, blocks = cached_blocks(p, [1, 2, 3, 4, 5])
    p.free_blocks(reversed(blocks))
    assert queue_ids(p) == [4, 5, 6, 7, 3, 2, 1]


def test_free_of_a_shared_block_only_decrements():
    p = pool(6)
    _, blocks = cached_blocks(p, [1, 2])
    p.touch(blocks)
    assert blocks[0].ref_cnt == 2
    p.free_blocks(blocks)
    assert blocks[0].ref_cnt == 1 and 1 not in queue_ids(p)
    p.free_blocks(blocks)
    assert queue_ids(p)[-1] == 1


def test_null_block_is_never_freed_or_queued():
    p = pool(5)
    p.free_blocks([p.null_block, p.null_block])
    assert 0 not in queue_ids(p)
    assert p.get_num_free_blocks() == 4
    p.evict_blocks([0])
    assert p.null_block.block_hash is None
    assert 0 not in ids(p.get_new_blocks(4))


# -- touch ----------------------------------------------------------------------------------------
def test_touch_pulls_a_free_block_out_of_the_middle_of_the_queue():
    rec = Recorder()
    p = pool(8, recorder=rec)
    _, blocks = cached_blocks(p, [1, 2, 3, 4, 5, 6])
    p.free_blocks(reversed(blocks))
    assert queue_ids(p) == [4, 5, 6, 7, 3, 2, 1]
    rec.drain()
    p.touch([blocks[1]])  # block 2 sits at position 5
    assert queue_ids(p) == [4, 5, 6, 7, 3, 1]
    assert blocks[1].ref_cnt == 1
    assert blocks[1].block_hash is not None  # a hit keeps its hash
    (ev,) = rec.drain()
    assert ev.kind == events.TOUCHED and ev.block_ids == (2,)
    assert ev.from_queue == (2,) and ev.queue_positions == (5,)


def test_touch_of_a_block_in_use_only_increments():
    p = pool(6)
    blocks = p.get_new_blocks(2)
    before = queue_ids(p)
    p.touch(blocks)
    assert [b.ref_cnt for b in blocks] == [2, 2]
    assert queue_ids(p) == before


# -- prefix cache map: insert, get_cached_block, duplicates ---------------------------------------
def test_cache_full_blocks_registers_hash_plus_group_id():
    p = pool(8)
    req, blocks = cached_blocks(p, [1, 2, 3, 4, 5])
    expect = vllm_chain([1, 2, 3, 4, 5], 2)
    assert req.block_hashes == expect
    assert blocks[0].block_hash == make_block_hash_with_group_id(expect[0], 0)
    assert p.get_cached_block(expect[1], [0]) == [blocks[1]]
    assert p.get_cached_block(expect[1], [1]) is None  # same hash, other group: no entry
    assert p.get_cached_block(expect[1], [0, 1]) is None  # a miss in any group is a miss


def test_two_blocks_with_one_hash_get_cached_block_returns_the_first_inserted():
    p = pool(8)
    ra, a = cached_blocks(p, [7, 7, 8, 8], rid="a")  # blocks 1 2
    rb, b = cached_blocks(p, [7, 7, 8, 8], rid="b")  # blocks 3 4: same content, computed alongside
    h0 = ra.block_hashes[0]
    assert rb.block_hashes[0] == h0
    assert a[0].block_hash == b[0].block_hash
    assert p.get_cached_block(h0, [0]) == [a[0]]
    key = make_block_hash_with_group_id(h0, 0)
    assert dict(p.cached_block_hash_to_block.block_ids())[key] == (1, 3)
    # Evicting the first one leaves the second findable.
    p.evict_blocks([1])
    assert p.get_cached_block(h0, [0]) == [b[0]]
    p.evict_blocks([3])
    assert p.get_cached_block(h0, [0]) is None


def test_block_hash_to_block_map_stores_block_ids_and_keeps_a_keys_place_as_vllm_034():
    """vLLM 0.34 maps each key to one block id (the first inserted of those remaining) and keeps
    a key's other block ids apart, in insertion order; popping one of a key's blocks, or an id
    the key does not hold, leaves the key where it is in the map's order (0.33 took the key out
    and put it back at the end)."""
    blocks = [KVCacheBlock(i) for i in range(4)]
    m = BlockHashToBlockMap(blocks)
    m.insert(b"k", blocks[1])
    m.insert(b"j", blocks[3])
    m.insert(b"k", blocks[2])
    assert m._cache == {b"k": 1, b"j": 3} and m._dup_ids == {b"k": {1: None, 2: None}}
    assert list(m.block_ids()) == [(b"k", (1, 2)), (b"j", (3,))]
    assert m.contain(b"k", 2) and not m.contain(b"j", 1)
    assert m.pop(b"j", 9) is None and list(m._cache) == [b"k", b"j"]
    assert m.pop(b"k", 1) is blocks[1]
    assert list(m._cache) == [b"k", b"j"] and m._dup_ids == {}
    assert m.get_one_block(b"k") is blocks[2]
    assert list(m.block_ids()) == [(b"k", (2,)), (b"j", (3,))]


def test_block_hash_to_block_map_semantics():
    b0, b1, b2 = (KVCacheBlock(i) for i in range(3))
    m = BlockHashToBlockMap([b0, b1, b2])
    assert m.get_one_block(b"k") is None and m.pop(b"k", 1) is None
    m.insert(b"k", b1)
    m.insert(b"k", b2)
    assert m.get_one_block(b"k") is b1 and len(m) == 1
    assert m.pop(b"k", 9) is None  # wrong id: nothing popped
    assert m.get_one_block(b"k") is b1
    assert m.pop(b"k", 1) is b1
    assert m.get_one_block(b"k") is b2
    assert m.pop(b"k", 2) is b2
    assert len(m) == 0 and m.get_one_block(b"k") is None


# -- eviction: lazy, on pop; evict_blocks ----------------------------------------------------------
def test_eviction_is_lazy_the_hash_goes_only_when_the_block_is_popped():
    rec = Recorder()
    p = pool(6, recorder=rec)  # usable 1..5
    req, blocks = cached_blocks(p, [1, 2, 3, 4])  # blocks 1 2, both cached
    p.take_events()
    p.free_blocks(reversed(blocks))  # queue: 3 4 5 2 1
    h0, h1 = req.block_hashes
    # Free but not popped: still cached and still hittable.
    assert p.get_cached_block(h1, [0]) == [blocks[1]]
    assert blocks[1].block_hash is not None
    rec.drain()
    got = p.get_new_blocks(3)  # 3 4 5: nothing evicted yet
    assert ids(got) == [3, 4, 5] and p.take_events() == []
    got = p.get_new_blocks(1)  # block 2 is the head now
    assert ids(got) == [2]
    assert blocks[1].block_hash is None
    assert p.get_cached_block(h1, [0]) is None
    assert p.get_cached_block(h0, [0]) == [blocks[0]]  # the prefix block survives longest
    assert p.take_events() == [removed(h1)]
    evs = rec.drain()
    ev = [e for e in evs if e.kind == events.EVICTED]
    assert len(ev) == 1 and ev[0].block_ids == (2,) and ev[0].block_hash == h1.hex()
    alloc = [e for e in evs if e.kind == events.ALLOCATED][-1]
    assert alloc.evicted_hashes == {2: h1.hex()}
    assert alloc.to_dict()["evicted_hashes"] == {"2": h1.hex()}  # JSON-friendly keys


def test_evict_blocks_drops_hashes_even_of_blocks_in_use_and_frees_nothing():
    p = pool(6)
    req, blocks = cached_blocks(p, [1, 2, 3, 4])
    p.take_events()
    free_before = queue_ids(p)
    p.evict_blocks({2})
    assert blocks[1].block_hash is None and blocks[1].ref_cnt == 1
    assert p.get_cached_block(req.block_hashes[1], [0]) is None
    assert p.get_cached_block(req.block_hashes[0], [0]) == [blocks[0]]
    assert queue_ids(p) == free_before
    assert p.take_events() == [removed(req.block_hashes[1])]
    p.evict_blocks([2, 4])  # nothing cached there: no event
    assert p.take_events() == []


def _evicting_scenario(observed: bool, use_int: bool, partial: bool):
    """The cached blocks the eviction path meets: a key held by one block, a key held by two
    blocks (two requests computed one prompt), and with ``partial`` a block with a partial
    entry besides its key (hashes every 2 tokens, blocks of 4). -> (the pool, each request's
    blocks)."""
    p = BlockPool(12, True, 2, True, use_int_block_hashes=use_int)
    if observed:  # any observer: the pool takes its general path
        p.observer = KVCacheObserver()
    a, b = make_request("a", range(8), 2), make_request("b", range(8), 2)
    blocks_a, blocks_b = p.get_new_blocks(2), p.get_new_blocks(2)
    p.cache_full_blocks(a, blocks_a, 0, 2, 4, 0)
    p.cache_full_blocks(b, blocks_b, 0, 2, 4, 0)  # the same keys: two blocks each
    c = make_request("c", range(20, 28), 2)
    blocks_c = p.get_new_blocks(2)
    p.cache_full_blocks(c, blocks_c, 0, 1, 4, 0)
    p.cache_partial_block(c, blocks_c[1], 8, 0, 4)  # at the block's end: its primary key
    if partial:
        p.cache_partial_block(c, blocks_c[1], 6, 0, 4)  # an earlier boundary: a further key
    return p, [blocks_a, blocks_b, blocks_c]


def _pool_state(p):
    return (
        queue_ids(p),
        list(p.cached_block_hash_to_block.block_ids()),
        sorted((i, sorted(keys)) for i, keys in p.cached_block_hashes_by_block.items()),
        [(b.ref_cnt, b.block_hash, b.block_hash_num_tokens) for b in p.blocks],
    )


@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("use_int", [True, False])
def test_eviction_fast_path_matches_the_general_one(use_int, partial):
    """Without an observer or partial entries, get_new_blocks pops and evicts in one loop of
    its own (the queue's popleft_n fused in), and _maybe_evict_cached_block drops a block's one
    key without lists: the same blocks, queue, map and KV events as with an observer (the
    general path, key by key), after taking part of the queue and after taking the rest."""
    runs = []
    for observed in (False, True):
        p, tables = _evicting_scenario(observed, use_int, partial)
        out = [p.take_events()]
        p.evict_blocks([tables[0][1].block_id])  # one of a key's two blocks, in use
        out.append(p.take_events())
        for blocks in tables:
            p.free_blocks(reversed(blocks))
        first = p.get_new_blocks(7)  # part of the queue (fresh and cached blocks): head relinked
        out += [ids(first), p.take_events(), _pool_state(p), p.get_num_free_blocks()]
        got = first + p.get_new_blocks(p.get_num_free_blocks())  # evicts every cached block
        out += [ids(got), p.take_events(), _pool_state(p)]
        assert all(b.prev_free_block is None and b.next_free_block is None for b in got)
        p.free_blocks(got)
        out.append(_pool_state(p))
        runs.append(out)
    assert runs[0] == runs[1]
    removed_events = runs[0][3] + runs[0][7]
    # a's first key and b's two (a's second went by id), c's two keys (+ its partial entry)
    assert len(removed_events) == 5 + partial
    assert len(p.cached_block_hash_to_block) == 0 and not p.cached_block_hashes_by_block


def test_evict_blocks_rejects_ids_outside_the_pool():
    p = pool(4)
    with pytest.raises(ValueError, match="outside the pool"):
        p.evict_blocks([4])


# -- reset_prefix_cache ----------------------------------------------------------------------------
def test_reset_prefix_cache_refuses_while_blocks_are_in_use():
    rec = Recorder()
    p = pool(6, recorder=rec)
    req, blocks = cached_blocks(p, [1, 2, 3, 4])
    p.take_events()
    assert p.reset_prefix_cache() is False
    assert blocks[0].block_hash is not None
    assert p.get_cached_block(req.block_hashes[0], [0]) == [blocks[0]]
    assert p.take_events() == []
    ev = [e for e in rec.drain() if e.kind == events.RESET][-1]
    assert ev == events.PrefixCacheReset(ok=False, blocks_in_use=2)


def test_reset_prefix_cache_clears_every_hash_once_all_blocks_are_free():
    p = pool(6)
    req, blocks = cached_blocks(p, [1, 2, 3, 4])
    p.free_blocks(reversed(blocks))
    p.take_events()
    order = queue_ids(p)
    cache = p.cached_block_hash_to_block
    assert p.reset_prefix_cache() is True
    assert all(b.block_hash is None for b in p.blocks)
    # vLLM 0.34 clears the map in place (a new map made after the engine's gc.freeze() at
    # start-up would not be frozen), so whoever holds the map sees it emptied
    assert p.cached_block_hash_to_block is cache and len(cache) == 0
    assert p.get_cached_block(req.block_hashes[0], [0]) is None
    assert p.take_events() == [AllBlocksCleared()]
    assert queue_ids(p) == order  # the queue itself is untouched


# -- KV cache events -------------------------------------------------------------------------------
def test_block_stored_events_carry_parent_hash_token_ids_and_block_size():
    p = pool(8)
    req = make_request("r", [1, 2, 3, 4, 5], 2)
    blocks = p.get_new_blocks(3)
    p.cache_full_blocks(req, blocks, 0, 2, 2, 0)
    h = req.block_hashes
    assert p.take_events() == [stored([h[0], h[1]], None, [1, 2, 3, 4], 2)]
    req.append_output_token_ids([6])  # block 2 is full now
    p.cache_full_blocks(req, blocks, 2, 3, 2, 0)
    assert p.take_events() == [stored([req.block_hashes[2]], h[1], [5, 6], 2)]
    assert p.take_events() == []  # drained


def test_block_stored_events_name_the_requests_session_and_it_hashes_nothing():
    p = pool(8)
    req = make_request("r", [1, 2, 3, 4], 2)
    req.session_id = "agent-1"
    p.cache_full_blocks(req, p.get_new_blocks(2), 0, 2, 2, 0)
    (ev,) = p.take_events()
    assert ev.session_id == "agent-1"
    assert req.block_hashes == make_request("s", [1, 2, 3, 4], 2).block_hashes


def test_emit_cached_block_events_reports_a_hit_prefix_and_changes_no_block():
    p = pool(8)
    req, blocks = cached_blocks(p, [1, 2, 3, 4, 5, 6])
    p.take_events()
    hashes = [b.block_hash for b in p.blocks]
    order = queue_ids(p)
    hit = make_request("hit", [1, 2, 3, 4, 5, 6, 7], 2)
    p.emit_cached_block_events(hit, 2, 2, 1)
    h = hit.block_hashes
    assert p.take_events() == [stored([h[0], h[1]], None, [1, 2, 3, 4], 2, group=1)]
    assert [b.block_hash for b in p.blocks] == hashes and queue_ids(p) == order
    p.emit_cached_block_events(hit, 0, 2, 0)  # no hit: no event
    assert p.take_events() == []


def test_emit_cached_block_events_is_silent_without_kv_events():
    p = BlockPool(6, True, 2, enable_kv_cache_events=False)
    p.emit_cached_block_events(make_request("r", [1, 2, 3, 4, 5], 2), 2, 2, 0)
    assert p.kv_event_queue == []


@pytest.mark.parametrize("mode, reported", [("full", True), ("incremental", False)])
def test_a_full_report_mode_request_publishes_its_hit_blocks_on_lookup(mode, reported):
    kvm = make_manager(8, 2)
    first = make_request("a", [1, 2, 3, 4, 5], 2)
    admit(kvm, first)
    kvm.take_events()
    again = Request(
        "b", [1, 2, 3, 4, 5], 4, block_hasher=first._block_hasher, kv_cache_report_mode=mode
    )
    hits, num_hit, _ = kvm.get_computed_blocks(again)
    assert num_hit == 4
    h = again.block_hashes
    expected = [stored([h[0], h[1]], None, [1, 2, 3, 4], 2, kind="full_attention")]
    assert kvm.take_events() == (expected if reported else [])


def test_no_kv_events_when_disabled():
    p = BlockPool(6, True, 2, enable_kv_cache_events=False)
    req = make_request("r", [1, 2, 3, 4], 2)
    blocks = p.get_new_blocks(2)
    p.cache_full_blocks(req, blocks, 0, 2, 2, 0)
    p.free_blocks(blocks)
    p.get_new_blocks(5)
    assert p.take_events() == []


def test_cache_full_blocks_skips_blocks_already_cached_and_null_blocks():
    p = pool(8)
    req = make_request("r", [1, 2, 3, 4, 5, 6], 2)
    blocks = p.get_new_blocks(3)
    p.cache_full_blocks(req, blocks, 0, 1, 2, 0)
    p.take_events()
    table = [blocks[0], p.null_block, blocks[2]]
    p.cache_full_blocks(req, table, 0, 3, 2, 0)  # block 1 already cached, slot 1 is null
    assert p.null_block.block_hash is None
    assert blocks[2].block_hash == make_block_hash_with_group_id(req.block_hashes[2], 0)
    (ev,) = p.take_events()
    assert ev.block_hashes == [ext(req.block_hashes[2])]  # only the newly stored hash


def test_recorder_reports_allocations_and_frees_with_their_reasons():
    rec = Recorder()
    p = pool(8, recorder=rec)
    req, blocks = cached_blocks(p, [1, 2, 3])
    evs = rec.drain()
    alloc = [e for e in evs if e.kind == events.ALLOCATED][0]
    assert alloc.block_ids == (1, 2) and alloc.queue_positions == (0, 1)
    cached = [e for e in evs if e.kind == events.CACHED][0]
    assert cached.block_ids == (1,) and cached.block_hashes == (req.block_hashes[0].hex(),)
    p.free_blocks(reversed(blocks))
    (ev,) = rec.drain()
    assert ev.kind == events.FREED and ev.block_ids == (2, 1)
    assert ev.to_head == (2,) and ev.to_tail == (1,)
    # a lone pool's calls name no request and no reason: the managers' calls do
    # (test_kv_cache_manager)
    assert ev.reason == "" and ev.request_id is None and ev.still_used == ()
    assert get_block_hash(blocks[0].block_hash) == req.block_hashes[0]
