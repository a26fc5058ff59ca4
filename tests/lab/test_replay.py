"""Replaying production traces (workload/): formats, tokens, arrival rules, results, limits."""

import json
from array import array
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.core.kv_cache_utils import get_request_block_hasher
from kvcore.utils.hashing import sha256
from paged_kv_lab.run.budget import BudgetError, Limits, cli_limits
from paged_kv_lab.run.scenario import ScenarioError
from paged_kv_lab.workloads import SHIPPED_TRACE
from paged_kv_lab.workloads.replay import (
    Replay,
    ReplayError,
    TimeSeries,
    max_hit_tokens,
    replay,
    replay_settings,
    upper_bound_hits,
)
from paged_kv_lab.workloads.tokens import (
    MAX_HASH_ID,
    PLACEHOLDER_TOKEN,
    SharedBlockHasher,
    block_token,
    check_block_size,
    prompt_token_ids,
)
from paged_kv_lab.workloads.trace_formats import TraceError, TraceRequest, load_trace, parse_trace
from paged_kv_lab.workloads.trace_limits import check_trace
from support.paths import FIXTURES

FIXTURES = FIXTURES / "traces"
MOONCAKE = FIXTURES / "mooncake_slice.jsonl"
BAILIAN = FIXTURES / "bailian_synthetic.jsonl"


def lines(*records) -> list[str]:
    return [json.dumps(r) for r in records]


def mooncake(ts, n_in, n_out, ids) -> dict:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": ids}


# -- formats ----------------------------------------------------------------------------------
def test_mooncake_slice_reads_in_file_order():
    trace = load_trace(MOONCAKE)
    assert (trace.format, trace.block_size, len(trace)) == ("mooncake", 512, 40)
    first = json.loads(MOONCAKE.read_text().splitlines()[0])
    r0 = trace.requests[0]
    assert (r0.index, r0.request_id, r0.arrival_ms) == (0, "0", float(first["timestamp"]))
    assert r0.hash_ids == tuple(first["hash_ids"]) and r0.input_length == first["input_length"]
    assert [r.index for r in trace.requests] == list(range(40))
    assert trace.max_model_len == max(r.input_length + r.output_length for r in trace.requests)


def test_bailian_format_seconds_and_conversations():
    trace = load_trace(BAILIAN)
    raw = [json.loads(line) for line in BAILIAN.read_text().splitlines()]
    assert (trace.format, trace.block_size, len(trace)) == ("qwen-bailian", 16, len(raw))
    for r, d in zip(trace.requests, raw):
        assert r.arrival_ms == pytest.approx(d["timestamp"] * 1000)
        assert (r.chat_id, r.parent_chat_id, r.turn, r.type) == (
            d["chat_id"],
            d["parent_chat_id"],
            d["turn"],
            d["type"],
        )
        assert len(r.hash_ids) == -(-r.input_length // 16)


@pytest.mark.parametrize(
    "record, fragment",
    [
        ("{not json", "not JSON"),
        ('{"timestamp": 0, "output_length": 2, "hash_ids": [1]}', "missing field 'input_length'"),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]}',
            "needs 2 hash ids",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}',
            "output_length must be >= 1",
        ),
        (
            '{"timestamp": 0, "input_length": true, "output_length": 2, "hash_ids": [1]}',
            "input_length must be an integer",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [-3]}',
            "hash_ids must hold integers >= 0",
        ),
        (
            '{"timestamp": -1, "input_length": 10, "output_length": 2, "hash_ids": [1]}',
            "timestamp must be a number >= 0",
        ),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_a_bad_line_is_refused_naming_line_and_field(record, fragment):
    good = json.dumps(mooncake(0, 10, 2, [7]))
    with pytest.raises(TraceError) as e:
        parse_trace([good, "", record], name="t.jsonl")
    assert "t.jsonl line 3" in str(e.value) and fragment in str(e.value)


def test_empty_and_oversized_traces_and_bad_format():
    with pytest.raises(TraceError, match="no requests"):
        parse_trace(["", "  "], name="e.jsonl")
    with pytest.raises(TraceError, match="more than 1 requests"):
        parse_trace(lines(mooncake(0, 5, 1, [1]), mooncake(1, 5, 1, [1])), max_requests=1)
    with pytest.raises(TraceError, match="format must be one of"):
        parse_trace(lines(mooncake(0, 5, 1, [1])), fmt="vllm")
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(FIXTURES / "no_such_trace.jsonl")


