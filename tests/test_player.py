"""The player's data contract, without a browser: what the payload says at every step equals an
independent engine's snapshot, deltas rebuild whole snapshots, steps stream in pieces exactly as
at once, and text from prompts stays data (in the payload and in the static export)."""
import dataclasses
import json
import re

import pytest

from record.engine import Engine
from record.scenario import load_scenario
from lessons import BY_ID, LESSONS
from ui.panels import LessonNarrator
from runstore.runtime import lesson_scenario
from player import RunEncoder, apply_delta, run_payload, snapshot_dict, static_html
from player.export import json_for_script

HOSTILE = "<img src=x onerror=alert(1)> and <script>alert(2)</script> & \u2028"


def recorded(scenario, model):
    engine = Engine(scenario, model=model)
    initial = engine.snapshot()
    return initial, engine.run(max_steps=400), engine


def replay(payload):
    """The snapshots the browser rebuilds: head's, then each step's delta applied in order."""
    snaps = [payload["head"]["initial"]]
    for st in payload["steps"]:
        snaps.append(apply_delta(snaps[-1], st))
    return snaps


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda l: l.id)
def test_every_step_equals_an_independent_engine(lesson, tiny_model):
    scenario = lesson_scenario(lesson, tiny_model.num_layers, model="tiny-random", device="cpu")
    initial, records, engine = recorded(scenario, tiny_model)
    payload = run_payload(initial, records, decode=engine.decode, lang="en",
                          narrate=LessonNarrator(lesson, engine_run(scenario, records), "en"))
    other = Engine(scenario, model=tiny_model)      # a second engine, stepped on its own
    truth = [other.snapshot()] + [other.step().snapshot for _ in records]
    shown = replay(payload)
    assert len(shown) == len(truth) == len(records) + 1
    for snap, got in zip(truth, shown):
        assert got == snapshot_dict(snap), f"step {snap.step}"
        # the pictures' own fields, spelled out: grid, queue, tables
        assert [(b["i"], b["r"], b["h"], b["o"], b["z"]) for b in got["blocks"]] == \
            [(b.block_id, b.ref_cnt, b.block_hash, list(b.owners), b.is_null) for b in snap.blocks]
        assert got["queue"] == list(snap.free_queue)
        assert {r["id"]: r["bt"] for r in got["reqs"]} == \
            {r.request_id: [list(t) for t in r.block_tables] for r in snap.requests}
    # every step's events are there, in order, with a sentence each
    for rec, st in zip(records, payload["steps"]):
        assert [e[0] for e in st["ev"]] == [str(e.kind) for e in rec.events]
        assert all(isinstance(e[3], str) and e[3] for e in st["ev"])


def engine_run(scenario, records):
    class Run:  # what LessonNarrator reads: the records list and the scenario
        pass
    r = Run()
    r.records, r.scenario = records, scenario
    return r


def test_deltas_are_smaller_than_whole_snapshots(tiny_model):
    lesson = BY_ID["eviction"]
    scenario = lesson_scenario(lesson, tiny_model.num_layers, model="tiny-random", device="cpu")
    initial, records, _ = recorded(scenario, tiny_model)
    payload = run_payload(initial, records)
    whole = sum(len(json.dumps(snapshot_dict(r.snapshot))) for r in records)
    deltas = sum(len(json.dumps({k: v for k, v in st.items() if k in ("blocks", "queue", "reqs", "order")}))
                 for st in payload["steps"])
    assert deltas < whole / 2, (deltas, whole)


def test_streaming_in_pieces_equals_encoding_at_once(tiny_model):
    lesson = BY_ID["prefix"]
    scenario = lesson_scenario(lesson, tiny_model.num_layers, model="tiny-random", device="cpu")
    initial, records, engine = recorded(scenario, tiny_model)
    at_once = RunEncoder(initial, decode=engine.decode).extend(records)
    enc = RunEncoder(initial, decode=engine.decode)
    for k in (1, 3, 3, len(records) - 1, len(records)):
        enc.extend(records[:k])
    assert enc.steps == at_once
    # every token a step shows has its text in the head's or an earlier (or the same) step's vocab
    vocab = set(enc.head["vocab"])
    for st in enc.steps:
        vocab |= set(st["vocab"])
        used = {t for b in st["blocks"] for t in b["k"]} | {t for r in st["reqs"] for t in r["ot"]}
        assert {str(t) for t in used} <= vocab


def hostile_scenario():
    return load_scenario({
        "name": "hostile <b>name</b>", "model": "tiny-random", "device": "cpu",
        "engine": {"block_size": 4, "num_gpu_blocks": 16, "max_num_seqs": 2, "max_num_batched_tokens": 64},
        "requests": [{"id": "<img src=x onerror=alert(1)>", "prompt": HOSTILE, "max_tokens": 3}],
    })


def test_hostile_prompt_round_trips_as_plain_data(tiny_model):
    scenario = hostile_scenario()
    initial, records, engine = recorded(scenario, tiny_model)
    payload = run_payload(initial, records, decode=engine.decode, request_ids=[r.id for r in scenario.requests])
    rid = scenario.requests[0].id
    prompts, vocab = dict(payload["head"]["prompts"]), dict(payload["head"]["vocab"])
    for st in payload["steps"]:
        prompts.update(st.get("prompts", {}))
        vocab.update(st["vocab"])
    text = "".join(vocab[str(t)] for t in prompts[rid])
    assert "<img src=x onerror=alert(1)>" in text and "<script>" in text
    html = static_html(payload, title=scenario.name)
    # the only tags are ours: the run's text never appears unescaped in the markup
    assert "<img" not in html and "<b>" not in html
    assert html.count("<script") == 2 and html.count("</script>") == 2
    inlined = re.search(r'<script type="application/json" id="pkv-run">(.*?)</script>', html, re.S).group(1)
    assert json.loads(inlined) == json.loads(json.dumps(payload))
    assert "\u2028" not in json_for_script(payload)


def test_static_html_is_self_contained(tiny_model):
    initial, records, engine = recorded(hostile_scenario(), tiny_model)
    html = static_html(run_payload(initial, records, decode=engine.decode))
    html = html.replace('"http://www.w3.org/2000/svg"', "")   # SVG's namespace name (createElementNS), never fetched
    assert "http://" not in html and "https://" not in html and "src=" not in html.split("pkv-run")[0]
    assert "default-src 'none'" in html


def test_cli_writes_the_same_player(tmp_path, tiny_model):
    from pathlib import Path

    from cli.main import main
    out = tmp_path / "run.html"
    scenario = Path(__file__).resolve().parents[1] / "examples" / "shared_prefix.json"
    assert main(["run", str(scenario), "--model", "tiny-random", "--device", "cpu", "--html", str(out), "--quiet"]) == 0
    html = out.read_text()
    payload = json.loads(re.search(r'<script type="application/json" id="pkv-run">(.*?)</script>', html, re.S).group(1))
    engine = Engine(dataclasses.replace(load_scenario(scenario), model="tiny-random", device="cpu"), model=tiny_model)
    truth = [engine.snapshot()] + [r.snapshot for r in engine.run(max_steps=400)]
    assert payload["done"] and replay(payload) == [snapshot_dict(t) for t in truth]
