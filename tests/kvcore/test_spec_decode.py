"""Speculative decoding (n-gram proposer, greedy verification): the proposer's matching rule,
greedy acceptance, the scheduler's bookkeeping (drafts scheduled, num_computed_tokens moved
back, drafts never cached), and token-for-token equality with decoding without drafts and
with transformers' generate — the tiny model always, SmolLM2 in the slow set."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvcore.spec_decode.metrics import SpecDecodingStats
from kvcore.utils.math_utils import cdiv
from kvcore.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator
from kvcore.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample
from paged_kv_lab.recording import events
from paged_kv_lab.run.engine import Engine, NoModelRunner
from paged_kv_lab.run.scenario import (
    EngineSettings,
    RequestSpec,
    Scenario,
    ScenarioError,
    SpeculativeConfig,
    load_scenario,
)
from support.kv import events_of, make_engine, spec
from support.models import eos_of, reference_tokens

SPEC = SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
REP = [17, 254, 1033, 88, 4012, 7, 391]  # repeated: the proposer finds it again


# -- the proposer and the acceptance rule ---------------------------------------------------
def test_proposer_takes_the_longest_ngram_and_its_last_occurrence():
    """vLLM 0.34.0 (worker/gpu/spec_decode/ngram/speculator.py): the scan scores a match as
    ``n * (max_model_len + 1) + pos + 1`` and keeps the maximum (lines 82-86), so the longest n
    wins and, among its occurrences, the one starting last; 0.33.0's KMP search
    (v1/spec_decode/ngram_proposer.py) kept the first."""
    p = NgramGPUSpeculator(min_n=2, max_n=3, k=4, max_model_len=100)
    # 1-grams are too short here; [9, 5] occurs twice before the end: the later one is used
    assert p.find_match([9, 5, 6, 9, 5, 7, 9, 5]) == (2, 3)
    assert p.propose([9, 5, 6, 9, 5, 7, 9, 5]) == [7, 9, 5, 5]  # 0.33: [6, 9, 5, 7]
    # a 3-gram match beats a later 2-gram one
    assert p.find_match([7, 8, 1, 0, 8, 1, 2, 7, 8, 1]) == (3, 0)
    assert p.propose([7, 8, 1, 0, 8, 1, 2, 7, 8, 1]) == [0, 8, 1, 2]
    # an earlier occurrence may overlap the suffix: [4, 4] at 1 ends one token before the end
    assert NgramGPUSpeculator(2, 2, 2, 100).propose([4, 4, 4, 4]) == [4, 4]
    assert NgramGPUSpeculator(1, 1, 3, 100).find_match([6, 4, 6, 4]) == (1, 1)


def test_proposer_fills_every_draft_slot_with_the_last_sampled_token():
    """vLLM 0.34.0's finalize kernel writes all num_speculative_tokens slots for every request:
    slots past the matched continuation, and every slot when nothing matches or the request has
    fewer than prompt_lookup_min tokens, get the last sampled token (speculator.py lines
    132-148); 0.33.0 returned fewer drafts, or none."""
    p = NgramGPUSpeculator(min_n=2, max_n=3, k=4, max_model_len=100)
    assert p.propose([1, 2, 3, 4, 2, 3]) == [4, 2, 3, 3]  # 0.33: [4, 2, 3]
    assert p.propose([1, 2, 3]) == [3, 3, 3, 3]  # no match; 0.33: []
    assert p.propose([5]) == [5, 5, 5, 5]  # shorter than min_n; 0.33: []
    assert NgramGPUSpeculator(1, 1, 3, 100).propose([4, 4]) == [4, 4, 4]  # one token followed it
    with pytest.raises(ValueError):
        p.propose([])


def test_drafts_stop_where_the_scheduler_would_cut_them():
    """0.34.0's proposer drafts k tokens whatever max_model_len is, and its scheduler schedules
    no token at or past max_model_len; kvcore's list stops there (as 0.33.0's did), so the same
    tokens run, and a huge k builds no huge list."""
    toks = [1, 2, 3, 1, 2, 3, 1, 2]
    assert NgramGPUSpeculator(1, 2, k=5, max_model_len=20).propose(toks) == [3, 1, 2, 2, 2]
    assert NgramGPUSpeculator(1, 2, k=5, max_model_len=10).propose(toks) == [3, 1]
    assert NgramGPUSpeculator(1, 2, k=5, max_model_len=8).propose(toks) == []
    assert NgramGPUSpeculator(1, 1, k=2**62, max_model_len=12).propose([7, 5]) == [5] * 10
    eng = make_engine(
        [spec("S", toks, max_tokens=50)],
        runner=NoModelRunner(vocab_size=5),
        max_model_len=12,
        speculative=SpeculativeConfig(
            num_speculative_tokens=5, prompt_lookup_min=1, prompt_lookup_max=2
        ),
    )
    recs = eng.run()
    for prev, rec in zip(recs, recs[1:]):
        for ev in events_of(prev, events.DRAFT_PROPOSED, "S"):
            assert len(ev.draft_token_ids) == min(5, 12 - ev.num_tokens)
            # the last token and the drafts, none at or past position 12 (vLLM's cut)
            assert rec.scheduled["S"] == min(1 + 5, 12 - ev.num_tokens)
    assert len(eng.outputs()["S"]["token_ids"]) == 12 - len(toks)


def test_a_huge_k_and_max_model_len_draft_only_what_a_step_can_schedule():
    """The lab builds the proposer with k cut to max_num_batched_tokens (a step never schedules
    more), so a scenario's k and max_model_len at their limits run, with the same tokens."""
    big = 2**62

    def run(k, max_model_len):
        eng = make_engine(
            [spec("S", [1, 2, 1, 2], max_tokens=6)],
            runner=NoModelRunner(vocab_size=5),
            max_model_len=max_model_len,
            max_num_batched_tokens=8,
            speculative=SpeculativeConfig(
                num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=2
            ),
        )
        recs = eng.run()
        assert all(n <= 8 for r in recs for n in r.scheduled.values())
        return eng.outputs()["S"]["token_ids"]

    assert run(big, big) == run(3, 100)