# -- tokens -----------------------------------------------------------------------------------
def test_block_tokens_are_one_to_one_and_never_the_placeholder():
    seen = {}
    for h in list(range(3600)) + [MAX_HASH_ID - 1, MAX_HASH_ID]:
        t = block_token(h)
        assert t != PLACEHOLDER_TOKEN and t not in seen, (h, seen.get(t))
        seen[t] = h


def test_prompt_tokens_fit_vllms_32_bit_token_ids():
    """vLLM 0.34 keeps token ids in an int32 array (``TokenBuffer``): a prompt made from a trace
    whose hash ids reach ``MAX_HASH_ID`` must fit it (the pairing of id and block position that
    came before overflowed it from ids near 65,536 on, and the replay crashed on vLLM's side)."""
    req = TraceRequest(0, 0, 3 * 512 + 7, 1, (70_000, 100_000 + 5, 1 << 20, MAX_HASH_ID))
    tokens = prompt_token_ids(req, 512)
    assert len(tokens) == req.input_length
    assert array("i", tokens).tolist() == tokens  # raises OverflowError past 2**31 - 1
    assert max(tokens) == MAX_HASH_ID + 1 == (1 << 31) - 1


def _shared_blocks(a: TraceRequest, b: TraceRequest, bs: int, tb: int = 512) -> int:
    hasher = get_request_block_hasher(bs, sha256)
    ha, hb = [], []
    hasher.extend(ha, prompt_token_ids(a, tb), None)
    hasher.extend(hb, prompt_token_ids(b, tb), None)
    n = 0
    while n < min(len(ha), len(hb)) and ha[n] == hb[n]:
        n += 1
    return n


@pytest.mark.parametrize("bs", [16, 64, 512])
def test_chained_hashes_share_exactly_what_the_trace_shares(bs):
    a = TraceRequest(0, 0, 1200, 1, (1, 2, 3))  # last trace block partial: 176 tokens
    b = TraceRequest(1, 0, 1100, 1, (1, 2, 4))  # shares two trace blocks
    c = TraceRequest(2, 0, 1200, 1, (1, 2, 3))  # the same prompt
    d = TraceRequest(3, 0, 1536, 1, (9, 2, 3))  # same ids later on, another first block
    e = TraceRequest(4, 0, 700, 1, (1, 5))  # shares the first trace block only
    assert len(prompt_token_ids(a, 512)) == 1200
    assert prompt_token_ids(a, 512)[1024:] == [block_token(3)] * 176
    assert _shared_blocks(a, b, bs) == 1024 // bs
    # the partial block: its full cache blocks are shared, its partial end never is
    assert _shared_blocks(a, c, bs) == 1200 // bs
    assert _shared_blocks(a, d, bs) == 0
    assert _shared_blocks(a, e, bs) == 512 // bs


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
@pytest.mark.parametrize("bs", [16, 512])
def test_the_shared_hasher_gives_kvcores_hashes_block_for_block(algo, bs):
    """Over the whole shipped trace (prompts, then answers appended a few tokens at a time, as
    a decode appends them), the memo's hashes are kvcore's own, and it was read."""
    from kvcore.utils.hashing import get_hash_fn_by_name

    trace = load_trace(SHIPPED_TRACE)
    plain = get_request_block_hasher(bs, get_hash_fn_by_name(algo))
    shared = SharedBlockHasher(plain)
    hits = 0
    for r in trace.requests[: 4000 if bs == 512 else 600]:
        tokens = prompt_token_ids(r, trace.block_size)
        want, got = [], []
        plain.extend(want, tokens, None)
        before = len(shared._memo)
        shared.extend(got, tokens, None)
        hits += len(got) - (len(shared._memo) - before)
        tail = list(tokens)
        for add in ([PLACEHOLDER_TOKEN] * 7, [PLACEHOLDER_TOKEN] * (3 * bs), [5] * bs):
            tail += add
            plain.extend(want, tail, None)
            shared.extend(got, tail, None)
        assert got == want, r.index
    assert hits > 1000
    # a salt goes to kvcore's own loop, so block 0 differs from the unsalted chain
    salted, plain_salted = [], []
    shared.extend(salted, tokens, "salt")
    plain.extend(plain_salted, tokens, "salt")
    assert salted == plain_salted and salted[0] != want[0]


