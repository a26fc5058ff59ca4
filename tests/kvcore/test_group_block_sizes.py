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
