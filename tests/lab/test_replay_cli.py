"""``python -m paged_kv_lab replay``: the contract scripts rely on, the sweep, the one-pass
answer."""

import csv
import io
import json
import subprocess
import sys

import pytest

from kvcore.core.block_pool import FREE_ORDERS
from paged_kv_lab.cli.main import main
from paged_kv_lab.workloads.bound import unbounded_answer
from paged_kv_lab.workloads.replay import replay, replay_settings
from paged_kv_lab.workloads.sweep import parse_sweep, sweep
from paged_kv_lab.workloads.trace_formats import load_trace
from support.paths import FIXTURES, ROOT

SLICE = FIXTURES / "traces" / "mooncake_slice.jsonl"
SMALL = ["--set", "block_size=512", "--set", "num_gpu_blocks=140"]


def test_json_contract_in_a_real_process(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "paged_kv_lab", "replay", str(SLICE), *SMALL, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "hit rate" in proc.stdout and "evictions" in proc.stdout
    d = json.loads(out.read_text())
    for key in ("requests", "prompt_tokens", "hit_tokens", "hit_rate", "evictions", "preemptions"):
        assert key in d
    assert d["requests"] == 40 and len(d["per_request"]) == 40
    assert [p["request_id"] for p in d["per_request"]] == [str(i) for i in range(40)]
    trace = load_trace(SLICE)
    expected = replay(trace, replay_settings(trace, {"block_size": 512, "num_gpu_blocks": 140}))
    assert [p["hit_tokens"] for p in d["per_request"]] == [
        r.hit_tokens for r in expected.per_request
    ]
    assert d["hit_tokens"] == expected.hit_tokens and d["evictions"] == expected.evictions
    assert d["hit_rate"] == pytest.approx(d["hit_tokens"] / d["prompt_tokens"])


def test_json_to_stdout_keeps_the_table_on_stderr(capsys):
    assert main(["replay", str(SLICE), *SMALL, "--requests", "10", "--json"]) == 0
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert d["requests"] == 10 and "hit tokens" in err


def test_timestamps_arrival_and_speedup(capsys):
    args = ["replay", str(SLICE), *SMALL, "--arrival", "timestamps", "--speedup", "2", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["settings"]["arrival"] == "timestamps" and d["settings"]["speedup"] == 2.0
    assert d["series"]["clock_ms"][-1] == pytest.approx(d["simulated_s"] * 1000)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["no_such.jsonl"], "cannot read no_such.jsonl"),
        ([str(SLICE), "--set", "block_size=24"], "does not divide the trace's block of 512"),
        ([str(SLICE), "--set", "nonsense=1"], "engine.nonsense: unknown setting"),
        ([str(SLICE), "--set", "num_gpu_blocks=50"], "raise num_gpu_blocks to at least"),
        ([str(SLICE), "--sweep", "colour=1,2"], "unknown setting 'colour'"),
        ([str(SLICE), "--sweep", "num_gpu_blocks"], "write KEY=V1,V2"),
        ([str(SLICE), "--csv", "x.csv"], "--csv writes a --sweep's table"),
        ([str(SLICE), "--requests", "0"], "--requests: must be >= 1"),
    ],
)
def test_bad_input_is_a_clear_message(args, fragment, capsys):
    assert main(["replay", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment in err and "Traceback" not in err


def test_sweep_runs_points_in_processes_and_writes_csv(tmp_path, capsys):
    out = tmp_path / "s.csv"
    args = ["replay", str(SLICE), "--set", "block_size=512", "--sweep", "num_gpu_blocks=140,50,600"]
    assert main([*args, "--csv", str(out), "--workers", "2"]) == 1  # 1: a point could not run
    text = capsys.readouterr().out
    assert "sweep num_gpu_blocks" in text and "unbounded pool: hit rate" in text
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["value"] for r in rows[:3]] == ["140", "50", "600"]
    assert "raise num_gpu_blocks" in rows[1]["error"]  # a point that cannot run says why
    trace = load_trace(SLICE)
    for r in (rows[0], rows[2]):
        n = int(r["value"])
        alone = replay(trace, replay_settings(trace, {"block_size": 512, "num_gpu_blocks": n}))
        assert int(r["hit_tokens"]) == alone.hit_tokens
    assert float(rows[2]["hit_rate"]) >= float(rows[0]["hit_rate"])
    assert "smallest pool reaching the unbounded hit rate" in rows[3]["note"]


def test_parse_sweep_reads_json_values():
    assert parse_sweep("num_gpu_blocks=100, 200") == ("num_gpu_blocks", [100, 200])
    orders = ",".join(FREE_ORDERS)  # v0.33,legacy
    assert parse_sweep(f"free_order={orders}") == ("free_order", list(FREE_ORDERS))
    assert parse_sweep("speedup=1,2.5") == ("speedup", [1, 2.5])


def test_sweep_over_block_size_in_process():
    trace = load_trace(SLICE).slice(0, 12)
    points = sweep(trace, {}, "block_size", [512, 128], workers=1)
    assert [p.value for p in points] == [512, 128] and all(p.error is None for p in points)
    # a finer block shares more of the same prompts, never less
    assert points[1].result.upper_bound_hit_tokens >= points[0].result.upper_bound_hit_tokens


@pytest.mark.parametrize("bs", [512, 64])
def test_one_pass_answer_is_exact(bs):
    trace = load_trace(SLICE)
    settings = replay_settings(trace, {"block_size": bs})
    ans = unbounded_answer(trace, settings)
    assert ans.exact and ans.duplicate_blocks == 0
    n = ans.smallest_num_gpu_blocks

    def hits(num_gpu_blocks):
        s = replay_settings(trace, {"block_size": bs, "num_gpu_blocks": num_gpu_blocks})
        return replay(trace, s).hit_tokens

    assert hits(n) == ans.hit_tokens
    assert hits(n - 1) < ans.hit_tokens


def test_one_pass_answer_says_when_it_does_not_apply():
    trace = load_trace(SLICE)
    ans = unbounded_answer(trace, replay_settings(trace, arrival="timestamps"))
    assert ans.hit_tokens is None and "timestamps" in ans.why and not ans.exact


def test_a_refusal_is_said_in_the_chosen_language(monkeypatch, capsys):
    """``--lang zh``: the budget's refusal in 中文, naming the same limit and variable."""
    monkeypatch.setenv("PAGED_KV_LAB_MAX_REQUESTS", "3")
    assert main(["replay", str(SLICE), *SMALL, "--lang", "zh"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 轨迹的请求数 = ") and "最多 3（PAGED_KV_LAB_MAX_REQUESTS）" in err
    assert main(["replay", str(SLICE), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "the trace's requests = " in err and "at most 3 (PAGED_KV_LAB_MAX_REQUESTS)" in err
