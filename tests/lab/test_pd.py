"""Prefill here, decode there: two replicas sharing one model, joined by the NIXL connector's flow
(kvcore/distributed/kv_transfer/kv_connector/v1/nixl/, paged_kv_lab/disagg/pd.py).

Greedy tokens equal transformers' generate with prefix hits on both replicas; the prefill
replica keeps a request's blocks until the decode replica has pulled them; the decode replica
waits in WAITING_FOR_REMOTE_KVS and caches the pulled blocks only once the pull landed; a failed
pull takes kv_load_failure_policy's path; the CLI runs a scenario this way. The prompts are the
Zen of Python (Tim Peters), which nobody here wrote.
"""

import json

import pytest

from paged_kv_lab.cli.main import main as cli_main
from paged_kv_lab.disagg.pd import DECODE, PREFILL, PDEngine, ttft_split
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario
from paged_kv_lab.run.trace_file import read_trace
from support.models import eos_of, reference_tokens, zen

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def scenario(loaded, requests, **engine) -> Scenario:
    settings = {"block_size": 8, "num_gpu_blocks": 40, "max_num_batched_tokens": 256, **engine}
    return Scenario(
        model=loaded.name,
        device=loaded.device.type,
        engine=EngineSettings(**settings),
        requests=tuple(requests),
    )


def events_of(steps, replica, kind, rid=None):
    return [
        (s.step, e)
        for s in steps
        if s.replica == replica
        for e in s.events
        if e.kind == kind and (rid is None or e.request_id == rid)
    ]


@pytest.fixture(scope="module")
def journey(tiny_model):
    """A and C first; B later, sharing A's first lines: a hit on both replicas."""
    reqs = [
        RequestSpec(id="A", prompt=zen(0, 4), max_tokens=6, ignore_eos=True),
        RequestSpec(id="C", prompt=zen(10, 12), max_tokens=5, ignore_eos=True, arrival_step=1),
        RequestSpec(id="B", prompt=zen(0, 3) + " " + zen(7, 8), max_tokens=6, arrival_step=6),
    ]
    sc = scenario(tiny_model, reqs)
    pd = PDEngine(sc, model=tiny_model, debug=True)
    steps = pd.run()
    return sc, pd, steps


