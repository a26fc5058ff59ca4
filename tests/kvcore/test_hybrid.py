"""Hybrid models: one full-attention group and one sliding-window group over one shared pool."""

import pytest

from kvcore.core.kv_cache_utils import get_block_hash, get_group_id, make_block_hash_with_group_id
from paged_kv_lab.recording import events
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.run.engine import kv_cache_groups
from paged_kv_lab.run.scenario import EngineSettings
from support.kv import (
    admit,
    events_of,
    hybrid,
    make_engine,
    make_manager,
    make_request,
    queue_ids,
    spec,
)

W, BS = 4, 2
PROMPT = list(range(11))  # 5 full blocks + 1 partial per group


def setup(retention=0, n=20, recorder=None):
    kvm = make_manager(n, BS, hybrid(W), retention_interval=retention, recorder=recorder)
    a = make_request("a", PROMPT, BS)
    admit(kvm, a)
    return kvm, a


def test_each_request_has_one_table_per_group_group_0_allocating_first():
    kvm, a = setup()
    assert kvm.get_block_ids("a") == ([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12])
    assert kvm.coordinator.get_num_blocks_to_allocate("x", 11, ((), ()), 0) == 12  # summed


def test_cache_keys_differ_only_by_group_id():
    kvm, a = setup(retention=None)
    pool = kvm.block_pool
    for i in range(5):
        k0, k1 = pool.blocks[1 + i].block_hash, pool.blocks[7 + i].block_hash
        assert get_block_hash(k0) == get_block_hash(k1) == a.block_hashes[i]
        assert (get_group_id(k0), get_group_id(k1)) == (0, 1)


def test_full_groups_cache_densely_sliding_groups_sparsely():
    kvm, a = setup(retention=0)
    pool = kvm.block_pool
    assert [pool.blocks[i].block_hash is not None for i in range(1, 7)] == [True] * 5 + [False]
    assert [pool.blocks[i].block_hash is not None for i in range(7, 13)] == [False] * 3 + [
        True,
        True,
        False,
    ]


@pytest.mark.parametrize("retention", [0, None], ids=["sparse", "dense"])
def test_resend_hits_both_groups(retention):
    kvm, a = setup(retention)
    kvm.free(a)
    b = make_request("b", PROMPT, BS)
    hits, n, _ = kvm.get_computed_blocks(b)
    assert n == 10
    assert hits.get_block_ids() == ([1, 2, 3, 4, 5], [0, 0, 0, 10, 11])


@pytest.mark.parametrize("evict", [[10, 11], [1, 2, 3, 4, 5], [1]])
def test_a_hit_that_holds_in_one_group_only_is_no_hit(evict):
    kvm, a = setup()
    kvm.free(a)
    kvm.evict_blocks(evict)
    b = make_request("b", PROMPT, BS)
    hits, n, _ = kvm.get_computed_blocks(b)
    assert n == 0
    assert hits.get_block_ids() == ([], [])


def test_sliding_group_shortens_the_hit_and_full_attention_is_trimmed_to_it():
    kvm, a = setup(retention=None)
    kvm.free(a)
    kvm.evict_blocks([11])  # the sliding group's block 4 is gone
    b = make_request("b", PROMPT, BS)
    hits, n, _ = kvm.get_computed_blocks(b)
    assert n == 8
    assert hits.get_block_ids() == ([1, 2, 3, 4], [0, 0, 9, 10])


def test_full_attention_shortens_the_hit_and_caps_the_sliding_search():
    kvm, a = setup(retention=None)
    kvm.free(a)
    kvm.evict_blocks([5])  # full group's block 4
    b = make_request("b", PROMPT, BS)
    hits, n, _ = kvm.get_computed_blocks(b)
    assert n == 8
    assert hits.get_block_ids() == ([1, 2, 3, 4], [0, 0, 9, 10])


def test_free_releases_group_0_reversed_then_group_1():
    rec = Recorder()
    kvm, a = setup(recorder=rec)
    rec.drain()
    kvm.free(a)
    freed = [e for e in rec.drain() if e.kind == events.FREED]
    assert [(e.group, e.block_ids) for e in freed] == [
        (0, (6, 5, 4, 3, 2, 1)),
        (1, (12, 11, 10, 9, 8, 7)),
    ]
    # 0.33: unhashed 6, then 12 9 8 7, to the head (each call prepends); hashed to the tail.
    assert queue_ids(kvm.block_pool) == [
        12,
        9,
        8,
        7,
        6,
        13,
        14,
        15,
        16,
        17,
        18,
        19,
        5,
        4,
        3,
        2,
        1,
        11,
        10,
    ]


