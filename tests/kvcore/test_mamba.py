"""Mamba (linear-attention) groups beside full attention: MambaSpec, MambaManager in "align" and
"none" mode, the scheduler's chunk alignment. The same behaviour is compared step by step with
vLLM 0.33.0's own classes in tests/differential/test_hybrid_vs_vllm.py (skips without the vLLM
venv)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.sched.scheduler import mamba_block_aligned_split
from kvcore.distributed.kv_events import BlockStored
from kvcore.kv_cache_interface import KVCacheConfig, MambaSpec, full_attention, mamba
from support.kv import admit, make_request, queue_ids
from support.paths import FIXTURES

BS = 4


def manager(
    num_blocks=30, mode="align", retention=0, spec_blocks=0, caching=True, bs=BS, unit=None
):
    groups = (full_attention(bs), mamba(bs, mode, num_speculative_blocks=spec_blocks))
    config = KVCacheConfig(num_blocks, groups, retention)
    return KVCacheManager(
        config, enable_caching=caching, enable_kv_cache_events=True, hash_block_size=unit
    )


def step(kvm, req, n):
    """One scheduled chunk of a running request, as the scheduler gives it."""
    kvm.new_step_starts()
    assert kvm.allocate_slots(req, n) is not None
    req.num_computed_tokens += n


def split(req, n, hit=0, kvm=None):
    if kvm is None:
        return mamba_block_aligned_split(req, n, hit, block_size=BS, max_prefill_tokens=64)
    return mamba_block_aligned_split(
        req,
        n,
        hit,
        block_size=kvm.block_size,
        max_prefill_tokens=64,
        hash_block_size=kvm.hash_block_size,
        partial_cache_hit=kvm.coordinator.enable_partial_hash_hits,
    )


def prefill(kvm, req, chunk=64):
    """Admit and prefill the request in chunks cut as the scheduler cuts them in align mode.
    -> (hit blocks, hit tokens)."""
    kvm.new_step_starts()
    hits, num_hit, req.shared_prefix_boundary = kvm.get_computed_blocks(req)
    n = split(req, min(chunk, req.num_tokens - num_hit), num_hit, kvm)
    assert kvm.allocate_slots(req, n, num_hit, hits) is not None
    req.num_computed_tokens = num_hit + n
    while req.num_computed_tokens < req.num_tokens:
        step(kvm, req, split(req, min(chunk, req.num_tokens - req.num_computed_tokens), 0, kvm))
    return hits, num_hit


def test_spec_page_size_and_validation():
    spec = MambaSpec(16, shapes=((4, 8), (2, 3)), dtypes=("float32", "bfloat16"))
    assert spec.page_size_bytes == spec.real_page_size_bytes == 4 * 8 * 4 + 2 * 3 * 2
    padded = MambaSpec(16, shapes=((4,),), dtypes=("float32",), page_size_padded=64)
    assert padded.page_size_bytes == 64
    with pytest.raises(ValueError, match="mamba_cache_mode"):
        MambaSpec(16, mamba_cache_mode="all")
    with pytest.raises(ValueError, match="one dtype per"):
        MambaSpec(16, shapes=((1,),))
    with pytest.raises(ValueError, match="requires mamba_cache_mode='align'"):
        manager(mode="none", caching=True)


def test_align_mode_keeps_one_state_per_boundary_and_frees_the_ones_behind():
    kvm = manager(retention=None)
    a = make_request("a", list(range(13)), BS)
    prefill(kvm, a, chunk=4)
    full, state = kvm.get_block_ids("a")
    assert len(full) == 4
    # slot i = the state after (i + 1) * 4 tokens; held: the state at 12 tokens (this step
    # reads it) and the one being written; those at 4 and 8 went back to the free queue
    assert state[:2] == [0, 0] and state[2] and state[3]
    pool = kvm.block_pool
    freed = [b for b in pool.blocks if b.block_hash is not None and b.ref_cnt == 0]
    assert len(freed) == 2 and all(b.block_id in queue_ids(pool) for b in freed)
    a.append_output_token_ids([7])
    step(kvm, a, 1)  # the next step no longer needs the state at 12 tokens
    assert kvm.get_block_ids("a")[1][:3] == [0, 0, 0]


def test_resend_hits_the_last_state_both_groups_agree_on():
    kvm = manager(retention=None)
    prompt = list(range(13))
    a = make_request("a", prompt, BS)
    prefill(kvm, a)
    b = make_request("b", prompt, BS)
    hits, num_hit = prefill(kvm, b)
    assert num_hit == 12
    full_hit, state_hit = hits.get_block_ids()
    assert full_hit == kvm.get_block_ids("a")[0][:3]
    # the Mamba hit is one state, padded in front with the null block
    assert state_hit[:2] == [0, 0] and state_hit[2] != 0


def test_a_state_cached_this_step_is_no_hit_until_the_next_step():
    kvm = manager(retention=None)
    prompt = list(range(9))
    a = make_request("a", prompt, BS)
    kvm.new_step_starts()
    assert kvm.allocate_slots(a, 8) is not None  # the prefill's first chunk: 8 tokens
    a.num_computed_tokens = 8
    b = make_request("b", prompt, BS)
    hits, num_hit, _ = kvm.get_computed_blocks(b)
    assert num_hit == 8
    # the state's bytes are written by this step's forward pass: b must wait a step
    assert kvm.allocate_slots(b, 1, num_hit, hits) is None
    kvm.new_step_starts()
    assert kvm.allocate_slots(b, 1, num_hit, hits) is not None


def test_sparse_retention_keeps_only_the_states_a_later_request_can_reach():
    kvm = manager(retention=0)
    a = make_request("a", list(range(13)), BS)
    prefill(kvm, a, chunk=4)
    hashed = [b.block_hash_num_tokens for b in kvm.block_pool.blocks if b.block_hash]
    # full attention hashes every full block (4, 8, 12); of the states only the one at 12
    # tokens is kept, where a resend stops (its last token is recomputed)
    assert sorted(hashed) == [4, 8, 12, 12]


def test_events_carry_the_group_and_its_kind():
    kvm = manager(retention=None)
    prefill(kvm, make_request("a", list(range(9)), BS))
    stored = [e for e in kvm.take_events() if isinstance(e, BlockStored)]
    assert {(e.group_idx, e.kv_cache_spec_kind) for e in stored} == {
        (0, "full_attention"),
        (1, "mamba"),
    }


def test_none_mode_keeps_one_running_state_and_caches_nothing():
    kvm = manager(mode="none", caching=False, spec_blocks=1)
    a = make_request("a", list(range(10)), BS, caching=False)
    admit(kvm, a)
    full, state = kvm.get_block_ids("a")
    assert len(full) == 3 and len(state) == 4  # sized like a table, + 1 speculative block
    assert all(b.block_hash is None for b in kvm.block_pool.blocks)


@pytest.mark.parametrize(
    "computed,prompt,n,hit,junction,want",
    [
        (0, 13, 10, 0, 0, 8),  # a chunk inside the prefill ends on a boundary
        (0, 13, 13, 0, 0, 12),  # ... and stops at the last boundary a resend can hit
        (12, 13, 1, 0, 0, 1),  # the prompt's last chunk is exempt
        (0, 13, 10, 0, 6, 4),  # a shared-prefix junction, floored to a boundary
        (0, 13, 3, 0, 0, 3),  # a block wider than a chunk is crossed in sub-block chunks
        (2, 13, 9, 0, 0, 2),  # a chunk starting mid-block stops at the next boundary
        (0, 13, 6, 4, 0, 4),  # the hit counts as computed
    ],
)
def test_chunks_are_cut_at_state_boundaries(computed, prompt, n, hit, junction, want):
    r = make_request("r", list(range(prompt)), BS)
    r.num_computed_tokens = computed
    r.shared_prefix_boundary = junction
    max_prefill = 2 if n == 3 else 64
    got = mamba_block_aligned_split(r, n, hit, block_size=BS, max_prefill_tokens=max_prefill)
    assert got == want


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 9), st.integers(0, 3)), min_size=1, max_size=6
    ),
    st.integers(0, 1),
)
def test_align_tables_hold_few_states_and_the_pool_balances(reqs, spec_blocks):
    kvm = manager(num_blocks=60, spec_blocks=spec_blocks, retention=None)
    stems = [list(range(7)), list(range(100, 111)), list(range(5))]
    running = []
    for i, (stem, extra, chunk_extra) in enumerate(reqs):
        r = make_request(f"r{i}", stems[stem] + list(range(200, 200 + extra)), BS)
        kvm.new_step_starts()
        hits, num_hit, r.shared_prefix_boundary = kvm.get_computed_blocks(r)
        n = split(r, min(4 + chunk_extra, r.num_tokens - num_hit), num_hit)
        if n and kvm.allocate_slots(r, n, num_hit, hits) is not None:
            r.num_computed_tokens = num_hit + n
            running.append(r)
        for r in running:
            left = r.num_tokens - r.num_computed_tokens
            if left > 0:
                step(kvm, r, split(r, left))
    pool = kvm.block_pool
    for r in running:
        state = kvm.get_block_ids(r.request_id)[1]
        # the state it resumes from, the one it writes, its speculative blocks
        assert sum(1 for b in state if b) <= 2 + spec_blocks
    held = {b.block_id for b in pool.blocks if b.ref_cnt > 0 and not b.is_null}
    assert len(held) + len(queue_ids(pool)) == pool.num_gpu_blocks - 1
    for r in running:
        kvm.free(r)
    assert len(queue_ids(pool)) == pool.num_gpu_blocks - 1


def test_prefix_match_unit_turns_a_miss_inside_a_block_into_a_hit_with_copy_on_write():
    prompt = list(range(13))  # a resend stops at 12 tokens: inside the second 8-token block
    plain = manager(bs=8)
    prefill(plain, make_request("a", prompt, 8))
    assert prefill(plain, make_request("b", prompt, 8))[1] == 8  # only whole blocks

    kvm = manager(bs=8, unit=2)
    a = make_request("a", prompt, 2)  # hashes every prefix_match_unit = 2 tokens
    prefill(kvm, a)
    kvm.take_kv_cache_block_copies()
    b = make_request("b", prompt, 2)
    hits, num_hit = prefill(kvm, b)
    assert num_hit == 12
    full_hit, state_hit = hits.get_block_ids()
    a_full, _ = kvm.get_block_ids("a")
    assert full_hit == a_full[:2] and state_hit[0] == 0
    # b writes into the shared tail block from token 12 on: it gets private copies, one in
    # each group, and the copies' source blocks stay cached for the next request
    copies, retained = kvm.take_kv_cache_block_copies()
    assert [src for src, _ in copies] == [full_hit[1], state_hit[1]]
    b_full, b_state = kvm.get_block_ids("b")
    assert b_full[1] == copies[0][1] and b_full[0] == full_hit[0]
    kvm.block_pool.free_blocks(retained)


def test_prefix_match_unit_needs_a_second_group():
    config = KVCacheConfig(10, (full_attention(8),))
    with pytest.raises(ValueError, match="single KV cache group"):
        KVCacheManager(config, hash_block_size=2)


# -- scenario settings and the replay ------------------------------------------------------------
QWEN35_LIKE = ["linear_attention"] * 3 + ["full_attention"]


def test_three_linear_per_full_layer_makes_vllms_four_groups():
    from paged_kv_lab.run.engine import kv_cache_groups
    from paged_kv_lab.run.scenario import load_scenario

    s = load_scenario({"engine": {"block_size": 4, "layer_types": QWEN35_LIKE * 2}}).engine
    groups, layer_group = kv_cache_groups(s, 8)
    assert [g.kind for g in groups] == ["mamba", "mamba", "mamba", "full"]
    assert [g.layer_names for g in groups][0] == ("layers.0", "layers.4")
    assert layer_group == [0, 1, 2, 3, 0, 1, 2, 3]
    assert groups[0].kv_cache_spec.mamba_cache_mode == "align"  # resolved: caching is on


@pytest.mark.parametrize(
    "engine,fragment",
    [
        ({"block_size": 8, "prefix_match_unit": 3, "layer_types": QWEN35_LIKE}, "must divide"),
        ({"block_size": 8, "prefix_match_unit": 2}, "one kind of layer"),
        ({"layer_types": QWEN35_LIKE, "enable_prefix_caching": False}, "not modelled yet"),
    ],
)
def test_scenario_checks_the_hybrid_settings(engine, fragment):
    from paged_kv_lab.run.scenario import ScenarioError, load_scenario

    with pytest.raises(ScenarioError, match=fragment):
        load_scenario({"engine": engine})


def test_a_trace_replays_as_a_hybrid_model_would_cache_it():

    from paged_kv_lab.workloads.replay import replay, replay_settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    trace = load_trace(FIXTURES / "traces" / "mooncake_slice.jsonl")
    rates = {}
    for name, extra in (
        ("full", {}),
        ("hybrid", {"layer_types": QWEN35_LIKE}),
        ("hybrid+unit", {"layer_types": QWEN35_LIKE, "prefix_match_unit": 64}),
    ):
        settings = replay_settings(trace, {"block_size": 512, "num_gpu_blocks": 4000, **extra})
        rates[name] = replay(trace, settings).hit_tokens
    # a state is kept only where a later request can stop: fewer hits than full attention
    assert 0 < rates["hybrid"] < rates["full"] and rates["hybrid+unit"] > 0


def test_the_attention_block_grows_until_its_page_holds_a_state():
    from kvcore.platforms.interface import align_hybrid_block_size

    # Qwen3-Next's shapes, bf16, one GPU: a gated delta-net layer's state is its convolution
    # window (8192 channels x 3) plus its recurrent state (32 heads x 128 x 128)
    state = MambaSpec(1, shapes=((8192, 3), (32, 128, 128)), dtypes=("bfloat16", "bfloat16"))
    assert state.page_size_bytes == 1_097_728
    attn_per_token = 2 * 2 * 256 * 2  # K and V, 2 KV heads of 256, 2 bytes
    block_size, padded = align_hybrid_block_size(16, attn_per_token, state.page_size_bytes)
    assert block_size == 544  # 34 x 16 tokens: the first page >= the state
    assert padded == 544 * attn_per_token  # the state's page padded to the attention page
    assert align_hybrid_block_size(1024, attn_per_token, state.page_size_bytes)[0] == 1024


def test_a_recorded_run_steps_a_hybrid_layout_with_hashes_finer_than_the_block():
    from support.kv import make_engine, spec

    layers = tuple(QWEN35_LIKE)
    reqs = [spec("a", range(13), max_tokens=3), spec("b", range(13), max_tokens=3, arrival_step=6)]
    eng = make_engine(reqs, block_size=4, num_gpu_blocks=40, layer_types=layers)
    hits = [
        (e.request_id, e.num_tokens)
        for _ in range(20)
        for e in eng.step().events
        if e.kind == "cache_hit"
    ]
    assert hits == [("b", 12)]  # the state at 12 tokens and the attention blocks before it
    # 8-token blocks hashed every 2 tokens: b hits 12 tokens, inside a's second block, and
    # copies that block in every group (copy-on-write); the invariants hold at every step
    eng = make_engine(
        reqs, block_size=8, num_gpu_blocks=40, layer_types=layers, prefix_match_unit=2
    )
    eng.debug = True
    evs = [e for r in eng.run() for e in r.events if e.request_id == "b"]
    assert [(e.kind, e.num_tokens) for e in evs if e.kind == "cache_hit"] == [("cache_hit", 12)]
    copies = [e for e in evs if e.kind == "copied" and e.reason == "partial_hit"]
    assert len(copies) == len(eng.groups)


def test_block_sizes_resolve_as_vllm_resolves_them():
    from kvcore.core.kv_cache_utils import resolve_kv_cache_block_sizes

    hybrid, none_mode = (full_attention(8), mamba(8)), (full_attention(8), mamba(8, "none"))
    assert resolve_kv_cache_block_sizes(hybrid, 2, True) == (8, 2)
    assert resolve_kv_cache_block_sizes(hybrid, None, True) == (8, 8)
    assert resolve_kv_cache_block_sizes(hybrid, 2, False) == (8, 8)  # nothing is hashed
    assert resolve_kv_cache_block_sizes(none_mode, 2, True) == (8, 8)  # no state to hit
    assert resolve_kv_cache_block_sizes((full_attention(8),), 2, False) == (8, 8)
    with pytest.raises(ValueError, match="divisible"):
        resolve_kv_cache_block_sizes(hybrid, 3, True)