@pytest.mark.parametrize(
    "bad", [dict(min_n=0, max_n=2, k=1), dict(min_n=3, max_n=2, k=1), dict(min_n=1, max_n=2, k=0)]
)
def test_proposer_refuses_bad_settings(bad):
    with pytest.raises(ValueError):
        NgramGPUSpeculator(max_model_len=100, **bad)


def test_greedy_acceptance_is_the_longest_matching_prefix_plus_one_token():
    assert rejection_sample([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]  # all held: bonus token
    assert rejection_sample([5, 6, 7], [5, 9, 7, 8]) == [5, 9]  # second draft wrong
    assert rejection_sample([5, 6, 7], [1, 6, 7, 8]) == [1]  # first draft wrong
    assert rejection_sample([], [3]) == [3]
    with pytest.raises(ValueError):
        rejection_sample([1, 2], [1, 2])
    s = SpecDecodingStats().observe(3, 3).observe(3, 0)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 6, 3)
    assert s.acceptance_rate == 0.5 and s.mean_acceptance_length == 2.5


def test_the_setting_is_off_by_default_and_validated():
    assert EngineSettings().speculative is None
    sc = load_scenario(
        {"engine": {"speculative": {"num_speculative_tokens": 2, "prompt_lookup_max": 3}}}
    )
    assert (sc.engine.speculative.prompt_lookup_min, sc.engine.speculative.prompt_lookup_max) == (
        3,
        3,
    )
    assert load_scenario({"engine": {"speculative": {}}}).engine.speculative.prompt_lookup_min == 5
    for bad in (
        {"method": "medusa"},
        {"num_speculative_tokens": 0},
        {"prompt_lookup_min": 4, "prompt_lookup_max": 2},
        {"k": 3},
    ):
        with pytest.raises(ScenarioError, match="speculative"):
            load_scenario({"engine": {"speculative": bad}})


