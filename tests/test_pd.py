"""Prefill here, decode there: two replicas sharing one model, joined by the NIXL connector's flow
(kvcore/distributed/kv_transfer/kv_connector/v1/nixl/, paged_kv_lab/disagg/pd.py).

Greedy tokens equal transformers' generate with prefix hits on both replicas; the prefill
replica keeps a request's blocks until the decode replica has pulled them; the decode replica
waits in WAITING_FOR_REMOTE_KVS and caches the pulled blocks only once the pull landed; a failed
pull takes kv_load_failure_policy's path; the CLI runs a scenario this way. The prompts are the
Zen of Python (Tim Peters), which nobody here wrote.
"""

import ast
import codecs
import importlib.util
import json
from pathlib import Path

import pytest

from paged_kv_lab.cli.main import main as cli_main
from paged_kv_lab.disagg.pd import DECODE, PREFILL, PDEngine, ttft_split
from paged_kv_lab.record.engine import Engine
from paged_kv_lab.record.scenario import EngineSettings, RequestSpec, Scenario
from paged_kv_lab.record.trace import read_trace
from tests.test_engine_equality import eos_of, reference_tokens

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _zen_lines() -> list[str]:
    """The Zen of Python from the standard library's ``this`` module, read without importing
    it (importing prints it)."""
    tree = ast.parse(Path(importlib.util.find_spec("this").origin).read_text(encoding="utf-8"))
    (s,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)][:1]
    return codecs.decode(s, "rot13").splitlines()[2:]


ZEN = _zen_lines()


def zen(first: int, last: int) -> str:
    return " ".join(ZEN[first:last])


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
