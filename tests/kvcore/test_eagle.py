"""The EAGLE/MTP block drop (vLLM 0.34.0: ``KVCacheManager(use_eagle=True)``): every prefix-cache
hit gives up its last matched block; on a hybrid model the coordinator's loop makes every group
agree on the shorter hit. And when vLLM turns the drop on (kvcore/config/speculative.py)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.config.speculative import SpeculativeConfig
from kvcore.config.vllm import resolve_num_hash_lookahead_tokens
from kvcore.core.kv_cache_coordinator import replay_boundaries
from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.sched.scheduler import use_eagle_block_drop
from kvcore.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
    full_attention,
    mamba,
)
from support.kv import FULL, admit, hybrid, make_manager, make_request, sliding

BS = 4


def served(kvm, rid, tokens):
    """A request computed whole and finished: its full blocks stay cached."""
    req = make_request(rid, tokens, BS)
    new, _, _ = admit(kvm, req)
    assert new is not None
    kvm.free(req)
    return req


def hit_of(kvm, rid, tokens):
    req = make_request(rid, tokens, BS)
    blocks, num_hit, _ = kvm.get_computed_blocks(req)
    return num_hit, [[b.block_id for b in g] for g in blocks.blocks]


PROMPT = list(range(21))  # 5 full blocks of 4 and one token


@pytest.mark.parametrize("groups", [FULL, sliding(8), hybrid(8)], ids=["full", "sliding", "hybrid"])
def test_a_hit_loses_exactly_its_last_block(groups):
    plain = make_manager(64, BS, groups, retention_interval=None)
    eagle = make_manager(64, BS, groups, retention_interval=None, use_eagle=True)
    for kvm in (plain, eagle):
        served(kvm, "a", PROMPT)
    longer = PROMPT + [99, 98, 97]
    n_plain, _ = hit_of(plain, "b", longer)
    n_eagle, blocks = hit_of(eagle, "b", longer)
    assert n_plain == 20
    assert n_eagle == n_plain - BS
    assert all(len(g) == n_eagle // BS for g in blocks)


def test_the_resend_cap_and_the_drop_stack():
    """A resend of a 20-token prompt stops at 19 tokens, so at 16 (4 blocks); the drop takes
    another block: 12."""
    plain = make_manager(64, BS)
    eagle = make_manager(64, BS, use_eagle=True)
    for kvm in (plain, eagle):
        served(kvm, "a", PROMPT[:20])
    assert hit_of(plain, "b", PROMPT[:20])[0] == 16
    assert hit_of(eagle, "b", PROMPT[:20])[0] == 12


def test_a_one_block_hit_becomes_a_miss():
    eagle = make_manager(64, BS, use_eagle=True)
    served(eagle, "a", PROMPT[:6])  # one full block cached
    assert hit_of(eagle, "b", PROMPT[:6] + [7, 7])[0] == 0


def test_the_sliding_window_needs_one_more_cached_block_in_a_row():
    """Window 8 on blocks of 4: a hit needs cdiv(7, 4) = 2 cached blocks in a row ending at it;
    with the drop, 3 in a row, then the last is given up. With only blocks 2 and 3 of the five
    still cached, the plain hit ends at 16 tokens and the EAGLE hit finds no run of 3: 0."""
    for use_eagle, whole, gapped in ((False, 20, 16), (True, 16, 0)):
        kvm = make_manager(64, BS, sliding(8), retention_interval=None, use_eagle=use_eagle)
        req = make_request("a", PROMPT, BS)
        admit(kvm, req)
        table = kvm.get_blocks(req.request_id).blocks[0]
        kvm.free(req)
        assert hit_of(kvm, "b", PROMPT + [5])[0] == whole
        for i in (0, 1, 4):
            kvm.block_pool._maybe_evict_cached_block(table[i])
        assert hit_of(kvm, "c", PROMPT + [5])[0] == gapped


def test_only_the_flagged_group_drops_but_the_hit_is_agreed():
    """vLLM flags the groups holding the drafter's layers (is_eagle_group); the coordinator's
    loop then cuts the other groups to the flagged group's shorter hit."""
    groups = (
        KVCacheGroupSpec(("full",), FullAttentionSpec(BS), is_eagle_group=True),
        KVCacheGroupSpec(("sliding",), SlidingWindowSpec(BS, 8)),
    )
    kvm = KVCacheManager(KVCacheConfig(64, groups, None), 1 << 30, True, use_eagle=True)
    assert kvm.coordinator.drop_eagle_group_ids == {0}
    managers = kvm.coordinator.single_type_managers
    assert [m.use_eagle for m in managers] == [True, False]
    served(kvm, "a", PROMPT)
    n, blocks = hit_of(kvm, "b", PROMPT + [9])
    assert n == 16 and [len(g) for g in blocks] == [4, 4]