def test_speculative_decoding_refuses_sampling():
    with pytest.raises(ValueError, match="greedily"):
        make_engine(speculative=SPEC, seed=3)
    eng = make_engine(speculative=SPEC)
    with pytest.raises(ValueError, match="greedily"):
        eng.add_request(spec("A", range(5), seed=1))


# -- the scheduler's bookkeeping (stand-in model: tokens are a function of the position) ------
def cycling_engine(**kw):
    """A 5-token vocabulary: the stand-in model counts down while the prompt counts up, so the
    first drafts (found in the prompt) are rejected and later ones (the model's cycle) accepted."""
    kw.setdefault(
        "speculative",
        SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2),
    )
    return make_engine(
        [spec("S", [0, 1, 2, 3, 4] * 2, max_tokens=14)],
        runner=NoModelRunner(vocab_size=5),
        block_size=4,
        num_gpu_blocks=12,
        **kw,
    )


def test_drafts_are_scheduled_verified_and_rolled_back():
    eng = cycling_engine()
    recs = eng.run()
    base = make_engine(
        [spec("S", [0, 1, 2, 3, 4] * 2, max_tokens=14)],
        runner=NoModelRunner(vocab_size=5),
        block_size=4,
        num_gpu_blocks=12,
    )
    base_recs = base.run()
    assert eng.outputs()["S"]["token_ids"] == base.outputs()["S"]["token_ids"]
    assert len(recs) < len(base_recs)  # accepted drafts saved steps
    for prev, rec in zip(recs, recs[1:]):
        proposed = events_of(prev, events.DRAFT_PROPOSED, "S")
        if not proposed:
            continue
        drafts = proposed[0].draft_token_ids
        assert rec.scheduled["S"] == 1 + len(drafts)  # the last token and every draft
        gained = rec.new_tokens["S"]
        acc = events_of(rec, events.DRAFT_ACCEPTED, "S")
        rej = events_of(rec, events.DRAFT_REJECTED, "S")
        n_acc = len(acc[0].accepted_token_ids) if acc else 0
        assert list(drafts[:n_acc]) == gained[:n_acc] and len(gained) <= n_acc + 1
        if rej:
            r = rej[0]
            assert r.rejected_token_ids == drafts[n_acc:] and r.target_token_id == gained[n_acc]
            # rolled back: everything but the request's newest token is computed
            assert r.num_computed_tokens + 1 == 10 + sum(
                len(x.new_tokens.get("S", ())) for x in recs[: recs.index(rec) + 1]
            )
            assert r.positions == tuple(
                range(r.num_computed_tokens, r.num_computed_tokens + len(drafts) - n_acc)
            )
    kinds = {e.kind for r in recs for e in r.events}
    assert {events.DRAFT_PROPOSED, events.DRAFT_ACCEPTED, events.DRAFT_REJECTED} <= kinds
    assert eng.spec_decoding_stats.num_accepted_tokens > 0
    assert eng.spec_decoding_stats.num_accepted_tokens < eng.spec_decoding_stats.num_draft_tokens


def test_a_draft_never_enters_the_prefix_cache():
    """Schedule drafts that fill a block past the request's real tokens: that block is not
    cached when slots are allocated, only once verification made its tokens real."""
    eng = cycling_engine()
    sched, kvm = eng.scheduler, eng.kv_cache_manager
    manager = kvm.coordinator.single_type_managers[0]
    saw_draft_past_boundary = False
    eng.step()  # the prompt
    while eng.has_unfinished():
        req = sched.requests["S"]
        n_real, drafts = req.num_tokens, list(req.spec_token_ids)
        eng.step()
        if drafts and (n_real + len(drafts)) // 4 > n_real // 4:
            saw_draft_past_boundary = True
        if not req.is_finished():
            assert manager.num_cached_block.get("S", 0) * 4 <= req.num_computed_tokens
    assert saw_draft_past_boundary


