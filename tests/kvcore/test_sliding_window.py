"""SlidingWindowManager: null slots, right-to-left hit search, sparse (0.33) vs dense retention."""

import pytest

from kvcore.core.kv_cache_utils import make_block_hash_with_group_id
from kvcore.core.single_type_kv_cache_manager import SlidingWindowManager
from paged_kv_lab.recording import events
from paged_kv_lab.recording.recorder import Recorder
from support.kv import (
    admit,
    make_engine,
    make_manager,
    make_request,
    queue_ids,
    sliding,
    spec,
)

W, BS = 4, 2  # a token sees itself and 3 before it: cdiv(3, 2) = 2 contiguous blocks cover it


def manager(n=12, retention=0, recorder=None):
    kvm = make_manager(n, BS, sliding(W), retention_interval=retention, recorder=recorder)
    return kvm, kvm.coordinator.single_type_managers[0]


def test_contiguous_blocks_and_skipped_tokens():
    _, m = manager()
    assert isinstance(m, SlidingWindowManager)
    assert m.contiguous_blocks == 2
    assert [m.get_num_skipped_tokens(n) for n in (0, 3, 4, 7, 11)] == [0, 0, 1, 4, 8]


@pytest.mark.parametrize("window", [0, -1])
def test_window_must_be_positive(window):
    with pytest.raises(ValueError, match="sliding_window"):
        make_manager(8, 2, sliding(window))


# -- right-to-left hit search (cf. vLLM's test_sliding_window_possible_cached_prefix) --------------
@pytest.mark.parametrize(
    "cached, expect_len",
    [
        ([], 0),
        ([False], 0),
        ([True], 1),  # fewer than a window: a run from block 0 counts
        ([True, True], 2),
        ([True, True, False], 2),
        ([False, True, True], 3),  # [null, b1, b2]
        ([True, False, True], 1),  # run from the right too short; [b0]
        ([True, True, False, True], 2),
        ([True, False, True, False, True, True, False, True], 6),  # [null x4, b4, b5]
        ([False, False, False, True, True, True, True], 7),  # first run from the right wins
        ([False, True, False, True], 0),
    ],
)
def test_find_longest_cache_hit_searches_from_the_right(cached, expect_len):
    kvm, m = manager(n=20)
    pool = kvm.block_pool
    hashes = [bytes([i]) * 8 for i in range(len(cached))]
    for i, c in enumerate(cached):
        if c:
            pool.cached_block_hash_to_block.insert(
                make_block_hash_with_group_id(hashes[i], 0), pool.blocks[10 + i]
            )
    (hit,), _ = m.find_longest_cache_hit(hashes, len(cached) * BS, [0])
    assert len(hit) == expect_len
    # The last contiguous_blocks (or the run from block 0) are real; everything before is null.
    real = [i for i, b in enumerate(hit) if not b.is_null]
    assert all(hit[i] is pool.blocks[10 + i] for i in real)
    assert all(hit[i].is_null for i in range(len(hit)) if i not in real)
    if expect_len >= 2 and len(real) != expect_len:
        assert real == [expect_len - 2, expect_len - 1]


def test_hit_search_respects_max_length():
    kvm, m = manager(n=20)
    pool = kvm.block_pool
    hashes = [bytes([i]) * 8 for i in range(6)]
    for i in range(6):
        pool.cached_block_hash_to_block.insert(
            make_block_hash_with_group_id(hashes[i], 0), pool.blocks[10 + i]
        )
    (hit,), _ = m.find_longest_cache_hit(hashes, 7, [0])  # 7 tokens -> at most 3 blocks
    assert [b.block_id for b in hit] == [0, 11, 12]


# -- null slots ------------------------------------------------------------------------------------
def test_blocks_outside_the_window_become_null_slots_and_are_freed():
    rec = Recorder()
    kvm, m = manager(recorder=rec)
    pool = kvm.block_pool
    r = make_request("r", list(range(11)), BS)
    admit(kvm, r)
    assert kvm.get_block_ids("r") == ([1, 2, 3, 4, 5, 6],)
    rec.drain()
    r.append_output_token_ids([99])
    assert kvm.allocate_slots(r, 1).get_block_ids() == ([],)  # 12 tokens still fit 6 slots
    # 11 computed tokens: the next token sees tokens 8..11, so tokens 0..7 (blocks 0..3) are
    # skipped.
    assert kvm.get_block_ids("r") == ([0, 0, 0, 0, 5, 6],)
    ev = [e for e in rec.drain() if e.kind == events.WINDOW_SKIPPED][0]
    assert ev.block_ids == (4, 3, 2, 1) and ev.slots == (3, 2, 1, 0)
    assert all(pool.blocks[i].ref_cnt == 0 for i in (1, 2, 3, 4))
    assert pool.null_block.ref_cnt <= 0 and 0 not in queue_ids(pool)
    # Later calls do not touch the slots that are already null; the new block comes from the
    # head, where the unhashed blocks that just left the window were put (0.33).
    r.num_computed_tokens = 12
    r.append_output_token_ids([98])
    kvm.allocate_slots(r, 1)
    assert kvm.get_block_ids("r") == ([0, 0, 0, 0, 5, 6, 3],)


