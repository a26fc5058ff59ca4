"""The CPU tier (vLLM 0.33's SimpleCPUOffloadConnector): what is stored and when, the CPU pool's own
free queue, a GPU miss found in the CPU pool, the load into newly allocated GPU blocks, the
scheduler's accounting of those tokens, the KV events with medium "CPU", and real copies of K/V
whose outputs stay equal to transformers' generate."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcore.distributed.kv_events import BlockRemoved, BlockStored
from kvcore.request import RequestStatus
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import CPUOffloadConfig, EngineSettings, RequestSpec, Scenario
from support.kv import events_of, make_engine, spec, table
from support.models import TIER_P, eos_of, reference_tokens
from support.paths import ROOT

CPU = CPUOffloadConfig(num_cpu_blocks=12)


def evict_then_return(cpu=CPU, **kw):
    """A fills the pool, B evicts A's blocks from the GPU, C asks for A's prompt again."""
    return make_engine(
        [
            spec("A", range(16), max_tokens=3),
            spec("B", range(100, 116), max_tokens=3, arrival_step=4),
            spec("C", range(16), max_tokens=3, arrival_step=8),
        ],
        block_size=4,
        num_gpu_blocks=7,
        cpu_offload=cpu,
        **kw,
    )


def manager(eng):
    return eng.kv_connector.scheduler_manager


def cpu_cached_ids(eng):
    return {b.block_id for b in manager(eng).cpu_block_pool.blocks if b.block_hash is not None}


def test_eager_mode_stores_confirmed_blocks_a_step_later_and_pins_them_meanwhile():
    eng = evict_then_return()
    first = eng.step()  # A's prefill: nothing is confirmed computed yet
    assert not events_of(first, "cpu_stored")
    second = eng.step()  # A's first decode: its 4 prompt blocks are confirmed and stored
    (stored,) = events_of(second, "cpu_stored")
    assert stored.block_ids == tuple(table(eng, "A")[:4]) and stored.mode == "eager"
    assert stored.req_ids == ("A",) and len(set(stored.cpu_block_ids)) == 4
    # the copy pinned each GPU block (touch) and released it once done (free, still used by A)
    touched = [e for e in second.events if e.kind == "touched" and e.request_id is None]
    assert touched and touched[0].block_ids == stored.block_ids
    assert cpu_cached_ids(eng) == set(stored.cpu_block_ids)
    cpu_queue = manager(eng).cpu_block_pool.free_block_queue.get_all_free_blocks()
    assert [b.block_id for b in cpu_queue][-4:] == list(stored.cpu_block_ids)  # cached: the tail
    media = {(type(ev).__name__, ev.medium) for ev in second.kv_events}
    assert ("BlockStored", "CPU") in media


def test_blocks_evicted_from_the_gpu_survive_on_the_cpu_and_come_back():
    eng = evict_then_return()
    recs = eng.run()
    a_hashes = set(events_of(recs, "cpu_stored")[0].block_hashes)
    evicted = {e.block_hash for e in events_of(recs, "evicted")}
    assert a_hashes & evicted, "B's blocks evict some of A's from the GPU pool"
    (hit,) = events_of(recs, "cache_hit", "C")
    (cpu_hit,) = events_of(recs, "cpu_hit", "C")
    # the GPU hit stops at the first evicted block; the CPU tier continues it, one token short
    assert (hit.num_tokens, cpu_hit.num_local_tokens, cpu_hit.num_tokens) == (4, 4, 8)
    (load,) = events_of(recs, "cpu_load", "C")
    assert load.cpu_block_ids == cpu_hit.block_ids
    step_of = {id(e): r.step for r in recs for e in r.events}
    (loaded,) = events_of(recs, "cpu_loaded", "C")
    (admitted,) = events_of(recs, "admitted", "C")
    assert step_of[id(loaded)] == step_of[id(load)] + 1  # the load took one step
    assert admitted.num_cached_tokens == 12 and step_of[id(admitted)] == step_of[id(loaded)]
    (sched,) = [e for e in events_of(recs, "scheduled", "C") if e.phase == "prefill"]
    assert (sched.start, sched.num_tokens) == (12, 4)
    # the loaded GPU blocks now carry A's hashes in the GPU prefix cache
    loaded_blocks = [eng.kv_cache_manager.block_pool.blocks[b] for b in load.block_ids]
    assert all(b.block_hash is not None for b in loaded_blocks)
    stats = eng.scheduler.connector_prefix_cache_stats
    assert (stats.queries, stats.hits) == (16 + 16 + (16 - 4), 8)  # tokens past each GPU hit
    # every pin is gone: only the null block is held in the CPU pool
    cpu_pool = manager(eng).cpu_block_pool
    assert cpu_pool.get_num_free_blocks() == cpu_pool.num_gpu_blocks - 1


def test_the_request_waits_for_remote_kvs_for_one_step():
    eng = evict_then_return()
    while not events_of(eng.step(), "cpu_load"):
        pass
    assert eng.requests["C"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert eng.requests["C"].num_computed_tokens == 12
    rec = eng.step()
    assert rec.scheduled.get("C") == 4
    assert eng.requests["C"].status == RequestStatus.RUNNING


def test_lazy_mode_stores_only_the_blocks_near_the_gpu_queue_head():
    eng = evict_then_return(cpu=CPUOffloadConfig(num_cpu_blocks=12, lazy_offload=True))
    recs = eng.run()
    stores = events_of(recs, "cpu_stored")
    assert stores and all(e.mode == "lazy" and e.req_ids == () for e in stores)
    step_of = {id(e): r.step for r in recs for e in r.events}
    (a_done,) = events_of(recs, "finished", "A")
    # nothing is stored while A holds its blocks: only free, hashed blocks are candidates
    assert step_of[id(stores[0])] > step_of[id(a_done)]
    assert events_of(recs, "cpu_hit", "C")


def test_a_full_cpu_pool_evicts_its_own_lru_blocks():
    eng = evict_then_return(cpu=CPUOffloadConfig(num_cpu_blocks=5))  # 4 usable CPU blocks
    recs = eng.run()
    cpu_evicted = events_of(recs, "cpu_evicted")
    assert cpu_evicted, "B's blocks push A's out of the CPU pool"
    a_hashes = set(events_of(recs, "cpu_stored")[0].block_hashes)
    assert {e.block_hash for e in cpu_evicted[:4]} == a_hashes  # the LRU ones: all of A's
    removed = [ev for r in recs for ev in r.kv_events if isinstance(ev, BlockRemoved)]
    assert any(ev.medium == "CPU" for ev in removed)
    assert not events_of(recs, "cpu_hit", "C")  # A's prompt is gone from both tiers


def test_a_cpu_eviction_says_whether_the_gpu_still_caches_the_prefix():
    """Lesson 10 (issue #31): the CPU pool's get_new_blocks evicts only the CPU copy, and the GPU
    original, freed by _process_store_completion with its hash, may still be cached. The moment
    said is read from the step's GPU pool, and this run has both outcomes."""
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.content.catalog import gpu_copies, moment_matches, narration_fields
    from paged_kv_lab.text.i18n import tr

    eng = evict_then_return(cpu=CPUOffloadConfig(num_cpu_blocks=5))
    recs = eng.run()
    cached, gone = [m for m in BY_ID["secondtier"].moments if m.kind == "cpu_evicted"]
    seen = set()
    for rec in recs:
        for e in events_of(rec, "cpu_evicted"):
            gpu = gpu_copies(e, rec)
            holders = [b.block_id for b in rec.snapshot.blocks if b.block_hash == e.block_hash]
            assert sorted(gpu) == sorted(holders)
            assert moment_matches(cached, e, rec) == bool(gpu) != moment_matches(gone, e, rec)
            said = tr(cached.text if gpu else gone.text, "en").format_map(narration_fields(e, rec))
            if gpu:
                assert f"in block [{', '.join(map(str, gpu))}]" in said, said
            else:
                assert "in neither tier" in said, said
            seen.add(bool(gpu))
    assert seen == {True, False}


def test_an_asynchronous_load_gets_no_lookahead_slots():
    """vLLM's Scheduler.schedule sets effective_lookahead_tokens to 0 for an admission whose KV
    loads asynchronously (no forward runs for it in that step): C's blocks cover its loaded
    tokens only, although the scheduler reserves 3 lookahead slots elsewhere."""
    import dataclasses

    eng = evict_then_return()
    eng.scheduler.config = dataclasses.replace(eng.scheduler.config, num_lookahead_tokens=3)
    while not events_of(eng.step(), "cpu_load"):
        pass
    computed = eng.scheduler.requests["C"].num_computed_tokens
    assert computed > 0 and computed % 4 == 0
    assert len(table(eng, "C")) == computed // 4  # no block for the 3 lookahead slots


def test_aborting_a_request_that_waits_for_its_load_frees_everything():
    eng = evict_then_return()
    while not events_of(eng.step(), "cpu_load"):
        pass
    eng.scheduler.abort_request("C")
    eng.check_invariants()
    eng.run()
    pool = eng.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    cpu_pool = manager(eng).cpu_block_pool
    assert cpu_pool.get_num_free_blocks() == cpu_pool.num_gpu_blocks - 1


def test_cpu_events_carry_the_tokens_and_parent_of_each_stored_block():
    eng = evict_then_return()
    recs = eng.run()
    cpu_stored = [
        ev for r in recs for ev in r.kv_events if isinstance(ev, BlockStored) and ev.medium == "CPU"
    ]
    gpu_stored = [
        ev for r in recs for ev in r.kv_events if isinstance(ev, BlockStored) and ev.medium == "GPU"
    ]
    # A's first GPU event lists its 4 prompt blocks; the CPU tier stores them one event each
    first_gpu = gpu_stored[0]
    assert [ev.block_hashes[0] for ev in cpu_stored[:4]] == first_gpu.block_hashes
    assert [t for ev in cpu_stored[:4] for t in ev.token_ids] == first_gpu.token_ids
    assert cpu_stored[0].parent_block_hash is None
    assert cpu_stored[1].parent_block_hash == first_gpu.block_hashes[0]


@pytest.mark.parametrize(
    "engine, problem",
    [
        ({"sliding_window": 8}, "full-attention layers only"),
        ({"enable_prefix_caching": False}, "enable_prefix_caching"),
    ],
)
def test_settings_it_cannot_serve_are_refused_by_name(engine, problem):
    with pytest.raises(ValueError, match=problem):
        make_engine([spec("A", range(8))], cpu_offload=CPU, **engine)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompts=st.lists(st.integers(0, 3), min_size=2, max_size=7),
    lengths=st.lists(st.integers(3, 14), min_size=7, max_size=7),
    num_cpu_blocks=st.integers(2, 10),
    lazy=st.booleans(),
    max_num_seqs=st.integers(1, 3),
)
def test_random_traces_keep_both_pools_consistent(
    prompts, lengths, num_cpu_blocks, lazy, max_num_seqs
):
    """Requests drawn from 4 shared prefixes, a GPU pool that evicts and preempts: the
    invariants hold after every step (debug), and at the end nothing is pinned in either pool."""
    reqs = [
        spec(f"R{i}", [p * 50 + t for t in range(lengths[i])], max_tokens=3, arrival_step=i)
        for i, p in enumerate(prompts)
    ]
    eng = make_engine(
        reqs,
        block_size=2,
        num_gpu_blocks=12,
        max_num_seqs=max_num_seqs,
        cpu_offload=CPUOffloadConfig(num_cpu_blocks=num_cpu_blocks, lazy_offload=lazy),
    )
    recs = eng.run(max_steps=400)
    assert not eng.has_unfinished()
    pool = eng.kv_cache_manager.block_pool
    cpu_pool = manager(eng).cpu_block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
    assert cpu_pool.get_num_free_blocks() == cpu_pool.num_gpu_blocks - 1
    for b in cpu_pool.blocks[1:]:
        if b.block_hash is not None:
            assert cpu_pool.cached_block_hash_to_block.contain(b.block_hash, b.block_id)
    for load in events_of(recs, "cpu_load"):
        assert len(load.block_ids) == len(load.cpu_block_ids) == load.num_tokens // 2


