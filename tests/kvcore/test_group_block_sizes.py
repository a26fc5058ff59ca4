"""KV cache groups of different block sizes (vLLM 0.34: a layer kind with a smaller page gets a
proportionally larger block). The scheduler's block is the least common multiple of the groups'
sizes, hashes are made every greatest common divisor, and a hit lands on the scheduler's block:
a prompt shorter than it plus one token hits nothing. bench/hybrid_vs_vllm.py compares these
configurations with vLLM 0.34.0 step by step."""

import pytest

from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.kv_cache_utils import resolve_kv_cache_block_sizes
from kvcore.kv_cache_interface import KVCacheConfig, full_attention, mamba, sliding_window
from support.kv import admit, make_request


def manager(groups, num_blocks=40, retention=0, hash_block_size=None):
    config = KVCacheConfig(num_blocks, groups, retention)
    return KVCacheManager(config, hash_block_size=hash_block_size)


def test_scheduler_block_is_the_lcm_and_hashes_the_gcd():
    groups = (full_attention(4), sliding_window(6, 12))
    assert resolve_kv_cache_block_sizes(groups, None, True) == (12, 2)
    assert resolve_kv_cache_block_sizes(groups, None, False) == (12, 12)  # nothing hashed
    assert resolve_kv_cache_block_sizes(groups, 1, True) == (12, 1)
    with pytest.raises(ValueError, match="divisible"):
        resolve_kv_cache_block_sizes(groups, 4, True)  # 6 is not a multiple of 4
    # a Mamba group outside align mode: hashes fall back to the scheduler's block
    assert resolve_kv_cache_block_sizes((full_attention(4), mamba(8, "none")), None, True) == (
        8,
        8,
    )
    kvm = manager(groups)
    assert kvm.block_size == kvm.scheduler_block_size == 12
    assert kvm.coordinator.group_block_sizes == (4, 6)
    assert kvm.hash_block_size == 2


def test_retention_interval_is_a_multiple_of_the_scheduler_block():
    groups = (full_attention(4), sliding_window(8, 8))
    KVCacheConfig(10, groups, 16)
    with pytest.raises(ValueError, match="scheduler_block_size"):
        KVCacheConfig(10, groups, 4)


def test_each_group_allocates_at_its_own_block_size():
    kvm = manager((full_attention(4), sliding_window(8, 32)))
    a = make_request("a", range(20), kvm.hash_block_size)
    admit(kvm, a)
    full, sliding = kvm.get_block_ids("a")
    assert (len(full), len(sliding)) == (5, 3)  # ceil(20 / 4), ceil(20 / 8)


@pytest.mark.parametrize(
    "prompt_len, hit",
    [(8, 0), (9, 8), (16, 8), (17, 16), (20, 16)],
)
def test_a_hit_lands_on_the_scheduler_block(prompt_len, hit):
    """Full attention at 4 tokens, a sliding window at 8: a resend hits what A cached, cut to
    a multiple of 8 below its prompt length (its last token is computed again)."""
    kvm = manager((full_attention(4), sliding_window(8, 32)), retention=None)
    prompt = list(range(prompt_len))
    a = make_request("a", prompt, kvm.hash_block_size)
    admit(kvm, a)
    kvm.free(a)
    b = make_request("b", prompt, kvm.hash_block_size)
    _, hits, num_hit = admit(kvm, b)
    assert num_hit == hit
    assert [len(g) for g in hits.blocks] == [hit // 4, hit // 8]


def test_one_size_for_both_groups_brings_short_prompts_back():
    """The same 8-token resend hits 4 tokens once the sliding group's block is 4 too."""
    kvm = manager((full_attention(4), sliding_window(4, 32)), retention=None)
    prompt = list(range(8))
    a = make_request("a", prompt, 4)
    admit(kvm, a)
    kvm.free(a)
    _, _, num_hit = admit(kvm, make_request("b", prompt, 4))
    assert num_hit == 4


def test_the_lab_engine_runs_groups_of_different_block_sizes_on_the_model():
    """engine.sliding_block_multiple on the tiny model (full and sliding layers): the same
    tokens come out whatever the layout, and B, continuing A's 24-token prompt, hits nothing
    at a 32-token scheduler block (8 x 4) but 16 tokens at 16 (block_size 4). The engine's
    invariants hold at every step (debug), and the snapshot draws each group's blocks at its
    own size."""
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.run.scenario import load_scenario

    def run(block_size, multiple):
        layers = ["full_attention", "sliding_attention"] * 2
        eng = Engine(
            load_scenario(
                {
                    "name": "sizes",
                    "model": "tiny-random",
                    "engine": {
                        "block_size": block_size,
                        "sliding_block_multiple": multiple,
                        "sliding_window": 8,
                        "layer_types": layers,
                        "prefix_cache_retention_interval": None,
                    },
                    "requests": [
                        {"id": "A", "prompt_token_ids": list(range(1, 25)), "max_tokens": 3},
                        {
                            "id": "B",
                            "prompt_token_ids": list(range(1, 25)) + [40, 41],
                            "max_tokens": 3,
                            "arrival_step": 6,
                        },
                    ],
                }
            ),
            debug=True,
        )
        records = list(eng.run())
        for rec in records:  # each block holds at most its own group's block size of tokens
            held = {b.block_id: len(b.token_ids) for b in rec.snapshot.blocks}
            for r in rec.snapshot.requests:
                for table, size in zip(
                    r.block_tables, eng.kv_cache_manager.coordinator.group_block_sizes
                ):
                    assert all(held[b] <= size for b in table)
        hits = {
            e.request_id: e.num_tokens for r in records for e in r.events if e.kind == "cache_hit"
        }
        snap = records[-1].snapshot
        outputs = [snap.request(r).output_token_ids for r in ("A", "B")]
        return eng.kv_cache_manager.coordinator.group_block_sizes, hits, outputs

    sizes, hits, outputs = run(8, 4)
    assert sizes == (8, 32) and hits == {}
    fixed_sizes, fixed_hits, fixed_outputs = run(4, 4)
    assert fixed_sizes == (4, 16) and fixed_hits == {"B": 16}
    assert outputs == fixed_outputs == run(8, 1)[2]


@pytest.mark.parametrize(
    "engine",
    [
        {"sliding_window": 8},  # every layer slides: one group, no ratio
        {"layer_types": ["full_attention"] * 4},
        {
            "sliding_window": 8,
            "layer_types": ["full_attention", "sliding_attention"] * 2,
            "disable_hybrid_kv_cache_manager": True,
        },
    ],
)
def test_a_sliding_block_multiple_needs_full_and_sliding_groups(engine):
    from paged_kv_lab.run.engine import EngineRefused, kv_cache_groups
    from paged_kv_lab.run.scenario import EngineSettings

    s = EngineSettings(sliding_block_multiple=2, **engine)
    with pytest.raises(EngineRefused):
        kv_cache_groups(s, 4, bool(engine.get("disable_hybrid_kv_cache_manager")))
    groups, _ = kv_cache_groups(
        EngineSettings(
            block_size=16,
            sliding_block_multiple=2,
            sliding_window=8,
            layer_types=("full_attention", "sliding_attention") * 2,
        ),
        4,
    )
    assert [g.kv_cache_spec.block_size for g in groups] == [16, 32]
