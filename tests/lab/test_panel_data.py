"""The data the player's requests table and charts over steps are drawn from (player.js drawPanels):
at every step it equals an independent engine's record and snapshot, for lessons on the tiny
model. The payload is checked to be the encoding of those snapshots; the browser's decoding of it
is tests/browser/test_browser_decoder.py, the drawing itself tests/browser/test_browser.py."""

import pytest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.player import WIRE, delta, run_payload, snapshot_dict
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.store.timeline import lesson_scenario
from paged_kv_lab.text.i18n import tr
from paged_kv_lab.ui.panels import player_panels


class _Run:  # what player_panels reads: the scenario
    def __init__(self, scenario):
        self.scenario = scenario


def payload_and_truth(lesson_id, model, lang="en"):
    lesson = BY_ID[lesson_id]
    scenario = lesson_scenario(lesson, model.num_layers, model="tiny-random", device="cpu")
    engine = Engine(scenario, model=model)
    initial, records = engine.snapshot(), engine.run(max_steps=400)
    meta = player_panels(("requests", "metrics", *lesson.panels), _Run(scenario), lang)
    payload = run_payload(
        initial, records, lang=lang, meta=meta, request_ids=[r.id for r in scenario.requests]
    )
    other = Engine(scenario, model=model)  # stepped on its own: the truth
    truth_snaps = [other.snapshot()]
    truth_recs = []
    while other.has_unfinished() and len(truth_recs) < 400:
        truth_recs.append(other.step())
        truth_snaps.append(truth_recs[-1].snapshot)
    # what the browser decodes: the payload is these snapshots, the first whole, then as deltas
    snaps = [snapshot_dict(s) for s in truth_snaps]
    assert payload["head"]["initial"] == snaps[0] and len(payload["steps"]) == len(snaps) - 1
    state = set(WIRE["snapshot"].values()) | {WIRE["step"]["request_order"]}
    for st, prev, cur in zip(payload["steps"], snaps, snaps[1:]):
        assert {k: v for k, v in st.items() if k in state} == delta(prev, cur)
    return scenario, payload, snaps, truth_recs, truth_snaps


def held(req, nulls):
    """What the held chart plots for a request: its distinct non-null blocks (player.js
    drawHeld)."""
    return len({b for t in req["bt"] for b in t if b not in nulls})


@pytest.mark.parametrize("lesson_id", ["batching", "sliding", "preemption"])
def test_requests_table_and_over_time_follow_the_engine(lesson_id, tiny_model):
    _, payload, snaps, _, truth = payload_and_truth(lesson_id, tiny_model)
    for got, snap in zip(snaps, truth):
        # requests table: id, status, prompt, output, computed, cached (hit), preempted, priority
        assert [
            (r["id"], r["st"], r["np"], r["no"], r["nc"], r["nk"], r["pe"], r["pri"])
            for r in got["reqs"]
        ] == [
            (
                r.request_id,
                r.status,
                r.num_prompt_tokens,
                r.num_output_tokens,
                r.num_computed_tokens,
                r.num_cached_tokens,
                r.num_preemptions,
                r.priority,
            )
            for r in snap.requests
        ], snap.step
        # over time: usage and prefix hit rate (lines), running / waiting (bars)
        assert (
            got["step"],
            got["usage"],
            got["pc"].get("hit_rate", 0.0),
            len(got["run"]),
            len(got["wait"]),
        ) == (
            snap.step,
            snap.usage,
            snap.prefix_cache.get("hit_rate", 0.0),
            len(snap.running),
            len(snap.waiting),
        )
    if lesson_id == "preemption":
        assert any(r["pe"] for r in snaps[-1]["reqs"]), "the table has a preempted request to show"


def test_budget_bars_are_what_the_scheduler_gave(tiny_model):
    scenario, payload, _, recs, _ = payload_and_truth("batching", tiny_model)
    budget = scenario.engine.max_num_batched_tokens
    assert payload["head"]["budget"] == budget and payload["head"]["panels"] == [
        "requests",
        "metrics",
        "budget",
    ]
    for st, rec in zip(payload["steps"], recs, strict=True):
        assert st["sched"] == rec.scheduled, rec.step
        assert st["ph"] == {e.request_id: e.phase for e in rec.events if e.kind == "scheduled"}, (
            rec.step
        )
        assert set(st["ph"]) == set(st["sched"]) and sum(st["sched"].values()) <= budget
    phases = {p for st in payload["steps"] for p in st["ph"].values()}
    assert {"chunk", "decode"} <= phases, (
        "the lesson shows chunked prefill (striped) and decode (solid) bars"
    )
    assert any(sum(st["sched"].values()) == budget for st in payload["steps"]), (
        "some step fills the budget"
    )


def test_blocks_held_are_the_block_tables_without_the_null_block(tiny_model):
    _, payload, snaps, _, truth = payload_and_truth("sliding", tiny_model)
    assert payload["head"]["panels"] == ["requests", "metrics", "held"]
    nulls = {b["i"] for b in snaps[0]["blocks"] if b["z"]}
    assert nulls == {b.block_id for b in truth[0].blocks if b.is_null}
    for got, snap in zip(snaps, truth):
        assert {r["id"]: held(r, nulls) for r in got["reqs"]} == {
            r.request_id: len({b for t in r.block_tables for b in t if not snap.blocks[b].is_null})
            for r in snap.requests
        }, snap.step
    # under a sliding window a long request's tables grow while what it holds stays bounded
    longest = max((len(t), held(r, nulls)) for s in snaps for r in s["reqs"] for t in r["bt"])
    assert longest[1] < longest[0], longest


def test_panel_words_in_both_languages(tiny_model):
    for lang in ("en", "zh"):
        head = payload_and_truth("batching", tiny_model, lang)[1]["head"]
        assert head["words"]["req_cols"] == list(tr("req_table_cols", lang))
        assert (head["words"]["budget"], head["words"]["over_time"]) == (
            tr("budget", lang),
            tr("metrics", lang),
        )
