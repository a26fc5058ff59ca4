"""The player's data contract, without a browser: the payload is exactly the encoding of an
independent engine's snapshots (the first whole, then each as a delta on the one before; that the
browser's decoder gets the snapshots back is tests/browser/test_browser_decoder.py), deltas are
small,
steps stream in pieces exactly as at once, the wire keys name the snapshot's fields, and text from
prompts stays data (in the payload and in the static export)."""

import dataclasses
import json
import re

import pytest

from paged_kv_lab.content import BY_ID, LESSONS
from paged_kv_lab.disagg.pd import engine_for
from paged_kv_lab.player import (
    WIRE,
    RunEncoder,
    delta,
    player_book,
    run_payload,
    snapshot_dict,
    static_html,
)
from paged_kv_lab.player.export import json_for_script
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.store.timeline import lesson_scenario, played_model
from paged_kv_lab.ui.panels import LessonNarrator
from support.paths import ROOT

HOSTILE = "<img src=x onerror=alert(1)> and <script>alert(2)</script> & \u2028"


def recorded(scenario, model):
    engine = engine_for(scenario, model=model)
    initial = engine.snapshot()
    return initial, engine.run(max_steps=400), engine


STATE_KEYS = set(WIRE["snapshot"].values()) | {WIRE["step"]["request_order"]}


def assert_encodes(payload, truth):
    """``payload`` holds ``truth`` (snapshots, from the state before step 1): the head's whole, then
    each step's state part the delta on the one before, exactly as player.delta writes it."""
    wire = [snapshot_dict(s) for s in truth]
    assert payload["head"]["initial"] == wire[0]
    assert len(payload["steps"]) == len(wire) - 1
    for st, prev, cur, snap in zip(payload["steps"], wire, wire[1:], truth[1:]):
        assert {k: v for k, v in st.items() if k in STATE_KEYS} == delta(prev, cur), (
            f"step {snap.step}"
        )


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.id)
def test_every_step_equals_an_independent_engine(lesson, tiny_model):
    tiny_model = played_model(lesson, tiny_model)  # a hybrid lesson plays on its own model
    scenario = lesson_scenario(lesson, tiny_model.num_layers, model=tiny_model.name, device="cpu")
    initial, records, engine = recorded(scenario, tiny_model)
    payload = run_payload(
        initial,
        records,
        decode=engine.decode,
        lang="en",
        narrate=LessonNarrator(lesson, engine_run(scenario, records), "en"),
    )
    other = engine_for(scenario, model=tiny_model)  # a second engine, stepped on its own
    truth = [other.snapshot()] + [other.step().snapshot for _ in records]
    assert len(truth) == len(records) + 1
    assert_encodes(payload, truth)
    for snap in truth:
        got = snapshot_dict(snap)
        # the pictures' own fields, spelled out under their wire keys: grid, queue, tables
        assert [(b["i"], b["r"], b["h"], b["o"], b["z"]) for b in got["blocks"]] == [
            (b.block_id, b.ref_cnt, b.block_hash, list(b.owners), b.is_null) for b in snap.blocks
        ]
        assert got["queue"] == list(snap.free_queue)
        assert {r["id"]: r["bt"] for r in got["reqs"]} == {
            r.request_id: [list(t) for t in r.block_tables] for r in snap.requests
        }
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
    deltas = sum(
        len(json.dumps({k: v for k, v in st.items() if k in ("blocks", "queue", "reqs", "order")}))
        for st in payload["steps"]
    )
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
    return load_scenario(
        {
            "name": "hostile <b>name</b>",
            "model": "tiny-random",
            "device": "cpu",
            "engine": {
                "block_size": 4,
                "num_gpu_blocks": 16,
                "max_num_seqs": 2,
                "max_num_batched_tokens": 64,
            },
            "requests": [
                {"id": "<img src=x onerror=alert(1)>", "prompt": HOSTILE, "max_tokens": 3}
            ],
        }
    )


def test_hostile_prompt_round_trips_as_plain_data(tiny_model):
    scenario = hostile_scenario()
    initial, records, engine = recorded(scenario, tiny_model)
    payload = run_payload(
        initial, records, decode=engine.decode, request_ids=[r.id for r in scenario.requests]
    )
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
    inlined = re.search(
        r'<script type="application/json" id="pkv-run">(.*?)</script>', html, re.S
    ).group(1)
    assert json.loads(inlined) == json.loads(json.dumps(payload))
    assert "\u2028" not in json_for_script(payload)


def test_static_html_is_self_contained(tiny_model):
    initial, records, engine = recorded(hostile_scenario(), tiny_model)
    html = static_html(run_payload(initial, records, decode=engine.decode))
    # SVG's namespace name (createElementNS), never fetched
    html = html.replace('"http://www.w3.org/2000/svg"', "")
    assert (
        "http://" not in html and "https://" not in html and "src=" not in html.split("pkv-run")[0]
    )
    assert "default-src 'none'" in html


