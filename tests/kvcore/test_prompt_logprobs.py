"""A request asking for prompt_logprobs skips reading the prefix cache, as in vLLM 0.33: its
``SamplingParams.skip_reading_prefix_cache`` defaults to ``prompt_logprobs is not None``,
``KVCacheManager.prefix_cache_lookup_enabled`` is then false (``get_computed_blocks`` returns no
hit, ``record_prefix_cache_stats`` counts nothing), the scheduler drops a connector's hit and the
CPU tier's ``get_num_new_matched_tokens`` finds none. Writing is untouched: ``allocate_slots``
still caches its full blocks, so a request after it hits them (vLLM's own
``test_prefix_caching.py::test_prefill_plp`` tells the same story on vLLM's manager)."""

from kvcore.request import Request
from paged_kv_lab.run.scenario import CPUOffloadConfig, RequestSpec
from paged_kv_lab.why import explain as X
from paged_kv_lab.why.explain_text import hit_sentences
from paged_kv_lab.why.sentences import sentence
from support.kv import events_of, make_engine, make_manager, make_request, spec

COMMON = list(range(12))  # three full blocks of 4


def plp_request(rid, tokens, block_size):
    hasher = make_request(rid, tokens, block_size)._block_hasher
    return Request(rid, list(tokens), 16, prompt_logprobs=5, block_hasher=hasher)


def test_the_flag_follows_prompt_logprobs_unless_set():
    assert not Request("a", [1, 2], 4).skip_reading_prefix_cache
    assert Request("a", [1, 2], 4, prompt_logprobs=0).skip_reading_prefix_cache
    assert Request("a", [1, 2], 4, prompt_logprobs=-1).skip_reading_prefix_cache
    given = Request("a", [1, 2], 4, prompt_logprobs=3, skip_reading_prefix_cache=False)
    assert not given.skip_reading_prefix_cache


def test_no_hit_is_read_but_its_blocks_are_written_for_others():
    kvm = make_manager(16, 4)
    pool = kvm.block_pool
    a = make_request("a", COMMON + [100], 4)
    hits, n, _ = kvm.get_computed_blocks(a)
    kvm.allocate_slots(a, 13, n, hits)
    kvm.make_prefix_cache_stats()

    b = plp_request("b", COMMON + [200], 4)
    assert kvm.prefix_cache_lookup_enabled(a) and not kvm.prefix_cache_lookup_enabled(b)
    hits, n, _ = kvm.get_computed_blocks(b)
    assert n == 0 and not any(hits.blocks)
    kvm.record_prefix_cache_stats(b, n)
    assert kvm.make_prefix_cache_stats().requests == 0  # the skipped lookup is not counted
    new = kvm.allocate_slots(b, 13, n, hits)
    b_ids = new.get_block_ids()[0]
    a_ids = kvm.get_block_ids("a")[0]
    assert not set(b_ids) & set(a_ids)  # a copy of a's blocks, computed again
    # its full blocks carry the same hashes as a's: cached twice
    assert [pool.blocks[i].block_hash for i in b_ids[:3]] == [
        pool.blocks[i].block_hash for i in a_ids[:3]
    ]
    kvm.free(a)
    kvm.free(b)
    c = make_request("c", COMMON + [300], 4)
    hits, n, _ = kvm.get_computed_blocks(c)
    assert n == 12


def test_the_engine_computes_it_again_and_the_next_request_hits():
    eng = make_engine(
        [
            spec("B", COMMON + [100], max_tokens=2, prompt_logprobs=1),
            spec("A", COMMON + [100], max_tokens=2, arrival_step=3),
            spec("C", COMMON + [100], max_tokens=2, arrival_step=6, prompt_logprobs=0),
        ],
        block_size=4,
        num_gpu_blocks=8,
    )
    initial = eng.snapshot()
    recs = eng.run()
    for rid in ("B", "C"):
        (miss,) = events_of(recs, "cache_miss", rid)
        assert miss.skip_reading_prefix_cache and miss.num_full_blocks == 0
        assert not events_of(recs, "cache_hit", rid)
    admitted = {e.request_id: e.num_cached_tokens for e in events_of(recs, "admitted")}
    # A hits the three full blocks B computed; C, the same prompt again, reads nothing
    assert admitted == {"B": 0, "A": 12, "C": 0}
    (hit,) = events_of(recs, "cache_hit", "A")
    (b_cached,) = events_of(recs, "cached", "B")
    assert hit.block_ids == b_cached.block_ids
    run = X.RecordedSteps(initial, tuple(recs), eng.settings)
    why = X.explain_hit(run, "C")[0]
    assert why.reason == X.SKIP_READING_PREFIX_CACHE and why.hit_tokens == 0
    assert X.explain_hit(run, "A")[0].reason != X.SKIP_READING_PREFIX_CACHE
    en, zh = hit_sentences(why, "en"), hit_sentences(why, "zh")
    assert "prompt_logprobs" in en[1] and "prompt_logprobs" in zh[1]
    assert any("prefix_cache_lookup_enabled" in line for line in en[2:])
    assert "prompt_logprobs" in sentence(events_of(recs, "cache_miss", "C")[0], "zh")


def test_the_cpu_tier_is_not_read_either():
    def run(**kw):
        # A fills the pool, X evicts A's blocks from the GPU (they stay on the CPU), B is A again
        return make_engine(
            [
                spec("A", range(16), max_tokens=3),
                spec("X", range(100, 116), max_tokens=3, arrival_step=4),
                spec("B", range(16), max_tokens=3, arrival_step=8, **kw),
            ],
            block_size=4,
            num_gpu_blocks=7,
            cpu_offload=CPUOffloadConfig(num_cpu_blocks=12),
        ).run()

    assert events_of(run(), "cpu_hit", "B")  # without the flag the CPU tier has it
    recs = run(prompt_logprobs=2)
    assert not events_of(recs, "cpu_hit", "B") and not events_of(recs, "cpu_load", "B")
    (b,) = events_of(recs, "admitted", "B")
    assert b.num_cached_tokens == 0


def test_the_scenario_field_is_checked():
    import pytest

    from paged_kv_lab.run.scenario import ScenarioError, load_scenario

    base = {"requests": [{"id": "a", "prompt_token_ids": [1, 2]}]}
    for ok in (None, -1, 0, 20):
        base["requests"][0]["prompt_logprobs"] = ok
        assert load_scenario(base).requests[0].prompt_logprobs == ok
    base["requests"][0]["prompt_logprobs"] = -2
    with pytest.raises(ScenarioError, match="prompt_logprobs"):
        load_scenario(base)
    assert RequestSpec("a", prompt_token_ids=(1,)).prompt_logprobs is None