def test_greedy_tokens_equal_generate_with_hits_on_both_replicas(journey, tiny_model):
    sc, pd, steps = journey
    outs = pd.outputs()
    assert list(outs) == ["A", "C", "B"]
    for spec in sc.requests:
        ids = pd.prefill.encode(spec)
        want = reference_tokens(tiny_model.model, ids, spec.max_tokens, eos_of(tiny_model))
        assert outs[spec.id]["token_ids"] == want, spec.id
    # B hits A's blocks on both replicas, and pulls only the blocks past the decode hit
    ((_, p_hit),) = events_of(steps, PREFILL, "cache_hit", "B")
    ((_, d_hit),) = events_of(steps, DECODE, "cache_hit", "B")
    assert p_hit.num_tokens > 0 and d_hit.num_tokens == p_hit.num_tokens
    (pull,) = [s.pulls["B"] for s in steps if "B" in s.pulls]
    remote, local = pull
    n_prompt = len(pd.prefill.encode(sc.requests[2]))
    assert len(local) == -(-n_prompt // 8) - d_hit.num_tokens // 8 == len(remote)
    pulled = sum(len(local) for s in steps for _, local in s.pulls.values())
    assert pd.decode_worker.num_blocks_pulled == pulled
    # both pools end empty of requests
    for e in pd.engines.values():
        assert not e.scheduler.requests and e.kv_cache_manager.usage == 0


def test_prefill_keeps_blocks_until_pulled_and_decode_caches_once_landed(journey):
    _, pd, steps = journey
    ((finish_step, _),) = events_of(steps, PREFILL, "finished", "A")
    (pull_step,) = [s.step for s in steps if "A" in s.pulls]
    frees = [n for n, e in events_of(steps, PREFILL, "freed", "A")]
    # the prefill replica finished A, yet its blocks go back only after the decode pull
    assert finish_step < pull_step < frees[0]
    pulled = next(s for s in steps if "A" in s.pulls)
    assert "A" in pulled.snapshot.waiting  # WAITING_FOR_REMOTE_KVS
    view = next(r for r in pulled.snapshot.requests if r.request_id == "A")
    assert view.status == "waiting_for_remote_kvs"
    # delayed caching: nothing of A is cached in the pull's step, only when the load landed
    assert not [e for e in pulled.events if e.kind == "cached" and e.request_id == "A"]
    ((landed_step, _),) = events_of(steps, DECODE, "cpu_loaded", "A")
    cached = [n for n, e in events_of(steps, DECODE, "cached", "A")]
    assert landed_step > pull_step and cached[0] == landed_step


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_failed_pull_takes_the_kv_load_failure_policy(tiny_model, policy):
    reqs = [RequestSpec(id="A", prompt=zen(4, 6), max_tokens=4, ignore_eos=True)]
    pd = PDEngine(
        scenario(tiny_model, reqs),
        model=tiny_model,
        debug=True,
        kv_load_failure_policy=policy,
        fail_loads=("A",),
        kv_lease_steps=2,
    )
    steps = pd.run()
    assert events_of(steps, DECODE, "kv_load_failed", "A")
    out = pd.outputs()["A"]
    if policy == "fail":
        assert out["finish_reason"] == "finished_error" and out["token_ids"] == []
    else:
        ids = pd.prefill.encode(reqs[0])
        assert out["token_ids"] == reference_tokens(tiny_model.model, ids, 4, eos_of(tiny_model))
    # nobody said the blocks were read: the prefill replica lets go when the lease ends
    assert events_of(steps, PREFILL, "freed", "A")
    for e in pd.engines.values():
        assert not e.scheduler.requests and e.kv_cache_manager.usage == 0


def test_cli_runs_a_scenario_as_a_pd_pair(tmp_path, capsys, tiny_model):
    reqs = [
        {"id": "A", "prompt": zen(0, 3), "max_tokens": 4},
        {"id": "B", "prompt": zen(0, 2), "max_tokens": 4, "arrival_step": 3},
    ]
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"model": "tiny-random", "device": "cpu", "requests": reqs}))
    assert cli_main(["run", str(f), "--quiet"]) == 0
    plain = capsys.readouterr().out
    trace = tmp_path / "t.jsonl"
    args = ["run", str(f), "--set", "kv_transfer=pd", "--trace", str(trace), "--check"]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "[prefill replica]" in out and "[decode replica]" in out and "pulled" in out
    # the prefill replica's finished request keeps its blocks for the pull; the decode one frees
    assert "keeps its blocks allocated until the decode replica has read them" in out
    assert "and frees its blocks" in out
    assert out[out.index("== outputs") :] == plain[plain.index("== outputs") :]
    t = read_trace(trace.read_text())
    assert t.scenario["engine"]["kv_transfer"] == "pd"
    assert set(t.outputs) == {"A", "B"}


def test_a_plain_engine_refuses_kv_transfer_pd(tiny_model):
    sc = scenario(tiny_model, [], kv_transfer="pd")
    with pytest.raises(ValueError, match="two replicas"):
        Engine(sc, model=tiny_model)


@pytest.mark.slow
def test_smollm2_pd_pair_equals_generate_with_hits_on_both_replicas(smollm2):
    reqs = [
        RequestSpec(id="A", prompt=zen(0, 5), max_tokens=8),
        RequestSpec(id="B", prompt=zen(0, 4) + " " + zen(12, 13), max_tokens=8, arrival_step=3),
    ]
    sc = scenario(smollm2, reqs, block_size=16)
    pd = PDEngine(sc, model=smollm2)
    steps = pd.run()
    assert events_of(steps, PREFILL, "cache_hit", "B") and events_of(
        steps, DECODE, "cache_hit", "B"
    )
    for spec in reqs:
        ids = pd.prefill.encode(spec)
        want = reference_tokens(smollm2.model, ids, spec.max_tokens, eos_of(smollm2))
        assert pd.outputs()[spec.id]["token_ids"] == want, spec.id
    # the one TTFT computation, from the records, as the page reads it
    split = {t.request_id: t for t in ttft_split(steps)}
    assert set(split) == {"A", "B"}
    assert split["A"].total_ms >= split["A"].prefill_ms > 0