def test_allocate_slots_caches_only_up_to_num_tokens():
    eng = cycling_engine()
    sched, kvm = eng.scheduler, eng.kv_cache_manager
    manager = kvm.coordinator.single_type_managers[0]
    eng.step()  # the prompt
    while eng.has_unfinished():
        req = sched.requests["S"]
        if (
            req.spec_token_ids
            and (req.num_tokens_with_spec - 1) // 4 > (req.num_tokens - 1) // 4
            and req.num_tokens % 4
        ):
            n_real = req.num_tokens
            out = sched.schedule()  # allocate_slots for 1 + drafts
            assert out.scheduled_spec_decode_tokens["S"]
            assert len(kvm.get_block_ids("S")[0]) * 4 >= req.num_computed_tokens  # slots for drafts
            # the block holding drafts is not cached
            assert manager.num_cached_block["S"] == n_real // 4
            return
        eng.step()
    pytest.fail("no step scheduled drafts across a block boundary")


def test_preempted_request_drops_its_drafts_and_still_matches():
    specs = [
        spec("A", [0, 1, 2, 3, 4] * 2, max_tokens=12),
        spec("B", [4, 3, 2, 1, 0] * 2, max_tokens=12),
    ]
    sp = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=2)
    eng = make_engine(
        specs, runner=NoModelRunner(vocab_size=5), block_size=4, num_gpu_blocks=9, speculative=sp
    )
    recs = eng.run()
    base = make_engine(specs, runner=NoModelRunner(vocab_size=5), block_size=4, num_gpu_blocks=9)
    base.run()
    assert events_of(recs, events.PREEMPTED)
    assert eng.outputs() == base.outputs()


@pytest.mark.parametrize("prompt_len, padded", [(7, False), (10, True)])
def test_a_lone_request_whose_drafts_overflow_the_pool_is_retried_unless_padded(prompt_len, padded):
    sp = SpeculativeConfig(num_speculative_tokens=5, prompt_lookup_min=1, prompt_lookup_max=2)
    eng = make_engine(
        [spec("R", ([0, 1, 2, 3, 4] * 2)[:prompt_len], max_tokens=6)],
        runner=NoModelRunner(vocab_size=5),
        # its real tokens (at most 16) fit in 4 blocks
        block_size=4,
        num_gpu_blocks=5,
        speculative=sp,
    )
    recs = eng.run()
    assert events_of(recs, events.PREEMPTED, "R")  # 1 + 5 drafts did not fit
    never = [e.reason for e in events_of(recs, events.BLOCKED) if e.reason.startswith("never")]
    out = eng.outputs()["R"]
    if not padded:  # back through the queue, its hit leaves more than one token: it runs on
        assert not never
        assert out["finish_reason"] == "finished_length" and len(out["token_ids"]) == 6
    else:
        # its hit leaves one token, which vLLM pads to 1 + 5 rows: those never fit, and vLLM
        # would keep it waiting for ever; the engine aborts it and says why
        assert never == ["never_fits_padded"] and out["finish_reason"] == "finished_aborted"