def test_with_no_group_flagged_every_group_drops():
    kvm = make_manager(64, BS, hybrid(8), use_eagle=True)
    assert kvm.coordinator.drop_eagle_group_ids == {0, 1}
    assert make_manager(64, BS, hybrid(8)).coordinator.drop_eagle_group_ids == set()


def test_a_mamba_group_with_the_drop_is_refused():
    config = KVCacheConfig(64, (full_attention(BS), mamba(BS)), 0)
    with pytest.raises(ValueError, match="Mamba"):
        KVCacheManager(config, 1 << 30, True, use_eagle=True)
    KVCacheManager(config, 1 << 30, True)  # without the drop it is modelled
    KVCacheManager(config, 1 << 30, False, use_eagle=True)  # and without prefix caching


def test_replay_boundaries_move_one_block_down():
    assert replay_boundaries(21, 4) == (20,)
    assert replay_boundaries(21, 4, use_eagle=True) == (16,)  # resend and extension agree
    assert replay_boundaries(20, 4, use_eagle=True) == (12, 16)  # a block-aligned prompt
    assert replay_boundaries(3, 4, use_eagle=True) == (0,)


def test_sparse_retention_keeps_the_window_an_eagle_hit_needs():
    """Retention 0 keeps only the tails a later request can stop at; with the drop the kept run
    ends one block later (the matched-then-dropped block) and is one block longer. A resend of
    a 21-token prompt then still hits 16 tokens minus the dropped block."""
    plain = make_manager(64, BS, sliding(8), retention_interval=0)
    eagle = make_manager(64, BS, sliding(8), retention_interval=0, use_eagle=True)
    for kvm in (plain, eagle):
        served(kvm, "a", PROMPT)
    assert hit_of(plain, "b", PROMPT)[0] == 20
    assert hit_of(eagle, "b", PROMPT)[0] == 16


# -- the drop is exactly one block, on any trace -------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_on_full_attention_every_hit_is_the_plain_hit_less_one_block(seed):
    """Same cache state, same request: the EAGLE hit is the plain hit minus one block (0 stays
    0). Full attention caches the same blocks with or without the drop, so one trace through
    an EAGLE manager answers both questions at each admission."""
    rng = random.Random(seed)
    kvm = make_manager(rng.randrange(8, 40), BS, use_eagle=True)
    finder = kvm.coordinator.single_type_managers[0]
    stems = [[rng.randrange(30) for _ in range(rng.randrange(2, 30))] for _ in range(3)]
    running = []
    for i in range(12):
        stem = rng.choice(stems)
        tokens = stem[: rng.randrange(1, len(stem) + 1)] + [
            rng.randrange(30) for _ in range(rng.randrange(0, 6))
        ]
        if len(tokens) < 2:
            tokens.append(1)
        req = make_request(f"r{i}", tokens, BS)
        plain_blocks, plain = finder.find_longest_cache_hit(
            req.block_hashes, req.num_tokens - 1, [0]
        )
        new, hits, num_hit = admit(kvm, req)
        assert num_hit == max(plain - BS, 0)
        if num_hit:
            assert [b.block_id for b in hits.blocks[0]] == [
                b.block_id for b in plain_blocks[0][: num_hit // BS]
            ]
        if new is not None:
            running.append(req)
        while len(running) > rng.randrange(1, 3):
            kvm.free(running.pop(rng.randrange(len(running))))


# -- when vLLM drops (vllm/config/speculative.py, vllm/config/vllm.py, the scheduler) -----------
def drop(sp, caching=True, connector=None):
    lookahead = resolve_num_hash_lookahead_tokens(sp, caching, connector)
    return lookahead, use_eagle_block_drop(sp, lookahead)


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_eagle_methods_drop_only_without_lookahead_hashes(method):
    sp = SpeculativeConfig(method, 3)
    assert sp.use_eagle() and sp.needs_eagle_block_drop()
    # vLLM's default: block hashes cover the next token, so nothing is dropped
    assert drop(sp) == (1, False)
    # plain hashes (turned off, or a KV connector that cannot carry lookahead hashes): the drop
    assert drop(SpeculativeConfig(method, 3, disable_lookahead_block_hashes=True)) == (0, True)
    assert drop(sp, connector=False) == (0, True)
    assert drop(sp, connector=True) == (1, False)
    # prefix caching off and no connector: plain hashes, and the manager is told to drop (it
    # never finds a hit to drop from)
    assert drop(sp, caching=False) == (0, True)
    # the experimental switch turns both off
    assert drop(SpeculativeConfig(method, 3, disable_eagle_block_drop=True)) == (0, False)


@pytest.mark.parametrize("method", ["ngram", "draft_model", "dflash", "dspark"])
def test_other_methods_never_drop(method):
    sp = SpeculativeConfig(method, 3, disable_lookahead_block_hashes=True)
    assert not sp.needs_eagle_block_drop()
    assert drop(sp) == (0, False)
    assert drop(None) == (0, False)