def test_ttft_split_reads_the_parts_from_the_records(journey):
    """Each part is the measured seconds of the step the journey says: the prefill replica's
    step that finished the request, the decode replica's step that pulled it, the first decode
    token's step."""
    _, _, steps = journey
    split = {s.request_id: s for s in ttft_split(steps)}
    assert set(split) == {"A", "B", "C"}
    for rid, s in split.items():
        ((p, _),) = events_of(steps, PREFILL, "finished", rid)
        t = next(
            st.step
            for st in steps
            if st.replica == DECODE and rid in st.pulls  # the pull is ordered in that step
        )
        first = next(st.step for st in steps if st.replica == DECODE and rid in st.new_tokens)
        ms = {st.step: 1000 * st.seconds for st in steps}
        assert (s.prefill_ms, s.transfer_ms, s.first_decode_ms) == (ms[p], ms[t], ms[first])
        assert s.waiting_ms == pytest.approx(sum(ms[i] for i in range(t + 1, first)))


# -- the lesson (12): both pools, the replica, the transfer sentence, the switch, "why?" --------
@pytest.fixture(scope="module")
def lesson_runs(tiny_model):
    """Lesson 12's scenario on the tiny model, under each option of its failure switch, built as
    the page builds it (lesson switch -> scenario field -> engine_for): option -> (initial state,
    records, the run as the narrator reads it)."""
    from types import SimpleNamespace

    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.disagg.pd import engine_for
    from paged_kv_lab.run.scenario import load_scenario

    out = {}
    for option in ("none", "A:recompute", "A:fail"):
        d = BY_ID["pd"].scenario_dict(None, {"failed_load": option})
        sc = load_scenario({**d, "model": tiny_model.name, "device": tiny_model.device.type})
        run = engine_for(sc, model=tiny_model)
        initial = run.snapshot()
        records = run.run()
        out[option] = (initial, records, SimpleNamespace(records=records, scenario=sc))
    return out


def test_records_name_their_replica_and_pulls_and_the_trace_keeps_them(lesson_runs, tiny_model):
    from paged_kv_lab.run.scenario import scenario_to_dict
    from paged_kv_lab.run.trace_file import Trace

    initial, records, run = lesson_runs["none"]
    assert [r.step for r in records] == list(range(1, len(records) + 1))
    assert {r.replica for r in records} == {PREFILL, DECODE}
    assert all(not r.pulls for r in records if r.replica == PREFILL)
    text = Trace(scenario_to_dict(run.scenario), initial, tuple(records), None).to_jsonl()
    back = read_trace(text)
    assert [(r.replica, r.pulls) for r in back.records] == [(r.replica, r.pulls) for r in records]
    assert back.records == tuple(records)
    # one engine's records carry neither field, and write neither: its files stay as they were
    plain = Engine(scenario(tiny_model, [RequestSpec(id="X", prompt=zen(0, 1), max_tokens=2)]))
    rec = plain.step()
    assert rec.replica is None and rec.pulls == {}
    assert not {"replica", "pulls"} & set(rec.to_dict())