@settings(max_examples=30, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4, 8]),
    k=st.integers(1, 5),
    min_n=st.integers(1, 3),
    extra_n=st.integers(0, 2),
    spare_blocks=st.integers(0, 6),
    budget=st.sampled_from([4, 7, 64]),
    num_requests=st.integers(1, 3),
    max_tokens=st.integers(1, 16),
    caching=st.booleans(),
)
# a lone request's padded admission that never fits (found by this test once padding was modelled)
@example(
    block_size=1,
    k=2,
    min_n=1,
    extra_n=0,
    spare_blocks=0,
    budget=4,
    num_requests=1,
    max_tokens=2,
    caching=True,
)
# ... and one whose padded rows exceed the step's token budget (the same)
@example(
    block_size=2,
    k=4,
    min_n=2,
    extra_n=0,
    spare_blocks=4,
    budget=4,
    num_requests=2,
    max_tokens=5,
    caching=True,
)
def test_any_setting_keeps_the_invariants_and_the_output(
    block_size, k, min_n, extra_n, spare_blocks, budget, num_requests, max_tokens, caching
):
    """Drafts, rollbacks, preemption (tight pools) and chunked prefill (small budgets) together: the
    pool's invariants hold after every step (debug=True), every request finishes as without drafts,
    with the same tokens — even when only the drafts overflow the pool. One exception, as vLLM:
    a request left with one token to compute is padded to 1 + k rows, and where those rows can
    never fit the pool (vLLM would keep it waiting: its start-up check refuses a pool this small)
    or a step's token budget (vLLM would keep it waiting too), the engine aborts it as
    ``never_fits_padded`` / ``never_fits_padded_budget``; its tokens until then are the same."""
    prompts = [[0, 1, 2, 3, 4] * 2, [4, 3, 2, 1, 0, 4, 3], [2, 2, 2, 2, 2, 2, 2, 2, 2]][
        :num_requests
    ]
    specs = [spec(f"R{i}", p, max_tokens=max_tokens) for i, p in enumerate(prompts)]
    longest = max(len(p) for p in prompts) + max_tokens
    pool = cdiv(longest, block_size) + 1 + spare_blocks
    common = dict(
        runner_vocab=5,
        block_size=block_size,
        num_gpu_blocks=pool,
        max_num_batched_tokens=budget,
        enable_prefix_caching=caching,
    )
    sp = SpeculativeConfig(
        num_speculative_tokens=k, prompt_lookup_min=min_n, prompt_lookup_max=min_n + extra_n
    )

    def go(speculative):
        kw = dict(common)
        eng = make_engine(
            specs,
            runner=NoModelRunner(vocab_size=kw.pop("runner_vocab")),
            speculative=speculative,
            **kw,
        )
        recs = eng.run(max_steps=2000)
        assert not eng.has_unfinished()
        return eng.outputs(), [e for r in recs for e in events_of(r, events.BLOCKED)]

    (with_drafts, blocked), (plain, _) = go(sp), go(None)
    padded = {e.request_id: e for e in blocked if e.reason.startswith("never_fits_padded")}
    for rid, e in padded.items():
        # its tokens fit the empty pool; its padded rows (one token computed anew + k) do not,
        # or they are more than a step's token budget
        assert cdiv(e.num_tokens, block_size) <= e.usable_blocks
        if e.reason == "never_fits_padded_budget":
            assert 1 + k > budget
        else:
            assert e.reason == "never_fits_padded"
            assert cdiv(e.num_tokens + k, block_size) > e.usable_blocks
        got, want = with_drafts[rid]["token_ids"], plain[rid]["token_ids"]
        assert with_drafts[rid]["finish_reason"] == "finished_aborted"
        assert got == want[: len(got)]
    assert {r: o for r, o in with_drafts.items() if r not in padded} == {
        r: o for r, o in plain.items() if r not in padded
    }


def run(loaded, requests, speculative, **engine):
    sc = Scenario(
        model=loaded.name,
        device="cpu",
        engine=EngineSettings(speculative=speculative, **engine),
        requests=tuple(requests),
    )
    eng = Engine(sc, model=loaded, debug=True)
    recs = eng.run()
    return eng, recs


def req(rid, ids, n=20, **kw):
    kw.setdefault("ignore_eos", True)  # long enough to fill the pool and preempt
    return RequestSpec(id=rid, prompt_token_ids=tuple(ids), max_tokens=n, **kw)