def test_sparse_retention_hashes_only_what_a_resend_can_hit():
    kvm, _ = manager(retention=0)
    pool = kvm.block_pool
    r = make_request("r", list(range(11)), BS)  # 5 full prompt blocks
    admit(kvm, r)
    # end = (11 - 1) // 2 = 5: blocks 3 and 4 (ids 4, 5) cover the window of a resend.
    assert [pool.blocks[i].block_hash is not None for i in range(1, 7)] == [
        False,
        False,
        False,
        True,
        True,
        False,
    ]
    r.append_output_token_ids([99])
    kvm.allocate_slots(r, 1)
    # Window moved: ids 4..1 freed; unhashed 3 2 1 go to the head, hashed 4 to the tail.
    assert queue_ids(pool) == [3, 2, 1, 7, 8, 9, 10, 11, 4]
    assert pool.blocks[6].block_hash is None  # decode block: never hashed


def test_dense_retention_hashes_every_full_block():
    kvm, _ = manager(retention=None)
    pool = kvm.block_pool
    r = make_request("r", list(range(11)), BS)
    admit(kvm, r)
    assert [pool.blocks[i].block_hash is not None for i in range(1, 7)] == [True] * 5 + [False]
    r.append_output_token_ids([99])
    kvm.allocate_slots(r, 1)
    assert queue_ids(pool) == [7, 8, 9, 10, 11, 4, 3, 2, 1]
    assert pool.blocks[6].block_hash is not None  # decode block filled and hashed


@pytest.mark.parametrize("retention", [0, None], ids=["sparse", "dense"])
def test_resend_hits_the_window_blocks_with_null_slots_before_them(retention):
    kvm, m = manager(retention=retention)
    pool = kvm.block_pool
    r = make_request("r", list(range(11)), BS)
    admit(kvm, r)
    r.append_output_token_ids([99])
    kvm.allocate_slots(r, 1)
    kvm.free(r)
    b = make_request("b", list(range(11)), BS)
    hits, n, _ = kvm.get_computed_blocks(b)
    assert n == 10 and hits.get_block_ids() == ([0, 0, 0, 4, 5],)
    # Needed: 1 new block + the 2 hits that sit in the free queue (the nulls are skipped).
    assert kvm.coordinator.get_num_blocks_to_allocate("b", 11, hits.blocks, 10) == 3
    new = kvm.allocate_slots(b, 1, n, hits)
    assert len(new.blocks[0]) == 1
    assert kvm.get_block_ids("b")[0][:5] == [0, 0, 0, 4, 5]
    assert pool.blocks[4].ref_cnt == pool.blocks[5].ref_cnt == 1


def test_sparse_decode_blocks_never_get_a_hash_and_go_to_the_head():
    kvm, _ = manager(n=20, retention=0)
    pool = kvm.block_pool
    r = make_request("r", [1, 2, 3, 4, 5], BS)  # keep range: blocks 0, 1
    admit(kvm, r)
    for t in range(9):
        r.append_output_token_ids([100 + t])
        kvm.allocate_slots(r, 1)
        r.num_computed_tokens += 1
    table = kvm.get_block_ids("r")[0]
    live = [pool.blocks[i] for i in table if i != 0]
    assert all(b.block_hash is None for b in live)
    hashed = {b.block_id for b in pool.blocks if b.block_hash is not None}
    assert hashed == {1, 2}
    kvm.free(r)
    head = queue_ids(pool)[: len(live)]
    assert set(head) == {b.block_id for b in live}
    assert queue_ids(pool)[-2:] == [1, 2]  # left the window one by one, long ago


def test_window_blocks_are_freed_even_when_allocation_then_fails():
    kvm, _ = manager(n=7)  # usable 1..6
    pool = kvm.block_pool
    r = make_request("r", list(range(11)), BS)
    admit(kvm, r)
    assert pool.get_num_free_blocks() == 0
    assert kvm.allocate_slots(r, 20) is None  # 31 tokens will never fit
    assert kvm.get_block_ids("r") == ([0, 0, 0, 0, 5, 6],)
    assert sorted(queue_ids(pool)) == [1, 2, 3, 4]