def test_block_size_must_divide_the_trace_block():
    check_block_size(16, 512)
    check_block_size(512, 512)
    with pytest.raises(ValueError, match="does not divide the trace's block of 512"):
        check_block_size(24, 512)
    with pytest.raises(ValueError, match="use one of 1, 2, 4, 8, 16"):
        check_block_size(32, 16)
    trace = load_trace(BAILIAN)
    with pytest.raises(ScenarioError, match="engine.block_size"):
        replay_settings(trace, {"block_size": 32})


# -- the infinite-cache bound and the engine ---------------------------------------------------
def test_upper_bound_by_hand():
    trace = parse_trace(
        lines(
            mooncake(0, 1100, 2, [1, 2, 3]),
            mooncake(1, 1100, 2, [1, 2, 3]),  # the same prompt: capped at full blocks < 1100
            mooncake(2, 1024, 2, [1, 2]),  # a prefix of it: capped at 1023 tokens
            mooncake(3, 600, 2, [1, 7]),
            mooncake(4, 400, 2, [8]),
        )
    )
    assert upper_bound_hits(trace, 512) == [0, 1024, 512, 512, 0]
    assert upper_bound_hits(trace, 16) == [0, 1088, 1008, 512, 0]
    assert upper_bound_hits(trace, 16, max_cache_hit_length=100) == [0, 96, 96, 96, 0]
    assert max_hit_tokens(1024, 16, None) == 1008