# -- real copies on the model ---------------------------------------------------------------
P = TIER_P


@pytest.mark.usefixtures("one_torch_thread")
def test_outputs_equal_transformers_when_a_prefix_comes_back_from_the_cpu(loaded):
    """A and C share 16 tokens; B evicts A's blocks from a 7-block GPU pool in between. C's
    prefix comes back from the CPU tier as real K/V copies, and every output equals generate."""
    reqs = [
        RequestSpec(id="A", prompt_token_ids=tuple(P[:17]), max_tokens=4),
        RequestSpec(id="B", prompt_token_ids=tuple(P[::-1][:17]), max_tokens=4, arrival_step=6),
        RequestSpec(id="C", prompt_token_ids=tuple(P[:16] + [5, 6]), max_tokens=4, arrival_step=12),
    ]
    sc = Scenario(
        model=loaded.name,
        device=loaded.device.type,
        engine=EngineSettings(block_size=4, num_gpu_blocks=7, cpu_offload=CPU),
        requests=tuple(reqs),
    )
    eng = Engine(sc, model=loaded, debug=True)
    recs = eng.run()
    (cpu_hit,) = events_of(recs, "cpu_hit", "C")
    assert cpu_hit.num_tokens >= 8, "most of C's prefix comes from the CPU tier"
    worker = eng.engine_core.kv_connector.worker_handler
    assert worker.num_blocks_loaded == len(cpu_hit.block_ids) and worker.num_blocks_stored > 0
    outs = eng.outputs()
    for r in reqs:
        # transformers' generate, stopping at EOS as the engine does
        want = reference_tokens(
            loaded.model, list(r.prompt_token_ids), r.max_tokens, eos_of(loaded)
        )
        assert outs[r.id]["token_ids"] == want, f"request {r.id} differs from transformers"


