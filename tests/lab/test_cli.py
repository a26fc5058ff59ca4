"""The command-line replay: examples run, traces (header, steps, outputs) parse, outputs match the
engine, bad input exits 2."""

import json
from dataclasses import replace

import pytest

from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import load_scenario, scenario_to_dict
from paged_kv_lab.run.trace_file import read_trace
from paged_kv_lab.why.sentences import sentence
from support.cli import run_cli, run_cli_here
from support.paths import ROOT

EXAMPLES = sorted((ROOT / "paged_kv_lab" / "content" / "examples").glob("*.json"))


def test_there_are_examples():
    names = {p.stem for p in EXAMPLES}
    assert {"shared_prefix", "eviction", "preemption", "sliding_window"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_trace_matches_engine(path, tmp_path, tiny_model):
    out = tmp_path / "trace.jsonl"
    # one example in a real process (the module entry point), the rest through main() here
    run = run_cli if path.stem == "eviction" else run_cli_here
    r = run("run", path, "--model", "tiny-random", "--device", "cpu", "--trace", out, "--check")
    assert r.returncode == 0, r.stderr
    assert "== step 1" in r.stdout and "== outputs" in r.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    header, steps, last = lines[0], lines[1:-1], lines[-1]
    records = [StepRecord.from_dict(d) for d in steps]
    assert [rec.step for rec in records] == list(range(1, len(records) + 1))
    assert all(rec.snapshot.num_free_blocks == len(rec.snapshot.free_queue) for rec in records)
    cli_outputs = last["outputs"]

    scenario = replace(load_scenario(path), model="tiny-random", device="cpu")
    engine = Engine(scenario, model=tiny_model)
    # the header: the scenario as run (after --model/--device) and the state before step 1
    assert set(header) == {"scenario", "snapshot"}
    assert header["scenario"] == scenario_to_dict(scenario)
    assert (
        Snapshot.from_dict(header["snapshot"]) == engine.snapshot() and engine.snapshot().step == 0
    )
    engine.run()
    assert cli_outputs == engine.outputs()
    # the trace is the engine's own record, step for step
    assert [r.to_dict() for r in engine.history] == [rec.to_dict() for rec in records]
    # the step log is one sentence per event, the app's own (decoded tokens aside)
    for e in records[0].events:
        if e.kind != "sampled":
            assert f"   {sentence(e)}\n" in r.stdout, sentence(e)
    # and the app's reader gets all of it back
    t = read_trace(out.read_text())
    assert (
        t.scenario == header["scenario"]
        and t.records == tuple(records)
        and t.outputs == cli_outputs
    )


def test_until_stops_at_first_event(tmp_path):
    out = tmp_path / "until.jsonl"
    r = run_cli_here(
        "run",
        ROOT / "paged_kv_lab" / "content" / "examples" / "preemption.json",
        "--model",
        "tiny-random",
        "--device",
        "cpu",
        "--until",
        "preempted",
        "--trace",
        out,
        "--lang",
        "zh",
    )
    assert r.returncode == 0, r.stderr
    t = read_trace(out.read_text())
    # the log's frame is in the log's language too
    assert f"-- 停在第一个 'preempted' 事件处（第 {t.records[-1].step} 步）" in r.stdout
    # the step log is the app's own sentences (words.sentences), here in Chinese, reasons included
    pre = next(e for e in t.records[-1].events if e.kind == "preempted")
    assert f"   {sentence(pre, 'zh')}\n" in r.stdout and "被抢占（FCFS" in r.stdout
    assert "模型采样" in r.stdout
    # a stopped run still ends its trace with the outputs so far
    assert t.outputs is not None and any(o["finish_reason"] is None for o in t.outputs.values())


@pytest.mark.parametrize(
    "content, needle",
    [
        ("{not json", "json: line 1"),
        ('{"engine": {"block_size": 0}}', "engine.block_size: must be an integer >= 1"),
        ('{"engine": {"num_gpu_blocks": 1}}', "engine.num_gpu_blocks: must be an integer >= 2"),
        ('{"engine": {"colour": 1}}', "engine.colour: unknown setting"),
        ('{"model": "gpt5"}', "model: must be one of"),
        ('{"device": "tpu"}', "device: must be one of"),
        ('{"requests": [{"id": "a", "prompt": "x", "max_tokens": 0}]}', "requests[0].max_tokens"),
        (
            '{"requests": [{"id": "a"}]}',
            "requests[0]: give exactly one of prompt, prompt_token_ids or prompt_embeds",
        ),
        ('{"requests": [{"id": "a", "prompt": "x"}, {"id": "a", "prompt": "y"}]}', "duplicate id"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_bad_scenarios_exit_2(tmp_path, content, needle):
    f = tmp_path / "bad.json"
    f.write_text(content)
    r = run_cli_here("run", f, "--model", "tiny-random", "--device", "cpu")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr


def test_prompt_larger_than_pool_exits_2(tmp_path):
    f = tmp_path / "big.json"
    f.write_text(
        json.dumps(
            {
                "model": "tiny-random",
                "device": "cpu",
                "engine": {"block_size": 2, "num_gpu_blocks": 3},
                "requests": [{"id": "big", "prompt_token_ids": list(range(1, 20))}],
            }
        )
    )
    r = run_cli_here("run", f)
    assert r.returncode == 2
    assert "needs 10 blocks" in r.stderr and "only 2 usable blocks" in r.stderr


def test_missing_file_and_bad_until(tmp_path):
    r = run_cli("run", tmp_path / "nope.json")
    assert r.returncode == 2 and "cannot read" in r.stderr
    r = run_cli(
        "run",
        ROOT / "paged_kv_lab" / "content" / "examples" / "eviction.json",
        "--until",
        "explosion",
    )
    assert r.returncode == 2 and "--until must be one of" in r.stderr


def test_unknown_device_is_a_clear_error(tmp_path):
    r = run_cli(
        "run",
        ROOT / "paged_kv_lab" / "content" / "examples" / "eviction.json",
        "--model",
        "tiny-random",
        "--device",
        "quantum",
    )
    assert r.returncode == 2 and "invalid choice" in r.stderr