@pytest.mark.parametrize("bs", [16, 512])
def test_sequential_replay_with_a_pool_that_never_evicts_reaches_the_bound(bs):
    trace = load_trace(MOONCAKE)
    settings = replay_settings(trace, {"block_size": bs, "num_gpu_blocks": 2_000_000 // bs})
    result = replay(trace, settings)
    assert result.evictions == 0 and result.preemptions == 0
    assert [r.hit_tokens for r in result.per_request] == upper_bound_hits(trace, bs)
    assert result.hit_tokens == result.upper_bound_hit_tokens > 0


def test_results_mean_what_vllm_means():
    trace = load_trace(MOONCAKE)
    r = replay(trace, replay_settings(trace, {"block_size": 512, "num_gpu_blocks": 140}))
    assert r.done and r.requests == 40
    assert [p.request_id for p in r.per_request] == [str(i) for i in range(40)]
    assert r.queries == r.prompt_tokens == trace.prompt_tokens  # each admitted once, whole prompt
    assert sum(p.hit_tokens for p in r.per_request) == r.hit_tokens
    assert r.hit_rate == r.hit_tokens / r.queries
    assert 0 < r.hit_tokens < r.upper_bound_hit_tokens  # a small pool loses hits to evictions
    assert r.evictions > 0 and r.preemptions == 0
    assert all(p.admitted_step <= p.finished_step for p in r.per_request)
    s = r.series
    assert s.step[-1] == r.steps and list(s.step) == sorted(set(s.step))
    assert s.hits[-1] == r.hit_tokens and s.queries[-1] == r.queries
    assert max(s.usage()) <= 1.0 and s.running[-1] == 0
    d = r.to_dict(series_points=50)
    assert len(d["series"]["step"]) <= 50 and d["series"]["step"][-1] == r.steps
    for key in ("requests", "prompt_tokens", "hit_tokens", "hit_rate", "evictions", "preemptions"):
        assert key in d
    assert d["per_request"][3]["hit_tokens"] == r.per_request[3].hit_tokens


def test_preempted_requests_are_counted_apart():
    trace = load_trace(MOONCAKE)
    tight = {"block_size": 512, "num_gpu_blocks": 140, "max_num_seqs": 8}
    tight |= {"admission": "first_chunk", "max_num_batched_tokens": 2048}
    r = replay(trace, replay_settings(trace, tight, arrival="timestamps"))
    assert r.preemptions > 0 and r.preempted_requests == r.preemptions
    assert sum(p.num_preemptions for p in r.per_request) == r.preemptions
    # first admissions only in queries/hits; every resumption apart
    assert r.queries == trace.prompt_tokens and r.requests == 40
    assert r.preempted_queries > 0
    assert sum(p.hit_tokens for p in r.per_request) == r.hit_tokens


# -- arrival rules -----------------------------------------------------------------------------
def _hand_trace():
    return parse_trace(
        lines(
            mooncake(0, 100, 3, [1]),
            mooncake(1000, 100, 3, [1]),
            mooncake(1000, 600, 2, [1, 2]),
            mooncake(5000, 50, 1, [3]),
        )
    )


def test_sequential_runs_one_request_at_a_time():
    trace = load_trace(MOONCAKE)
    run = Replay(trace, replay_settings(trace, {"block_size": 512, "num_gpu_blocks": 400}))
    seen = []
    run.add_step_hook(lambda info: seen.append(info))
    run.advance()
    assert max(i.num_running + i.num_waiting for i in seen) == 1
    assert [a for i in seen for a in i.admitted] == [str(i) for i in range(40)]


@pytest.mark.parametrize("speedup", [1.0, 4.0])
def test_timestamps_follow_the_trace_clock(speedup):
    trace = _hand_trace()
    settings = replay_settings(
        trace, {"block_size": 16, "num_gpu_blocks": 64}, arrival="timestamps", speedup=speedup
    )
    run = Replay(trace, settings)
    admitted_at = {}
    clock = [0.0]

    def hook(info):
        step_ms = settings.step_ms + settings.token_ms * info.num_scheduled_tokens
        start = info.clock_ms - info.num_steps * step_ms if info.num_steps == 1 else None
        for rid in info.admitted:
            admitted_at[rid] = start
        clock[0] = info.clock_ms

    run.add_step_hook(hook)
    run.advance()
    arrivals = [r.arrival_ms / speedup for r in trace.requests]
    for rid, start in admitted_at.items():
        assert start >= arrivals[int(rid)] - 1e-9  # never before it arrived
    # the idle engine jumps to the next arrival: request 1 starts exactly on time
    assert admitted_at["1"] == pytest.approx(arrivals[1])
    assert admitted_at["3"] == pytest.approx(arrivals[3])
    assert run.result().simulated_s * 1000 == pytest.approx(clock[0])


def test_settings_are_checked_like_a_scenario_file():
    trace = _hand_trace()
    with pytest.raises(ScenarioError, match="engine.no_such: unknown setting"):
        replay_settings(trace, {"no_such": 1})
    with pytest.raises(ScenarioError, match="arrival: must be one of sequential, timestamps"):
        replay_settings(trace, arrival="poisson")
    with pytest.raises(ScenarioError, match="speedup: must be a number > 0"):
        replay_settings(trace, speedup=0)
    with pytest.raises(ScenarioError, match="engine.speculative: not in a replay"):
        replay_settings(trace, {"speculative": {"num_speculative_tokens": 2}})
    s = replay_settings(trace)
    assert s.engine.max_model_len == trace.max_model_len == 602
    assert (s.engine.block_size, s.engine.num_gpu_blocks) == (16, (1 << 20) // 16 + 1)


def test_a_request_that_never_fits_is_refused_up_front():
    trace = _hand_trace()
    with pytest.raises(ReplayError, match=r"request 2 needs 38 blocks of 16 tokens.*at least 39"):
        Replay(trace, replay_settings(trace, {"num_gpu_blocks": 20}))


# -- the budget --------------------------------------------------------------------------------
def test_budget_refusals_name_the_limit():
    trace = load_trace(MOONCAKE)
    settings = replay_settings(trace, {"block_size": 512, "num_gpu_blocks": 200})
    with pytest.raises(BudgetError, match=r"requests = 40.*PAGED_KV_LAB_MAX_REQUESTS"):
        check_trace(trace, settings, Limits(max_requests=32))
    wide = Limits(max_requests=100, max_block_size=512, max_num_batched_tokens=8192)
    with pytest.raises(BudgetError, match=r"block_size = 512.*PAGED_KV_LAB_MAX_BLOCK_SIZE"):
        check_trace(trace, settings, Limits(max_requests=100))
    with pytest.raises(BudgetError, match=r"input_length = .*PAGED_KV_LAB_MAX_PROMPT_TOKENS"):
        check_trace(trace, settings, wide)
    wide = replace(wide, max_prompt_tokens=10**6, max_tokens=10**6)
    check_trace(trace, settings, wide)
    with pytest.raises(BudgetError, match=r"num_gpu_blocks = 200.*PAGED_KV_LAB_MAX_BLOCKS"):
        check_trace(trace, settings, replace(wide, max_num_gpu_blocks=100))


def test_one_trace_budget_for_the_cli_and_the_page():
    """workloads/trace_limits.py bounds a trace for both sides: the page's limits are set by the
    PAGED_KV_LAB_REPLAY_* variables, the CLI's by the record budget's PAGED_KV_LAB_MAX_* ones, and
    a refusal names the side's variable."""
    from paged_kv_lab.workloads.trace_limits import cli_trace_limits, page_trace_limits

    trace = load_trace(MOONCAKE)
    settings = replay_settings(trace, {"block_size": 512, "num_gpu_blocks": 200})
    page = page_trace_limits({"PAGED_KV_LAB_REPLAY_MAX_REQUESTS": "10"})
    with pytest.raises(
        BudgetError,
        match=r"requests = 40; this page allows at most 10 \(PAGED_KV_LAB_REPLAY_MAX_REQUESTS\)",
    ):
        check_trace(trace, settings, page)
    page = page_trace_limits({"PAGED_KV_LAB_REPLAY_MAX_TOKENS": "1000"})
    with pytest.raises(BudgetError, match=r"prompt \+ output tokens = .*REPLAY_MAX_TOKENS"):
        check_trace(trace, settings, page)
    check_trace(trace, settings, page_trace_limits({}))
    cli = cli_trace_limits(8 * 10**9)
    check_trace(trace, settings, cli)
    with pytest.raises(BudgetError, match=r"PAGED_KV_LAB_MAX_BLOCKS"):
        check_trace(trace, settings, replace(cli, max_num_gpu_blocks=100))


def test_the_clis_budget_admits_the_whole_shipped_trace():
    trace = load_trace(SHIPPED_TRACE)
    assert len(trace) == 3993 and trace.max_input_length == 191_378
    for bs in (16, 512):
        check_trace(trace, replay_settings(trace, {"block_size": bs}), cli_limits(8 * 10**9))


def test_bench_counts_block_operations_consistently():
    from bench.bench_replay import count_block_ops

    trace = load_trace(MOONCAKE)
    settings = replay_settings(trace, {"block_size": 512, "num_gpu_blocks": 140})
    ops = count_block_ops(trace, settings)
    result = replay(trace, settings)
    # every block a request held was either allocated for it or touched (a hit), and is freed
    assert ops["freed"] == ops["allocated"] + ops["touched"]
    assert ops["touched"] == result.hit_tokens // 512
    assert ops["evicted"] == result.evictions > 0
    assert ops["total"] == sum(v for k, v in ops.items() if k != "total")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(0, 9), st.integers(0, 9)),
        min_size=1,
        max_size=600,
    ),
    st.integers(2, 120),
)
def test_a_sampled_series_keeps_its_ends_and_every_peak_and_trough(points, max_points):
    """TimeSeries.sample: at most max_points of the points, the first and last among them, and
    (from 14 points asked) the highest and lowest blocks in use, running and waiting of the
    whole run: a chart of the sample shows the run's peak usage."""
    n = len(points)
    used, running, waiting = (tuple(p[k] for p in points) for k in range(3))
    series = TimeSeries(
        step=tuple(range(1, n + 1)),
        clock_ms=tuple(float(i) for i in range(n)),
        running=running,
        waiting=waiting,
        used_blocks=used,
        queries=tuple(range(n)),
        hits=tuple(i // 2 for i in range(n)),
        usable_blocks=50,
    )
    got = series.sample(max_points)
    assert len(got) <= max(max_points, 2) or len(got) == n
    assert got.step[0] == 1 and got.step[-1] == n and list(got.step) == sorted(set(got.step))
    kept = {s - 1 for s in got.step}
    for field in ("used_blocks", "running", "waiting", "queries", "hits", "clock_ms"):
        assert getattr(got, field) == tuple(getattr(series, field)[i] for i in sorted(kept))
    if n > max_points >= 14:
        for values in (used, running, waiting):
            assert max(values[i] for i in kept) == max(values)
            assert min(values[i] for i in kept) == min(values)
