"""Events and Snapshots: plain frozen data, JSON round trip, and what they say about the engine."""

import dataclasses
import json

import pytest

from paged_kv_lab.recording import events
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.run import trace_file as trace
from support.kv import events_of, make_engine, spec, vllm_chain
from support.paths import FIXTURES

SHARED = list(range(10))


def shared_prefix_engine(**kw):
    return make_engine(
        [
            spec("a", SHARED, max_tokens=3),
            spec("b", SHARED + [42], max_tokens=2, arrival_step=1, priority=1, cache_salt=None),
        ],
        **kw,
    )


def test_snapshot_json_round_trip():
    eng = shared_prefix_engine(
        sliding_window=4,
        layer_types=("full_attention", "sliding_attention"),
        block_size=2,
        num_gpu_blocks=24,
    )
    for rec in eng.run():
        text = json.dumps(rec.snapshot.to_dict())
        back = Snapshot.from_dict(json.loads(text))
        assert back == rec.snapshot
        assert json.dumps(back.to_dict()) == text


def test_step_record_and_event_json_round_trip():
    eng = shared_prefix_engine()
    for rec in eng.run():
        d = json.loads(json.dumps(rec.to_dict()))
        back = StepRecord.from_dict(d)
        assert back == rec
        assert [type(e) for e in back.events] == [type(e) for e in rec.events]


def test_snapshots_are_frozen_and_do_not_follow_the_engine():
    eng = shared_prefix_engine()
    first = eng.step().snapshot
    frozen = json.dumps(first.to_dict())
    eng.run()
    assert json.dumps(first.to_dict()) == frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.step = 9
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.blocks[0].ref_cnt = 3


def test_snapshot_describes_blocks_queue_hash_map_and_requests():
    eng = shared_prefix_engine()
    eng.step()
    snap = eng.step().snapshot  # a decoding, b admitted with a 2-block hit
    assert snap.step == 2 and snap.block_size == 4 and snap.num_gpu_blocks == 16
    assert snap.running == ("a", "b") and snap.waiting == ()
    a, b = snap.request("a"), snap.request("b")
    assert a.block_tables == ((1, 2, 3),) and b.block_tables == ((1, 2, 4),)
    assert b.num_cached_tokens == 8 and b.priority == 1 and b.arrival == 2
    assert a.status == "running" and a.num_prompt_tokens == 10 and a.num_output_tokens == 2
    with pytest.raises(KeyError):
        snap.request("zz")
    blk = {v.block_id: v for v in snap.blocks}
    assert blk[0].is_null and blk[0].ref_cnt == 0 and blk[0].queue_pos is None
    h = vllm_chain(SHARED, 4)
    assert blk[1].ref_cnt == 2 and blk[1].owners == ("a", "b")
    assert blk[1].block_hash == h[0].hex() and blk[1].parent_hash is None and blk[1].group == 0
    assert blk[2].parent_hash == h[0].hex() and blk[2].token_ids == (4, 5, 6, 7)
    assert blk[3].block_hash is None and blk[3].owners == ("a",)
    # A partial block shows the tokens written so far (a's first output was computed in step 2).
    assert blk[3].token_ids == (8, 9, a.output_token_ids[0])
    assert blk[5].queue_pos == 0 and blk[5].owners == () and blk[5].token_ids == ()
    assert snap.free_queue[:3] == (5, 6, 7) and len(snap.free_queue) == snap.num_free_blocks == 11
    assert all(blk[bid].queue_pos == i for i, bid in enumerate(snap.free_queue))
    assert snap.hash_map[f"{h[0].hex()}@0"] == (1,)
    assert snap.usage == pytest.approx(4 / 15)
    assert snap.prefix_cache["requests"] == 2 and snap.prefix_cache["hits"] == 8
    assert snap.groups == ({"kind": "full", "sliding_window": None},)


def test_sliding_window_null_slots_show_in_the_snapshot():
    eng = make_engine(
        [spec("a", list(range(9)), max_tokens=4)], block_size=2, num_gpu_blocks=12, sliding_window=4
    )
    recs = eng.run()
    tables = [
        r.snapshot.request("a").block_tables[0]
        for r in recs
        if r.snapshot.request("a").block_tables[0]
    ]
    assert tables[-1][:3] == (0, 0, 0)
    skipped = events_of(recs, events.WINDOW_SKIPPED, "a")
    assert skipped and all(e.slots for e in skipped)
    assert recs[0].snapshot.groups == ({"kind": "sliding", "sliding_window": 4},)