def test_both_pools_side_by_side_at_every_step(lesson_runs):
    """At each step: each side shows its own replica's latest snapshot up to the step, the
    step's pull marked on both sides with the other side's ids, the prefill blocks kept for a
    finished request, the decode blocks waiting uncached for their load."""
    from paged_kv_lab.disagg.pd import pair_at

    for option, (initial, records, _) in lesson_runs.items():
        for rec in records:
            view = pair_at(initial, records, rec.step)
            assert view.replica == rec.replica and view.pulls == rec.pulls
            for name in (PREFILL, DECODE):
                mine = [r for r in records if r.replica == name and r.step <= rec.step]
                snap = mine[-1].snapshot if mine else initial
                assert view.as_of[name] == (mine[-1].step if mine else 0)
                by_id = {b.block_id: b for b in snap.blocks if not b.is_null}
                assert [b.block_id for b in view.blocks[name]] == list(by_id)
                assert all(b.owners == by_id[b.block_id].owners for b in view.blocks[name])
            parts = {
                name: {b.block_id: (b.part, b.paired) for b in view.blocks[name]}
                for name in (PREFILL, DECODE)
            }
            pairs = [(p, d) for rp, rd in rec.pulls.values() for p, d in zip(rp, rd)]
            assert {b for b, (k, _) in parts[PREFILL].items() if k == "pull_from"} == {
                p for p, _ in pairs
            }
            assert {b for b, (k, _) in parts[DECODE].items() if k == "pull_into"} == {
                d for _, d in pairs
            }
            for p, d in pairs:
                assert parts[PREFILL][p] == ("pull_from", d)
                assert parts[DECODE][d] == ("pull_into", p)
            # kept: on the prefill side only, blocks of a finished request still holding them
            psnap = records[view.as_of[PREFILL] - 1].snapshot if view.as_of[PREFILL] else initial
            finished = {
                b
                for r in psnap.requests
                if r.status.startswith("finished")
                for t in r.block_tables
                for b in t
            }
            kept = {b for b, (k, _) in parts[PREFILL].items() if k == "kept"}
            assert kept == finished - {p for p, _ in pairs}
            assert not {k for k, _ in parts[DECODE].values()} & {"kept", "pull_from"}
            assert not {k for k, _ in parts[PREFILL].values()} & {"pull_into", "delayed", "failed"}
    # the journey: A's blocks kept at step 1, pulled at 2, delayed until its load lands
    initial, records, _ = lesson_runs["none"]
    (pull_step,) = [r.step for r in records if "A" in r.pulls]
    after = pair_at(initial, records, pull_step + 1)
    _, local = records[pull_step - 1].pulls["A"]
    assert {b.block_id for b in after.blocks[DECODE] if b.part == "delayed"} == set(local)
    assert any(b.part == "kept" for b in pair_at(initial, records, pull_step - 1).blocks[PREFILL])


def test_the_narration_names_the_replica_and_both_sides_of_the_pull(lesson_runs):
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.text.i18n import Text, tr
    from paged_kv_lab.ui.panels import LessonNarrator

    _, records, run = lesson_runs["none"]
    for lang in ("en", "zh"):
        narrate = LessonNarrator(BY_ID["pd"], run, lang)
        said = {r.step: narrate(r) for r in records}
        for r in records:
            replica = Text(f"pd.replica.{r.replica}")
            assert said[r.step][0] == tr("pd.step.by", lang, step=r.step, replica=replica)
        # each pull (A's whole prompt, B's blocks past its decode-side hit) is said at its step:
        # the prefill ids, then the decode ids (both templates name them in that order)
        pulls = [(r.step, rem, loc) for r in records for rem, loc in r.pulls.values()]
        assert len(pulls) == 2 and any(rem != loc for _, rem, loc in pulls)
        for step, remote, local in pulls:
            text = " ".join(said[step]).replace("\\", "")
            at = text.index(str(list(remote)))
            assert text.index(str(list(local)), at + (remote == local)) > at, (step, text)


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_the_failure_switch_fails_A_pull_under_its_policy(lesson_runs, policy):
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.disagg.pd import pair_at
    from paged_kv_lab.ui.panels import LessonNarrator

    initial, records, run = lesson_runs[f"A:{policy}"]
    assert run.scenario.engine.kv_transfer_config.kv_load_failure_policy == policy
    ((failed_step, ev),) = [
        (r.step, e) for r in records for e in r.events if e.kind == "kv_load_failed"
    ]
    assert records[failed_step - 1].replica == DECODE and ev.request_id == "A"
    assert "A" not in records[failed_step - 1].pulls
    view = pair_at(initial, records, failed_step)
    assert view.failed == {"A": tuple(ev.block_ids)}
    assert {b.block_id for b in view.blocks[DECODE] if b.part == "failed"} == set(ev.block_ids)
    narrate = LessonNarrator(BY_ID["pd"], run, "en")
    said = {r.step: narrate(r) for r in records}
    text = " ".join(said[failed_step])
    assert "**fails**" in text and f"“{policy}”" in text
    finished = [e for r in records if r.replica == DECODE for e in r.events if e.kind == "finished"]
    a_end = next(e for e in finished if e.request_id == "A")
    assert (a_end.reason == "error") == (policy == "fail")
    if policy == "fail":
        assert "FINISHED_ERROR" in " ".join(said[failed_step])
    # the prefill replica, told nothing, keeps A's blocks until the lease ends
    frees = [r.step for r in records if r.replica == PREFILL for e in r.events if e.kind == "freed"]
    a_free = [
        r.step
        for r in records
        if r.replica == PREFILL
        for e in r.events
        if e.kind == "freed" and e.request_id == "A"
    ]
    assert frees and a_free and a_free[0] > failed_step + 2


