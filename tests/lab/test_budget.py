"""The resource budget: each limit refuses with a message naming the value, the limit and its
knob."""

import sys

import pytest

from paged_kv_lab.run.budget import (
    ENV,
    BudgetError,
    Limits,
    activation_bytes,
    app_limits,
    check_scenario,
    check_size,
    check_steps,
    cli_limits,
    kv_pool_bytes,
)
from paged_kv_lab.run.scenario import load_scenario


class SmolConfig:  # SmolLM2-135M's shape, without loading it
    num_hidden_layers, num_attention_heads, num_key_value_heads = 30, 9, 3
    hidden_size, intermediate_size, vocab_size = 576, 1536, 49152


CFG = SmolConfig()
L = Limits()


def scenario(engine=None, requests=None):
    return load_scenario(
        {
            "engine": engine or {},
            "requests": requests
            if requests is not None
            else [{"id": "A", "prompt": "hello", "max_tokens": 4}],
        }
    )


def refused(sc, limits=L, config=CFG, encode=None) -> BudgetError:
    with pytest.raises(BudgetError) as e:
        check_scenario(sc, limits, config, encode)
    return e.value


def test_budget_is_pure_python():
    """Importing the budget (and the scenario it checks) in a fresh interpreter loads no torch."""
    import subprocess

    code = (
        "import sys, paged_kv_lab.run.budget, paged_kv_lab.run.scenario; "
        "sys.exit('torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr or "paged_kv_lab.run.budget imported torch"


def test_every_lesson_fits_the_default_limits():
    from paged_kv_lab.content import BY_ID

    for lesson in BY_ID.values():
        d = lesson.scenario_dict(30, {})
        check_scenario(load_scenario(d), L, CFG, encode=lambda r: [0] * (len(r.prompt) // 2 + 20))


def test_kv_pool_bytes_message_names_slots_bytes_and_knob():
    e = refused(scenario({"num_gpu_blocks": 2000, "block_size": 128}))
    msg = str(e)
    assert "engine.num_gpu_blocks × block_size = 256,000 token slots" in msg
    assert (
        "11.8 GB of KV cache" in msg
        and "256.0 MB per run" in msg
        and "PAGED_KV_LAB_MAX_RUN_BYTES" in msg
    )
    assert e.value == kv_pool_bytes(CFG, 128, 2000) == 2000 * 128 * 30 * 2 * 3 * 64 * 4


@pytest.mark.parametrize(
    "engine, knob, value",
    [
        ({"num_gpu_blocks": 100_000}, "PAGED_KV_LAB_MAX_BLOCKS", "100,000"),
        ({"block_size": 100_000}, "PAGED_KV_LAB_MAX_BLOCK_SIZE", "100,000"),
        ({"max_num_batched_tokens": 10**6}, "PAGED_KV_LAB_MAX_BATCHED_TOKENS", "1,000,000"),
    ],
)
def test_structural_engine_limits(engine, knob, value):
    e = refused(scenario(engine), config=None)  # refused before any model arithmetic
    assert knob in str(e) and value in str(e) and e.limit == knob


def test_request_limits():
    many = [{"id": f"r{i}", "prompt_token_ids": [1], "max_tokens": 1} for i in range(33)]
    assert "PAGED_KV_LAB_MAX_REQUESTS" in str(refused(scenario(requests=many)))
    big = [{"id": "A", "prompt": "x", "max_tokens": 10**6}]
    assert "requests[0].max_tokens = 1,000,000" in str(refused(scenario(requests=big)))
    late = [{"id": "A", "prompt": "x", "arrival_step": 10**9}]
    assert "PAGED_KV_LAB_MAX_RUN_STEPS" in str(refused(scenario(requests=late)))


def test_prompt_text_is_capped_before_tokenizing():
    calls = []
    long = [{"id": "A", "prompt": "y" * 200_000}]
    e = refused(scenario(requests=long), encode=lambda r: calls.append(r) or [1])
    assert "200,000 characters" in str(e) and "PAGED_KV_LAB_MAX_PROMPT_CHARS" in str(e)
    assert calls == [], "a too-long text is never tokenized"


def test_prompt_tokens_are_counted_after_tokenizing():
    e = refused(
        scenario(requests=[{"id": "A", "prompt": "short text"}]), encode=lambda r: [1] * 5000
    )
    assert "requests[0].prompt = 5,000 tokens" in str(
        e
    ) and "PAGED_KV_LAB_MAX_PROMPT_TOKENS" in str(e)
    ids = [{"id": "A", "prompt_token_ids": [1] * 3000}]
    assert "PAGED_KV_LAB_MAX_PROMPT_TOKENS" in str(refused(scenario(requests=ids), config=None))


def test_activation_memory_of_the_largest_prefill():
    reqs = [{"id": f"r{i}", "prompt_token_ids": [1] * 1000, "max_tokens": 8} for i in range(4)]
    sc = scenario(
        {
            "block_size": 16,
            "num_gpu_blocks": 300,
            "max_num_batched_tokens": 2048,
            "max_num_seqs": 4,
        },
        reqs,
    )
    e = refused(sc)
    assert "PAGED_KV_LAB_MAX_ACTIVATION_BYTES" in str(e) and "activations" in str(e)
    # the same requests one at a time (max_num_seqs 1) and a smaller chunk fit
    check_scenario(
        scenario(
            {
                "block_size": 16,
                "num_gpu_blocks": 300,
                "max_num_batched_tokens": 256,
                "max_num_seqs": 1,
            },
            reqs,
        ),
        L,
        CFG,
    )
    assert activation_bytes(CFG, 2048, 4, 1008) > activation_bytes(CFG, 256, 1, 1008)


def test_size_and_steps():
    check_size(10, "x", L)
    with pytest.raises(
        BudgetError,
        match=r"the file is 2\.0 MB; this server allows at most 1\.0 MB "
        r"\(PAGED_KV_LAB_MAX_FILE_BYTES\)",
    ):
        check_size(2 * 10**6, "the file", L)
    with pytest.raises(BudgetError, match="PAGED_KV_LAB_MAX_RUN_STEPS"):
        check_steps(401, L)


def test_env_sets_app_limits_and_bad_values_are_named():
    lim = app_limits({"PAGED_KV_LAB_MAX_RUN_BYTES": "1000", "PAGED_KV_LAB_MAX_BLOCKS": "8"})
    assert (
        lim.max_run_bytes == 1000 and lim.max_num_gpu_blocks == 8 and lim.max_tokens == L.max_tokens
    )
    assert "PAGED_KV_LAB_MAX_RUN_BYTES" in str(refused(scenario({"num_gpu_blocks": 4}), lim))
    with pytest.raises(BudgetError, match="PAGED_KV_LAB_MAX_TOKENS='lots'"):
        app_limits({"PAGED_KV_LAB_MAX_TOKENS": "lots"})
    assert set(ENV) <= {f for f in Limits.__dataclass_fields__}


def test_cli_is_generous_but_bounded_by_free_memory():
    lim = cli_limits(available=4 * 10**9, env={})
    check_scenario(scenario({"num_gpu_blocks": 2000, "block_size": 16}), lim, CFG)  # 1.5 GB of 2 GB
    e = refused(scenario({"num_gpu_blocks": 4000, "block_size": 16}), lim)
    assert "this machine allows (half of its free memory) 2.0 GB" in str(e)
    assert (
        cli_limits(available=4 * 10**9, env={"PAGED_KV_LAB_MAX_BLOCKS": "10"}).max_num_gpu_blocks
        == 10
    )


# -- links and files (ui/state.py) ------------------------------------------------------
def test_a_zlib_bomb_link_is_refused_while_it_is_decompressed():
    import base64
    import zlib

    from paged_kv_lab.ui.state import _decode_base, _encode_base

    assert _decode_base(_encode_base({"name": "ok"})) == {"name": "ok"}
    bomb = base64.urlsafe_b64encode(zlib.compress(b"[" + b" " * 10_000_000 + b"]", 9)).decode()
    assert len(bomb) < Limits().max_link_chars, "a real bomb: small enough to pass the length cap"
    with pytest.raises(
        BudgetError, match=r"decompresses to more than 1\.0 MB.*PAGED_KV_LAB_MAX_FILE_BYTES"
    ):
        _decode_base(bomb)
    with pytest.raises(BudgetError, match="PAGED_KV_LAB_MAX_LINK_CHARS"):
        _decode_base("A" * 20_000)


def test_files_are_capped_and_must_be_utf8():
    from paged_kv_lab.ui.state import parse_scenario_text

    d, problems = parse_scenario_text(b'{"name": "' + b"x" * 2_000_000 + b'"}')
    assert d is None and "PAGED_KV_LAB_MAX_FILE_BYTES" in problems[0]
    d, problems = parse_scenario_text('{"name": "ok"}'.encode("utf-16"))
    assert d is None and "not UTF-8" in problems[0]
    d, problems = parse_scenario_text('{"name": "ünï"}'.encode())
    assert problems == [] and d["name"] == "ünï"


# -- in the reader's language (text/catalogue/refusals.json) -----------------------------
def _refusals() -> list[BudgetError]:
    """One refusal of each kind the run budget and the trace budget give."""
    from paged_kv_lab.workloads.trace_formats import Trace, TraceRequest
    from paged_kv_lab.workloads.trace_limits import check_trace, page_trace_limits

    out = [
        refused(scenario({"num_gpu_blocks": 2000, "block_size": 256})),  # the KV pool
        refused(scenario({"block_size": 512})),  # a structural setting
        refused(scenario(requests=[{"id": "A", "prompt": "x" * 9000, "max_tokens": 4}])),
        refused(scenario(requests=[{"id": "A", "prompt": "x", "max_tokens": 4, "n": 40}])),
        refused(scenario(requests=[{"id": "A", "prompt": "x", "arrival_step": 500}])),
        refused(scenario({"num_gpu_blocks": "auto"})),
        refused(
            scenario(
                {"num_gpu_blocks": 300, "max_num_batched_tokens": 2048, "max_num_seqs": 4},
                [{"id": f"r{i}", "prompt_token_ids": [1] * 1000} for i in range(4)],
            )
        ),
    ]
    for call in (
        lambda: check_size(2 * 10**6, "x.json", L),
        lambda: check_steps(401, L),
        lambda: app_limits({"PAGED_KV_LAB_MAX_TOKENS": "lots"}),
        lambda: app_limits({"PAGED_KV_LAB_MAX_TOKENS": "0"}),
        lambda: check_trace(
            Trace(
                "t", "mooncake", 512, tuple(TraceRequest(i, 0.0, 10, 1, (i,)) for i in range(401))
            ),
            None,
            page_trace_limits({}),
        ),
    ):
        with pytest.raises(BudgetError) as e:
            call()
        out.append(e.value)
    return out


def test_a_refusal_renders_in_chinese_naming_the_same_limit_and_variable():
    """``e.text`` is the sentence in any language; ``str(e)`` stays English. In 中文 the refusal
    names the same variable and the same numbers (the limit and the value asked)."""
    import re

    from paged_kv_lab.text.i18n import Text, tr

    for e in _refusals():
        assert isinstance(e.text, Text) and e.text.key.startswith("refusal.")
        en, zh = tr(e.text, "en"), tr(e.text, "zh")
        assert str(e) == en and zh != en, en
        assert re.search(r"[\u4e00-\u9fff]", zh), zh
        assert e.limit and e.limit in en and e.limit in zh, (e.limit, zh)
        assert sorted(re.findall(r"\d[\d,.]*", en)) == sorted(re.findall(r"\d[\d,.]*", zh)), (
            en,
            zh,
        )
    zh = tr(_refusals()[2].text, "zh")
    assert "9,000 个字符" in zh and "8,000 个字符" in zh and "PAGED_KV_LAB_MAX_PROMPT_CHARS" in zh


def test_a_page_shows_the_refusal_in_the_readers_language():
    from paged_kv_lab.ui.state import parse_scenario_text

    big = b'{"name": "' + b"x" * 2_000_000 + b'"}'
    en, zh = parse_scenario_text(big, "en")[1][0], parse_scenario_text(big, "zh")[1][0]
    assert en.startswith("the scenario is 2.0 MB") and "PAGED_KV_LAB_MAX_FILE_BYTES" in en
    assert zh.startswith("该场景：2.0 MB") and "PAGED_KV_LAB_MAX_FILE_BYTES" in zh
    assert "not UTF-8" in parse_scenario_text(b"\xff", "en")[1][0]
    assert "UTF-8" in parse_scenario_text(b"\xff", "zh")[1][0]
    assert "第 1 行第 2 列" in parse_scenario_text("{x", "zh")[1][0]


def test_the_sentence_around_validation_problems_is_the_readers():
    """A scenario's or a trace file's problems and the sentence around them are catalogue
    entries (the field's path and value their data), ``str(e)`` their English."""
    from paged_kv_lab.run.scenario import ScenarioError
    from paged_kv_lab.run.trace_file import TraceError, read_trace
    from paged_kv_lab.text.i18n import said

    with pytest.raises(ScenarioError) as e:
        scenario({"block_size": "big"})
    problem = e.value.problems[0]
    assert str(e.value) == said(e.value, "en") == f"invalid scenario:\n  - {problem}"
    assert said(e.value, "zh") == f"场景无效：\n  - {e.value.lines('zh')[0]}"
    assert e.value.lines("zh")[0] == "engine.block_size：应为 >= 1 的整数；实际为 'big'"
    with pytest.raises(TraceError) as e:
        read_trace(b"\xff")
    assert str(e.value).startswith("not a readable trace:\n  - not UTF-8")
    assert said(e.value, "zh").startswith("不是可读的轨迹文件：\n  - 不是 UTF-8 文本")
    from paged_kv_lab.workloads.trace_formats import TraceError as WorkloadTraceError
    from paged_kv_lab.workloads.trace_formats import parse_trace

    for lines, en, zh in (
        ([b"\xff"], "t.jsonl line 1: not UTF-8 text", "t.jsonl 第 1 行：不是 UTF-8 文本"),
        ([b"{x"], "t.jsonl line 1: not JSON (", "t.jsonl 第 1 行：不是 JSON（第 2 列："),
        ([b" "], "t.jsonl: no requests", "t.jsonl：没有请求"),
    ):
        with pytest.raises(WorkloadTraceError) as e:
            parse_trace(lines, "t.jsonl")
        assert str(e.value).startswith(en) and said(e.value, "zh").startswith(zh)