def test_engine_builds_groups_from_layer_types():
    s = EngineSettings(
        sliding_window=8, layer_types=("sliding_attention", "full_attention", "sliding_attention")
    )
    groups, layer_group = kv_cache_groups(s, 3)
    assert [g.kind for g in groups] == ["full", "sliding"]
    assert groups[1].sliding_window == 8
    assert layer_group == [1, 0, 1]
    with pytest.raises(ValueError, match="lists 3 layers"):
        kv_cache_groups(s, 2)
    groups, _ = kv_cache_groups(EngineSettings(sliding_window=8), 2)
    assert [g.kind for g in groups] == ["sliding"]
    groups, _ = kv_cache_groups(EngineSettings(), 2)
    assert [g.kind for g in groups] == ["full"]


def test_engine_hybrid_resend_hits_in_both_groups():
    eng = make_engine(
        [spec("a", PROMPT, max_tokens=3), spec("b", PROMPT, max_tokens=3, arrival_step=5)],
        block_size=BS,
        num_gpu_blocks=24,
        sliding_window=W,
        layer_types=("full_attention", "sliding_attention"),
    )
    recs = eng.run()
    hit = events_of(recs, events.CACHE_HIT, "b")
    assert len(hit) == 1 and hit[0].num_tokens == 10
    assert hit[0].block_ids_per_group[1][:3] == (0, 0, 0)
    assert eng.snapshot().request("b").num_cached_tokens == 10
    assert eng.kv_cache_manager.block_pool.get_num_free_blocks() == 23


def test_shared_prefix_boundary_keeps_the_sliding_blocks_where_the_groups_disagree():
    """Full + window 4, block 4. A = X (12 tokens) hashes full blocks 0-2 but, sparsely, only
    sliding block 1 (ending at 11). B = X + 8 hits 12 tokens in full attention but 8 in the
    sliding group: its shared_prefix_boundary is 12, so B also keeps sliding block 2.
    C = X + 5 then hits all 12 tokens."""
    X = list(range(100, 112))
    kvm = make_manager(40, 4, hybrid(4))
    a = make_request("a", X, 4)
    admit(kvm, a)
    assert a.shared_prefix_boundary == 0
    kvm.free(a)
    b = make_request("b", X + list(range(200, 208)), 4)
    _, _, n = admit(kvm, b)
    assert n == 8 and b.shared_prefix_boundary == 12
    kvm.free(b)
    c = make_request("c", X + list(range(300, 305)), 4)
    hits, n, boundary = kvm.get_computed_blocks(c)
    assert n == 12 and boundary == 0
    assert len(hits.blocks[0]) == 3 and [blk.is_null for blk in hits.blocks[1]] == [
        True,
        True,
        False,
    ]


def test_engine_shared_prefix_boundary_on_admission_and_on_resumption():
    X = list(range(100, 112))
    hybrid_engine = dict(
        block_size=4, sliding_window=4, layer_types=("full_attention", "sliding_attention")
    )
    eng = make_engine(
        [
            spec("a", X, max_tokens=1),
            spec("b", X + list(range(200, 208)), max_tokens=1, arrival_step=2),
            spec("c", X + list(range(300, 305)), max_tokens=1, arrival_step=4),
        ],
        num_gpu_blocks=40,
        **hybrid_engine,
    )
    eng.run()
    reqs = eng.requests  # finished requests: kept by the recording, not the scheduler
    assert (reqs["b"].num_cached_tokens, reqs["b"].shared_prefix_boundary) == (8, 12)
    assert reqs["c"].num_cached_tokens == 12
    # Resumption: d (8-token prompt) is preempted after 4 outputs. Full attention cached its
    # blocks 0-2, the sliding group only block 0 (ending at num_prompt_tokens - 1). At
    # re-admission the groups agree on 4 tokens, full attention alone reaches 12: the
    # boundary is 12 again, and the resumed d keeps sliding block 2 as well.
    eng = make_engine(
        [
            spec("a", X, max_tokens=1),
            spec("b", X + list(range(200, 208)), max_tokens=6, arrival_step=2),
            spec("d", list(range(500, 508)), max_tokens=6, arrival_step=2),
        ],
        num_gpu_blocks=15,
        **hybrid_engine,
    )
    recs = eng.run()
    assert [e.request_id for r in recs for e in events_of(r, events.RESUMED)] == ["d"]
    d = eng.requests["d"]
    assert (d.num_cached_tokens, d.shared_prefix_boundary) == (4, 12)
    pool = eng.kv_cache_manager.block_pool
    kept = [
        pool.cached_block_hash_to_block.get_one_block(make_block_hash_with_group_id(h, 1))
        is not None
        for h in d.block_hashes[:3]
    ]
    assert kept == [True, False, True]
    assert pool.get_num_free_blocks() == 14