def test_events_carry_their_reasons_as_typed_fields():
    eng = make_engine(
        [spec("A", list(range(8)), max_tokens=6), spec("B", list(range(20, 28)), max_tokens=6)],
        num_gpu_blocks=6,
    )
    recs = eng.run()
    for rec in recs:
        json.dumps([e.to_dict() for e in rec.events])
        assert all(e.kind in events.EVENT_KINDS for e in rec.events)
    pre = events_of(recs, events.PREEMPTED)[0]
    assert isinstance(pre, events.Preempted) and pre.request_id == "B" and pre.needed_by == "B"
    ev = events_of(recs, events.EVICTED)[0]
    assert ev.reason == "reused from queue head" and len(ev.block_hash) == 64
    fin = events_of(recs, events.FINISHED)
    assert {e.request_id: e.reason for e in fin} == {"A": "length", "B": "length"}
    freed = events_of(recs, events.FREED, "B")[0]
    assert freed.reason == "preempted" and freed.block_ids == (4, 3) and freed.group == 0
    arrived = events_of(recs, events.ARRIVED)
    assert [e.request_id for e in arrived] == ["A", "B"]
    sampled = events_of(recs, events.SAMPLED)
    assert sampled and sampled[0].request_id is None and set(sampled[0].tokens) == {"A", "B"}


def test_recorder_collects_and_drains():
    rec = Recorder()
    a = events.Allocated(request_id="r1", block_ids=(3,), group=1, queue_positions=(0,))
    f = events.Freed(request_id="r2", block_ids=(3,), group=0, to_head=(3,), reason="finished")
    rec.emit(a)
    rec.emit(f)
    assert rec.drain() == [a, f]
    assert rec.drain() == []


def test_same_scenario_same_trace():
    def run():
        eng = make_engine(
            [
                spec("A", list(range(8)), max_tokens=6),
                spec("B", list(range(20, 28)), max_tokens=6),
                spec("C", list(range(8)), max_tokens=3, arrival_step=2, cache_salt="s"),
            ],
            num_gpu_blocks=7,
            hash_algo="xxhash",
        )
        return json.dumps([r.to_dict() for r in eng.run()]), eng.outputs()

    assert run() == run()


def test_snapshot_with_caching_off():
    eng = make_engine(
        [spec("a", SHARED, max_tokens=2), spec("b", SHARED, max_tokens=2)],
        enable_prefix_caching=False,
    )
    recs = eng.run()
    assert not events_of(recs, events.CACHE_HIT) and not events_of(recs, events.CACHED)
    assert all(b.block_hash is None for r in recs for b in r.snapshot.blocks)
    assert recs[0].snapshot.hash_map == {}


# -- trace files: the CLI's JSONL, read back ---------------------------------------------
def engine_trace(**kw):
    """A small run as a trace file written with the CLI's own line writers; (text, engine,
    initial)."""
    from paged_kv_lab.run.scenario import scenario_to_dict

    eng = make_engine(
        [
            spec("A", list(range(8)), max_tokens=5),
            spec("B", list(range(20, 28)), max_tokens=4, arrival_step=2),
        ],
        num_gpu_blocks=6,
        **kw,
    )
    initial = eng.snapshot()
    lines = [trace.header_line(scenario_to_dict(eng.scenario), initial)]
    lines += [trace.step_line(r) for r in eng.run()]
    lines.append(trace.outputs_line(eng.outputs()))
    return "\n".join(lines) + "\n", eng, initial


def test_trace_file_round_trip():
    from paged_kv_lab.run.scenario import scenario_to_dict

    text, eng, initial = engine_trace()
    t = trace.read_trace(text)
    assert t.initial == initial and t.initial.step == 0
    assert t.records == tuple(eng.history) and [r.step for r in t.records] == list(
        range(1, len(eng.history) + 1)
    )
    assert t.scenario == scenario_to_dict(eng.scenario) and t.outputs == eng.outputs()
    assert t.to_jsonl() == text, "Trace writes exactly what the CLI writes"
    assert trace.read_trace(text.encode()) == t
    assert trace.read_trace("\n\n" + text.replace("\n", "\n\n")) == t, "blank lines are skipped"


def test_trace_without_header_or_outputs():
    text, eng, _ = engine_trace()
    lines = text.splitlines()
    old = trace.read_trace("\n".join(lines[1:]))  # written before traces had a header
    assert old.initial is None and old.scenario is None and old.records == tuple(eng.history)
    cut = trace.read_trace("\n".join(lines[:-1]))  # cut short: no outputs line
    assert cut.outputs is None and cut.initial is not None and cut.records == tuple(eng.history)
    only_header = trace.read_trace(lines[0])  # a scenario without requests: nothing stepped
    assert only_header.records == () and only_header.initial is not None