@pytest.mark.usefixtures("one_torch_thread")
def test_a_stored_block_holds_the_gpu_blocks_kv_in_every_layer(tiny_model):
    sc = Scenario(
        model=tiny_model.name,
        engine=EngineSettings(block_size=4, num_gpu_blocks=16, cpu_offload=CPU),
        requests=(RequestSpec(id="A", prompt_token_ids=tuple(P[:12]), max_tokens=3),),
    )
    eng = Engine(sc, model=tiny_model)
    eng.step()
    (stored,) = events_of(eng.step(), "cpu_stored")
    worker = eng.engine_core.kv_connector.worker_handler
    for layer, (gpu, cpu) in enumerate(zip(worker.gpu_kv_caches, worker.cpu_kv_caches)):
        for g, c in zip(stored.block_ids, stored.cpu_block_ids):
            assert torch.equal(gpu[g], cpu[c]), f"layer {layer}: GPU block {g} vs CPU block {c}"
            assert gpu[g].abs().sum() > 0


# -- a real server's CPU tier, watched --------------------------------------------------------
def test_kvcore_watch_sees_the_cpu_tier_next_to_the_gpu(tmp_path):
    """Our engine publishes vLLM's frames with the CPU tier on (as a vLLM server with
    SimpleCPUOffloadConnector does); the watcher keeps one index per medium and the step log
    names the CPU events."""
    import zmq

    from kvcore.config.kv_events import KVEventsConfig
    from paged_kv_lab.run.engine import NoModelRunner
    from paged_kv_lab.watch.prefix_index import describe_batch
    from paged_kv_lab.watch.watcher import KVEventWatcher
    from support.kv_pub import wait_for

    pub_ep, replay_ep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    ctx = zmq.Context()
    got = []
    w = KVEventWatcher(
        pub_ep,
        replay_ep,
        topic="kv-events",
        context=ctx,
        on_batch=lambda rank, seq, batch, replayed: got.append(batch),
    )
    cfg = KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=pub_ep,
        replay_endpoint=replay_ep,
        topic="kv-events",
    )
    eng = evict_then_return()
    eng = Engine(eng.scenario, runner=NoModelRunner(), kv_events=cfg)
    try:
        w.start()
        assert w.connected.wait(5)
        recs = eng.run()
        sent = sum(1 for r in recs if r.kv_events)
        assert wait_for(lambda: len(got) == sent)
        assert ("CPU", "0") in w.tiers(0) and ("GPU", "0") in w.tiers(0)
        cpu_cached = {
            b.block_hash for b in manager(eng).cpu_block_pool.blocks if b.block_hash is not None
        }
        assert len(w.entries(0, "CPU", "0")) == len(cpu_cached)
        lines = [describe_batch(0, i, b) for i, b in enumerate(got)]
        assert any("stored 1 on CPU in group 0" in line for line in lines)
    finally:
        w.stop()
        eng.close()
        ctx.destroy(linger=0)