CASES = {
    "alone": ([req("A", REP * 3)], dict(block_size=4)),
    "batched": (
        [
            req("A", REP * 3),
            req("B", REP[:4] * 4 + [5, 6], n=16),
            req("C", [3, 1, 4, 1, 5, 9, 2, 6], n=12),
        ],
        dict(block_size=4),
    ),
    "prefix_hits": (
        [req("A", REP * 3, n=12), req("B", REP * 3 + [9], n=12, arrival_step=4)],
        dict(block_size=4),
    ),
    "preemption": (
        # (with 11 blocks B ends alone and waits for ever, padded as in vLLM: aborted)
        [req("A", REP * 2, n=24), req("B", REP[::-1] * 2, n=24)],
        dict(block_size=4, num_gpu_blocks=12),
    ),
    # B hits all but the last of its 21 tokens beside A's speculative decode: padded to 1 + k
    "padded_admission": (
        [req("A", REP * 3, n=12), req("B", REP * 3, n=12, arrival_step=2)],
        dict(block_size=4),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_output_is_identical_with_and_without_drafts_and_to_generate(loaded, case):
    requests, engine = CASES[case]
    eng, recs = run(loaded, requests, SPEC, **engine)
    base, base_recs = run(loaded, requests, None, **engine)
    kinds = {e.kind for r in recs for e in r.events}
    assert events.DRAFT_PROPOSED in kinds
    for r in requests:
        got = eng.outputs()[r.id]["token_ids"]
        assert got == base.outputs()[r.id]["token_ids"], f"{r.id}: drafts changed the output"
        eos = () if r.ignore_eos else eos_of(loaded)
        assert got == reference_tokens(loaded.model, list(r.prompt_token_ids), r.max_tokens, eos)
    if case == "prefix_hits":
        assert events.CACHE_HIT in kinds
    if case == "preemption":
        assert events.PREEMPTED in kinds
    if case == "padded_admission":
        (padded,) = [
            (r, e)
            for r in recs
            for e in events_of(r, events.SCHEDULED, "B")
            if e.num_placeholder_tokens
        ]
        rec, e = padded
        assert (e.num_tokens, e.num_placeholder_tokens) == (1 + 4, 4)
        # the placeholders get KV slots but never reach the model as token ids
        assert min(rec.model_inputs.input_ids) >= 0
        (rejected,) = events_of(rec, events.DRAFT_REJECTED, "B")
        assert rejected.rejected_token_ids == (-1,) * 4


def test_drafts_are_verified_in_one_packed_forward(tiny_model, one_torch_thread):
    eng, recs = run(tiny_model, [req("A", REP * 3)], SPEC, block_size=4)
    rec = next(r for r in recs if r.scheduled.get("A", 0) > 1 and r.step > 1)
    mi = rec.model_inputs
    n = rec.scheduled["A"]
    assert mi.sample_req_ids == ("A",) * n and len(mi.logits_indices) == n
    assert mi.logits_indices == tuple(range(mi.num_actual_tokens - n, mi.num_actual_tokens))
    assert len(mi.slots_of("A")) == n  # every draft got a KV slot


class CycleRunner(NoModelRunner):
    """A text that repeats with period 3: the token at position q is CYCLE[q % 3], so the n-gram
    proposer drafts it exactly and every draft is accepted."""

    CYCLE = (11, 12, 13)

    def execute(self, items):
        return {
            it.request_id: self.CYCLE[(it.start_pos + len(it.token_ids)) % 3]
            for it in items
            if it.sample
        }

    def execute_verify(self, items):
        out = {}
        for it in items:
            if it.sample:
                end = it.start_pos + len(it.token_ids)
                out[it.request_id] = [
                    self.CYCLE[q % 3] for q in range(end - it.num_draft_tokens, end + 1)
                ]
        return out


def test_a_block_that_accepted_drafts_complete_is_cached_even_when_the_request_finishes_that_step():
    """vLLM 0.33 caches a running request's blocks after its tokens are appended, before a stop
    frees them (update_from_output), so a block filled by accepted drafts in the request's last
    step enters the prefix cache: a later prompt with that prefix hits both blocks, not one."""
    cyc = list(CycleRunner.CYCLE)
    a = spec("A", cyc * 2, max_tokens=5)  # 6 prompt tokens, block size 4
    b = spec("B", (cyc * 3), max_tokens=1, arrival_step=3)  # A's first 9 tokens
    eng = make_engine(
        [a, b],
        runner=CycleRunner(),
        block_size=4,
        num_gpu_blocks=16,
        speculative=SpeculativeConfig(
            num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3
        ),
    )
    recs = eng.run()
    (fin,) = events_of(recs, events.FINISHED, "A")
    assert events_of(recs, events.DRAFT_ACCEPTED, "A"), "the drafts must be accepted for this case"
    step_of_finish = next(r for r in recs if fin in r.events)
    cached = events_of(step_of_finish, events.CACHED, "A")
    assert cached and step_of_finish.events.index(cached[-1]) < step_of_finish.events.index(fin)
    (hit,) = events_of(recs, events.CACHE_HIT, "B")
    assert hit.num_tokens == 8  # two blocks; without the fix, 4