def _edit(i, fn):
    """A mutation of line i (parsed), for the table below."""

    def apply(lines):
        d = json.loads(lines[i])
        fn(d)
        return lines[:i] + [json.dumps(d)] + lines[i + 1 :]

    return apply


BAD_TRACES = [
    (lambda lines: [], "empty file"),
    (lambda lines: ["   ", ""], "empty file"),
    (lambda lines: lines[:2] + ["{not json"] + lines[2:], "line 3: not JSON: "),
    (lambda lines: ["[1, 2]"] + lines[1:], "line 1: not a JSON object"),
    (_edit(3, lambda d: d.pop("snapshot")), "line 4: step record missing 'snapshot'"),
    (lambda lines: lines[:3] + lines[4:], "line 4: step 4 after step 2: steps must be 1, 2, 3..."),
    (lambda lines: lines[2:], "line 1: step 2 first: steps must be 1, 2, 3..."),
    (
        lambda lines: lines[1:3] + lines[:1] + lines[3:],
        "line 3: a header (scenario + snapshot) must be the first",
    ),
    (lambda lines: lines + [lines[1]], "nothing may follow the outputs line"),
    (
        _edit(2, lambda d: d["snapshot"]["blocks"][2].update(ref_cnt="x")),
        'line 3: step record: snapshot.blocks[2].ref_cnt: Input should be a valid integer, got "x"',
    ),
    (
        _edit(2, lambda d: d["snapshot"]["blocks"][2].pop("token_ids")),
        "line 3: step record: snapshot.blocks[2]: missing key 'token_ids'",
    ),
    (
        _edit(2, lambda d: d["snapshot"]["blocks"].append(5)),
        "line 3: step record: snapshot.blocks[6]: Input should be",
    ),
    (
        _edit(2, lambda d: d["snapshot"].update(free_queue=[1, 99])),
        "line 3: snapshot: block ids [99] outside the pool",
    ),
    (_edit(2, lambda d: d["snapshot"].update(step=7)), "line 3: step 2 holds a snapshot of step 7"),
    (
        _edit(2, lambda d: d.update(events=[{"kind": "allocated", "block_ids": "ab"}])),
        'line 3: step record: events[0].block_ids: Input should be a valid array, got "ab"',
    ),
    (
        _edit(2, lambda d: d.update(events=[{"kind": "allocated", "block_ids": [1, "x"]}])),
        'line 3: step record: events[0].block_ids[1]: Input should be a valid integer, got "x"',
    ),
    (
        _edit(2, lambda d: d.update(events=[{"kind": "evicted", "block_ids": [1], "reason": "x"}])),
        "line 3: step record: events[0]: missing key 'block_hash'",
    ),
    (
        _edit(2, lambda d: d.update(events=[{"kind": "explosion"}])),
        "line 3: step record: events[0]: Input tag 'explosion'",
    ),
    (
        _edit(2, lambda d: d["events"][0].update(request_id=7)),
        "line 3: step record: events[0].request_id: Input should be a valid string, got 7",
    ),
    (
        _edit(2, lambda d: d["scheduled"].update(A="x")),
        "line 3: step record: scheduled.A: Input should be a valid integer",
    ),
    # int or float: one line, both said
    (
        _edit(2, lambda d: d["snapshot"]["prefix_cache"].update(hits="x")),
        "snapshot.prefix_cache.hits: Input should be a valid "
        'integer, got "x" or Input should be a valid number',
    ),
    (
        _edit(2, lambda d: d["snapshot"]["blocks"][1].update(ref_cnt=1.0)),  # no coercion
        "snapshot.blocks[1].ref_cnt: Input should be a valid integer, got 1.0",
    ),
    (
        _edit(0, lambda d: d["scenario"]["engine"].update(block_size=0)),
        "line 1: header scenario: engine.block_size",
    ),
    (_edit(0, lambda d: d.update(scenario=[1])), "line 1: header scenario: not a JSON object"),
    (_edit(0, lambda d: d.pop("scenario")), "line 1: header missing 'scenario'"),
    (
        _edit(0, lambda d: d["snapshot"].update(step=3)),
        "line 1: header snapshot is of step 3; it must be 0",
    ),
    (_edit(-1, lambda d: d.update(outputs={"A": {"text": 1}})), "outputs must map request ids"),
    (lambda lines: lines[:2] + ['{"colour": 1}'] + lines[2:], "line 3: not a trace line"),
    (lambda lines: lines[-1:], "no header and no step records: nothing to show"),
    (
        lambda lines: ['{"engine": {"block_size": 4}, "requests": []}'],
        "this looks like a scenario file, not a trace",
    ),
]