# -- the command line and the lesson ------------------------------------------------------------
def test_the_command_line_sets_the_cpu_tier_and_refuses_a_bad_one(tmp_path, capsys):
    import json

    from support.cli import run_cli_here

    root = ROOT
    out = tmp_path / "trace.jsonl"
    base = ["run", "paged_kv_lab/content/examples/eviction.json", "--model", "tiny-random"]
    base += ["--device", "cpu"]
    r = run_cli_here(
        *base, "--cpu-offload-blocks", "16", "--lazy-offload", "--trace", str(out), "--check"
    )
    assert r.returncode == 0, r.stderr
    header = json.loads(out.read_text().splitlines()[0])
    assert header["scenario"]["engine"]["cpu_offload"] == {
        "num_cpu_blocks": 16,
        "lazy_offload": True,
        "kv_load_failure_policy": "fail",
        "fail_loads": [],
    }
    assert "stored GPU→CPU" in r.stdout
    from paged_kv_lab.cli.main import main

    assert (
        main(
            [
                "run",
                str(root / "paged_kv_lab/content/examples/eviction.json"),
                "--cpu-offload-blocks",
                "1",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "engine.cpu_offload.num_cpu_blocks" in err and "Traceback" not in err


@pytest.mark.usefixtures("one_torch_thread")
def test_the_lesson_splits_the_hits_by_tier_and_draws_the_cpu_pool(tiny_model):
    from kvcore.model import smollm2_available
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.content.tiers import tier_rows
    from paged_kv_lab.player import run_payload
    from paged_kv_lab.player.payload import WIRE
    from paged_kv_lab.store.timeline import lesson_run

    if not smollm2_available():
        pytest.skip("the lesson's token ids come from SmolLM2's tokenizer")
    run = lesson_run(BY_ID["secondtier"], tiny_model)
    run.run_to_end(timeout=300)
    rows = {r.request_id: r for r in tier_rows(run.records)}
    assert {k: r.case for k, r in rows.items()} == {
        "A": "miss",
        "B": "miss",
        "C": "gpu_hit",
        "D": "cpu_hit",
        "E": "miss",
    }
    d = rows["D"]
    assert d.gpu_hit_tokens == 0 and d.cpu_hit_tokens == 12 and d.ttft_steps == 2
    assert d.computed_tokens == d.num_prompt_tokens - 12 and d.ttft_ms > 0
    assert rows["C"].gpu_hit_tokens == 20 and rows["C"].ttft_steps == 1
    steps = run_payload(run.initial, run.records)["steps"]
    cpu = [s[WIRE["step"]["cpu_pool"]] for s in steps]
    assert all(c["num_blocks"] == 24 for c in cpu)
    assert any(any(h is not None for h in c["block_hashes"]) for c in cpu)


def test_the_life_of_a_block_names_the_cpu_tiers_pins():
    from paged_kv_lab.why.explain import RecordedSteps
    from paged_kv_lab.why.explain_blocks import life_of_block
    from paged_kv_lab.why.explain_text import life_sentences

    eng = evict_then_return()
    initial = eng.snapshot()
    recs = eng.run()
    (stored,) = events_of(recs[:2], "cpu_stored")
    run = RecordedSteps(initial, tuple(recs), eng.settings, None)
    for lang, words in (("en", "pinned by the CPU tier"), ("zh", "CPU 层钉住")):
        text = "\n".join(life_sentences(life_of_block(run, stored.block_ids[0]), lang))
        assert words in text and "None" not in text


@pytest.mark.parametrize("with_other", [False, True])
def test_a_request_no_pool_can_finish_is_aborted_between_lazy_stores(with_other):
    """12 prompt tokens and 4 answer tokens need 8 blocks of 2; the pool has 7. Preempted once its
    table cannot grow, the request is refused at every step while the lazy tier stores free
    blocks at almost every step: those copies must not hide that it never fits (it once waited
    for ever, every step a store)."""
    reqs = [spec("R1", list(range(12)), max_tokens=4, arrival_step=5 if with_other else 0)]
    if with_other:
        reqs.insert(0, spec("R0", list(range(100, 105)), max_tokens=3))
    eng = make_engine(
        reqs,
        block_size=2,
        num_gpu_blocks=8,
        max_num_seqs=2,
        cpu_offload=CPUOffloadConfig(num_cpu_blocks=3, lazy_offload=True),
    )
    recs = eng.run(max_steps=50)
    assert not eng.has_unfinished()
    assert [e.reason for e in events_of(recs, "blocked", "R1")][-1] == "never_fits"
    assert events_of(recs, "cpu_stored")  # the stores that hid it