def test_cli_writes_the_same_player(tmp_path, tiny_model):

    from paged_kv_lab.cli.main import main

    out = tmp_path / "run.html"
    scenario = ROOT / "paged_kv_lab" / "content" / "examples" / "shared_prefix.json"
    assert (
        main(
            [
                "run",
                str(scenario),
                "--model",
                "tiny-random",
                "--device",
                "cpu",
                "--html",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    html = out.read_text()
    payload = json.loads(
        re.search(r'<script type="application/json" id="pkv-run">(.*?)</script>', html, re.S).group(
            1
        )
    )
    engine = Engine(
        dataclasses.replace(load_scenario(scenario), model="tiny-random", device="cpu"),
        model=tiny_model,
    )
    truth = [engine.snapshot()] + [r.snapshot for r in engine.run(max_steps=400)]
    assert payload["done"]
    assert_encodes(payload, truth)
    # the player's words and the wire keys are inlined next to the run, never inside it
    book = json.dumps(player_book("en"), ensure_ascii=False, separators=(",", ":"))
    assert book.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") in html


def test_the_wire_keys_name_the_snapshots_fields():
    """wire.json's names are recording/snapshot.py's field names (the decoder's names in the
    browser),
    no two fields of a kind share a key, and a step's keys never clash with its snapshot's."""
    from paged_kv_lab.recording.snapshot import BlockView, RequestView, Snapshot

    for kind, view in (("block", BlockView), ("request", RequestView), ("snapshot", Snapshot)):
        names = {f.name for f in dataclasses.fields(view)}
        assert set(WIRE[kind]) <= names, set(WIRE[kind]) - names
        assert len(set(WIRE[kind].values())) == len(WIRE[kind])
    assert not set(WIRE["step"].values()) & set(WIRE["snapshot"].values())
    assert WIRE["event"] == ["kind", "request_id", "block_ids", "text", "group"]


def test_each_group_carries_its_own_block_size(tiny_model):
    """Casebook case 7: KV cache groups of different block sizes. The head names each group's own
    block size, as the engine's groups have it (the head's ``block_size`` is the scheduler's, their
    least common multiple); the trace keeps the sizes and reads back the same, and a trace without
    them means one size for every group. A run whose groups share one size carries none (its
    payload as before the field existed)."""
    import math

    from paged_kv_lab.content.casebook import cases_by_id
    from paged_kv_lab.recording.snapshot import Snapshot

    lesson = cases_by_id()["which-block-size"].lesson
    model = played_model(lesson, tiny_model)
    scenario = lesson_scenario(lesson, model.num_layers, model=model.name, device="cpu")
    initial, records, engine = recorded(scenario, model)
    kvm = engine.scheduler.kv_cache_manager
    sizes = tuple(kvm.kv_cache_config.group_block_sizes)
    assert len(set(sizes)) > 1, sizes  # the case is about groups whose sizes differ
    head = run_payload(initial, records)["head"]
    assert [g["block_size"] for g in head["groups"]] == list(sizes)
    assert head["block_size"] == kvm.block_size == math.lcm(*sizes)
    for rec in (records[0], records[-1]):
        snap = rec.snapshot
        assert snap.group_block_sizes == sizes
        assert Snapshot.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap
        old = {k: v for k, v in snap.to_dict().items() if k != "group_block_sizes"}
        assert all(
            Snapshot.from_dict(old).group_block_size(g) == snap.block_size
            for g in range(len(sizes))
        )
    # the trace file keeps them; sizes that do not fit the groups are refused
    from paged_kv_lab.run.scenario import scenario_to_dict
    from paged_kv_lab.run.trace_file import TraceError, header_line, read_trace

    header = header_line(scenario_to_dict(scenario), initial)
    assert read_trace(header).initial == initial
    bad = dataclasses.replace(initial, group_block_sizes=(sizes[0], 3 * sizes[0]))
    with pytest.raises(TraceError, match="group_block_sizes"):
        read_trace(header_line(scenario_to_dict(scenario), bad))
    # each group's blocks hold at most its own size of tokens, and a full one exactly that many
    for snap in (r.snapshot for r in records):
        for r in snap.requests:
            for g, table in enumerate(r.block_tables):
                for i, bid in enumerate(table):
                    held = len(snap.blocks[bid].token_ids)
                    if bid and (i + 1) * sizes[g] <= r.num_computed_tokens:
                        assert held == sizes[g], (snap.step, r.request_id, g, i)
    one = load_scenario(
        {
            "model": "tiny-random",
            "engine": {"block_size": 4, "num_gpu_blocks": 8},
            "requests": [{"id": "a", "prompt": "one size", "max_tokens": 2}],
        }
    )
    plain, plain_records, _ = recorded(one, tiny_model)
    assert plain.group_block_sizes == () and "group_block_sizes" not in plain.to_dict()
    assert all("block_size" not in g for g in run_payload(plain, plain_records)["head"]["groups"])