@pytest.mark.parametrize("mutate, needle", BAD_TRACES, ids=[n[:40] for _, n in BAD_TRACES])
def test_bad_traces_say_what_and_where(mutate, needle):
    text, _, _ = engine_trace()
    bad = "\n".join(mutate(text.splitlines()))
    with pytest.raises(trace.TraceError) as err:
        trace.read_trace(bad)
    assert any(needle in p for p in err.value.problems), err.value.problems
    assert isinstance(err.value, ValueError) and needle in str(err.value)


def test_bad_bytes_and_too_many_problems():
    with pytest.raises(trace.TraceError, match="not UTF-8"):
        trace.read_trace(b"\xff\xfe{}")
    with pytest.raises(trace.TraceError) as err:
        trace.read_trace("\n".join(["{x"] * 50))
    assert (
        len(err.value.problems) == trace.MAX_PROBLEMS + 1
        and "more problems" in err.value.problems[-1]
    )


def _paths(d, path=()):
    """Every (path, value) inside nested dicts/lists."""
    yield path, d
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items:
        yield from _paths(v, path + (k,))


def test_any_wrong_value_is_a_trace_error_never_a_crash():
    """Replace every value of a header and a step line, one at a time, by values of the wrong kind:
    the reader either accepts the file or raises TraceError (no KeyError, TypeError, ...)."""
    text, _, _ = engine_trace(block_size=4)
    lines = text.splitlines()
    lines = lines[:3] + lines[-1:]  # header, steps 1 and 2, outputs: every kind of line, kept short
    for i in (0, 2, 3):
        base = json.loads(lines[i])
        for path, _ in list(_paths(base))[1:]:
            for wrong in (None, -1, "x", [None], {"k": None}):
                d = json.loads(lines[i])
                target = d
                for k in path[:-1]:
                    target = target[k]
                target[path[-1]] = wrong
                try:
                    trace.read_trace("\n".join(lines[:i] + [json.dumps(d)] + lines[i + 1 :]))
                except trace.TraceError:
                    pass


OLD_TRACE = FIXTURES / "trace_before_typed_events.jsonl"
RENAMED = {
    "scheduled": {"kind": "phase"},
    "evicted": {"hash": "block_hash"},
    "cached": {"hashes": "block_hashes"},
}


def test_traces_written_before_events_were_typed_still_read():
    """A trace the CLI wrote before events were typed (each event {"kind", "request_id",
    "block_ids", "group", "data": {...}}; 7 steps of a hybrid run, cut before the outputs) reads
    into typed events holding the same values."""
    text = OLD_TRACE.read_text()
    old = [json.loads(line) for line in text.splitlines()][1:]
    assert all("data" in e for d in old for e in d["events"]), "the fixture is in the old shape"
    t = trace.read_trace(text)
    assert len(t.records) == 7 and t.outputs is None and t.initial is not None
    assert {e.kind for r in t.records for e in r.events} == set(events.EVENT_KINDS) - {
        events.RESET,
        events.DRAFT_PROPOSED,
        events.DRAFT_ACCEPTED,
        events.DRAFT_REJECTED,
        events.CPU_HIT,
        events.CPU_LOAD,
        events.CPU_LOADED,
        events.CPU_STORED,
        events.CPU_EVICTED,
        events.KV_LOAD_FAILED,
        events.CACHED_PARTIAL,
        events.COPIED,
        events.CACHE_AWARE_REORDER,
    }
    for rec, d in zip(t.records, old):
        assert len(rec.events) == len(d["events"])
        for e, od in zip(rec.events, d["events"]):
            assert type(e) is events.EVENT_TYPES[od["kind"]]
            new = e.to_dict()
            assert (new["request_id"], new["block_ids"], new["group"]) == (
                od["request_id"],
                od["block_ids"],
                od["group"],
            )
            for key, value in od["data"].items():
                if (od["kind"], key) in (("preempted", "reason"), ("sampled", "sampled_ids")):
                    continue
                assert new[RENAMED.get(od["kind"], {}).get(key, key)] == value, (od, new)
    pre = next(e for r in t.records for e in r.events if e.kind == events.PREEMPTED)
    assert pre.request_id == "B" and pre.needed_by == "A"
    # and it can be written again in today's shape, and read back to the same records
    again = trace.read_trace(t.to_jsonl())
    assert again.records == t.records