def test_why_answers_for_blocks_and_requests_of_either_replica(lesson_runs):
    from paged_kv_lab.text.i18n import tr
    from paged_kv_lab.why.explain import RecordedSteps
    from paged_kv_lab.why.explain_pd import explain_pd_block, explain_pd_request
    from paged_kv_lab.why.source_links import FUNCTIONS

    initial, records, run = lesson_runs["none"]
    (pull,) = [r for r in records if "A" in r.pulls]
    remote, local = pull.pulls["A"]

    def steps_upto(n):
        return RecordedSteps(initial, tuple(records[:n]), run.scenario.engine)

    # at the pull's step: prefill block -> kept for the transfer, read into its decode block
    a = explain_pd_block(steps_upto(pull.step), PREFILL, remote[0])
    assert [t.key for t in a.texts] == ["why.pd.kept", "why.pd.kept_read"]
    assert a.texts[1].fields["paired"] == local[0] and a.texts[1].fields["pull"] == pull.step
    assert "request_finished" in a.sources and all(n in FUNCTIONS for n in a.sources)
    # the next step (the prefill's): decode block -> no hash yet, until the load lands
    d = explain_pd_block(steps_upto(pull.step + 1), DECODE, local[-1])
    assert [t.key for t in d.texts] == ["why.pd.delayed"]
    assert d.texts[0].fields["paired"] == remote[-1] and d.texts[0].fields["req"] == "A"
    assert "_update_waiting_for_remote_kv" in d.sources
    assert "has no hash yet" in tr(d.texts[0], "en") and tr(d.texts[0], "zh")
    r = explain_pd_request(steps_upto(pull.step), DECODE, "A")
    assert r.texts[0].key == "why.pd.request.waiting"
    assert (r.texts[0].fields["remote"], r.texts[0].fields["local"]) == (list(remote), list(local))
    assert explain_pd_request(steps_upto(1), PREFILL, "A").texts[0].key == "why.pd.request.kept"
    # a failed pull, on both sides
    initial, records, run = lesson_runs["A:fail"]
    (failed,) = [r.step for r in records for e in r.events if e.kind == "kv_load_failed"]
    steps = RecordedSteps(initial, tuple(records[:failed]), run.scenario.engine)
    kept = explain_pd_block(steps, PREFILL, records[0].snapshot.request("A").block_tables[0][0])
    assert [t.key for t in kept.texts] == ["why.pd.kept", "why.pd.kept_failed"]
    assert explain_pd_request(steps, DECODE, "A").texts[0].key == "why.pd.request.failed.fail"