def test_engine_sliding_window_runs_long_decodes_in_a_small_pool():
    """With a window the pool only needs the blocks in the window, not the whole sequence."""
    eng = make_engine(
        [spec("a", list(range(6)), max_tokens=30)], block_size=2, num_gpu_blocks=5, sliding_window=4
    )
    eng.run()
    assert eng.outputs()["a"]["finish_reason"] == "finished_length"
    assert len(eng.outputs()["a"]["token_ids"]) == 30
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 4


def test_admission_caps_a_sliding_groups_need_at_the_window_plus_one_step():
    """vLLM admits a prompt longer than the pool when only a window of it is ever held:
    window 8, block 4, budget 8 -> at most cdiv(min(8 - 1 + 8, max_model_len), 4) + 1 = 5 blocks."""
    eng = make_engine(
        [spec("a", list(range(40)), max_tokens=2)],
        block_size=4,
        num_gpu_blocks=8,
        sliding_window=8,
        max_num_batched_tokens=8,
    )
    m = eng.kv_cache_manager.coordinator.single_type_managers[0]
    assert m.max_admission_blocks_per_request == 5
    recs = eng.run()
    assert recs[0].scheduled == {"a": 8}
    assert [r.scheduled["a"] for r in recs] == [8] * 5 + [1]
    assert max(sum(1 for b in r.snapshot.request("a").block_tables[0] if b) for r in recs[:-1]) <= 5
    assert eng.outputs()["a"]["finish_reason"] == "finished_length"


def test_admission_cap_still_refuses_what_one_window_cannot_fit():
    # 4 usable blocks < the 5 the cap counts: refused, and the engine says it never fits.
    eng = make_engine(
        [spec("a", list(range(40)), max_tokens=2)],
        block_size=4,
        num_gpu_blocks=5,
        sliding_window=8,
        max_num_batched_tokens=8,
    )
    rec = eng.step()
    assert rec.scheduled == {}
    assert eng.outputs()["a"]["finish_reason"] == "finished_aborted"


@pytest.mark.parametrize("retention", [None, 0, 4])
def test_a_window_of_one_caches_nothing(retention):
    """Window 1: a token sees only itself, so a hit needs no earlier block and vLLM's
    retention mask keeps none, even when every block would be kept otherwise."""
    kvm = make_manager(12, BS, sliding(1), retention_interval=retention)
    r = make_request("r", list(range(11)), BS)
    admit(kvm, r)
    assert all(b.block_hash is None for b in kvm.block_pool.blocks)


def test_retention_interval_keeps_a_checkpoint_every_n_tokens():
    # W 4, block 2: a hit needs 2 blocks; interval 8 tokens = 4 blocks -> blocks 2, 3 of every 4,
    # plus the 2 blocks ending at num_prompt_tokens - 1 = 16 (blocks 6, 7).
    kvm = make_manager(30, BS, sliding(W), retention_interval=8)
    r = make_request("r", list(range(17)), BS)
    admit(kvm, r)
    table = kvm.get_block_ids("r")[0]
    hashed = [i for i, bid in enumerate(table) if kvm.block_pool.blocks[bid].block_hash is not None]
    assert hashed == [2, 3, 6, 7]
    # An interval no larger than what a hit needs keeps every block.
    kvm = make_manager(30, BS, sliding(W), retention_interval=4)
    r = make_request("r", list(range(17)), BS)
    admit(kvm, r)
    assert sum(b.block_hash is not None for b in kvm.block_pool.blocks) == 8


def test_a_connectors_tokens_alone_leave_the_blocks_below_the_window_null():
    """An asynchronous load of 144 external tokens (no local hit) into a 64-token window of
    16-token blocks: the 5 blocks wholly below the window are nulls and only the 4 the window
    needs are allocated, as many as the admission check counted (vLLM 0.34.0:
    ``add_local_computed_blocks`` pads by all computed tokens, the connector's included). Before,
    kvcore allocated all 9 and, on a pool with 8 free, failed where vLLM admits (vLLM's own
    ``test_cached_reservations_admit_like_on_demand_sum[sliding_window]``)."""
    kvm = make_manager(9, 16, sliding(64))  # 8 free blocks and the null block
    req = make_request("R", list(range(150)), 16)
    new = kvm.allocate_slots(
        req, 0, 0, None, num_external_computed_tokens=144, delay_cache_blocks=True
    )
    assert new is not None
    (table,) = kvm.get_block_ids("R")
    assert table[:5] == [0] * 5 and 0 not in table[5:] and len(table) == 9
    assert kvm.block_pool.get_num_free_blocks() == 4
