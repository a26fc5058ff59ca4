"""Parallel sampling (n > 1): vLLM v1's fan-out into child requests, sharing through the prefix
cache."""

import json

import pytest

from kvcore.engine.parallel_sampling import ParentRequest, fan_out, group_outputs, scenario_parents
from paged_kv_lab.run.budget import BudgetError, Limits, check_scenario
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import RequestSpec, ScenarioError, load_scenario
from paged_kv_lab.run.trace_file import TraceError, outputs_line, read_trace, step_line
from support.paths import ROOT

# the app tests here run the app on the tiny model (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_model_env")

PROMPT = "What is a KV cache? Tell me more, please."  # not a whole number of 8-token blocks


def scenario(n=3, seed=None, model="tiny-random", **extra):
    req = {"id": "A", "prompt": PROMPT, "max_tokens": 6, "n": n, "ignore_eos": True, **extra}
    if seed is not None:
        req["seed"] = seed
    return load_scenario(
        {"model": model, "engine": {"block_size": 8, "num_gpu_blocks": 32}, "requests": [req]}
    )


@pytest.fixture(
    scope="module", params=["tiny-random", pytest.param("smollm2", marks=pytest.mark.slow)]
)
def model(request):
    """The session's tiny model or SmolLM2 (tests/conftest.py: each is loaded once)."""
    return request.getfixturevalue("tiny_model" if request.param == "tiny-random" else "smollm2")


def run(model, sc):
    e = Engine(sc, model=model, debug=True)
    records = e.run()
    return e, records


def test_fan_out_names_children_as_vllm():
    spec = RequestSpec(id="req-7", prompt="x", n=3, seed=10)
    parent, children = fan_out(spec)
    assert parent == ParentRequest("req-7", 3, 10)
    assert [c.id for c in children] == ["0_req-7", "1_req-7", "2_req-7"]
    assert [c.seed for c in children] == [10, 11, 12] and all(c.n == 1 for c in children)
    assert fan_out(RequestSpec(id="B", prompt="x")) == (None, (RequestSpec(id="B", prompt="x"),))
    _, unseeded = fan_out(RequestSpec(id="C", prompt="x", n=2))
    assert [c.seed for c in unseeded] == [None, None]


def test_scenario_checks_n_and_child_ids():
    assert load_scenario({"requests": [{"id": "A", "prompt": "x"}]}).requests[0].n == 1
    with pytest.raises(ScenarioError) as e:
        load_scenario({"requests": [{"id": "A", "prompt": "x", "n": 0, "seed": -1}]})
    assert "requests[0].n: must be an integer >= 1; got 0" in e.value.problems
    assert "requests[0].seed: must be null or an integer >= 0; got -1" in e.value.problems
    with pytest.raises(ScenarioError, match="'A' has n = 2, so it runs as '1_A'"):
        load_scenario(
            {"requests": [{"id": "A", "prompt": "x", "n": 2}, {"id": "1_A", "prompt": "y"}]}
        )


def test_budget_counts_every_child():
    sc = load_scenario({"requests": [{"id": "A", "prompt": "x", "n": 40}]})
    with pytest.raises(
        BudgetError, match="requests \\(how many, each of n children counted\\) = 40"
    ):
        check_scenario(sc, Limits(max_requests=32))
    check_scenario(sc, Limits(max_requests=40))


def test_children_share_the_prompt_blocks_without_copy(model):
    e = Engine(scenario(), model=model, debug=True)
    rec = e.step()
    bs = 8
    prompt_len = len(e.scheduler.requests["0_A"].prompt_token_ids)
    assert prompt_len % bs, "the lesson's point needs a partial last prompt block"
    full = prompt_len // bs
    # child 0 computes the whole prompt; 1 and 2 hit its full blocks in the same schedule() pass
    assert rec.scheduled == {
        "0_A": prompt_len,
        "1_A": prompt_len - full * bs,
        "2_A": prompt_len - full * bs,
    }
    kinds = [(ev.kind, ev.request_id) for ev in rec.events]
    assert ("cache_miss", "0_A") in kinds and ("cached", "0_A") in kinds
    assert (
        kinds.index(("cached", "0_A"))
        < kinds.index(("cache_hit", "1_A"))
        < kinds.index(("cache_hit", "2_A"))
    )
    snap = rec.snapshot
    tables = {rid: snap.request(rid).block_tables[0] for rid in ("0_A", "1_A", "2_A")}
    shared = tables["0_A"][:full]
    assert all(t[:full] == shared for t in tables.values())
    ref = {b.block_id: b.ref_cnt for b in snap.blocks}
    assert all(ref[b] == 3 for b in shared)
    own = [t[full] for t in tables.values()]
    assert len(set(own)) == 3 and all(ref[b] == 1 for b in own), "each child owns its partial block"
    assert all(snap.blocks[b].block_hash is None for b in own), "a partial block is never cached"
    assert len({snap.request(rid).arrival for rid in tables}) == 1, (
        "copies of one request: one arrival time"
    )


def test_greedy_children_produce_the_same_text(model):
    e, _ = run(model, scenario())
    grouped = e.grouped_outputs()
    assert list(grouped) == ["A"] and grouped["A"]["finished"]
    outs = grouped["A"]["outputs"]
    assert [o["index"] for o in outs] == [0, 1, 2]
    assert [o["request_id"] for o in outs] == ["0_A", "1_A", "2_A"]
    assert len(outs[0]["token_ids"]) == 6
    assert outs[0]["token_ids"] == outs[1]["token_ids"] == outs[2]["token_ids"]
    assert outs[0]["text"] == outs[1]["text"] == outs[2]["text"]
    assert set(e.outputs()) == {"0_A", "1_A", "2_A"}
    fresh = Engine(scenario(), model=model)
    got = fresh.generate([RequestSpec(id="G", prompt=PROMPT, n=2, max_tokens=3, ignore_eos=True)])
    assert [o["request_id"] for o in got["G"]["outputs"]] == ["0_G", "1_G"]
    assert (
        got["G"]["outputs"][0]["token_ids"]
        == got["G"]["outputs"][1]["token_ids"]
        == outs[0]["token_ids"][:3]
    )


def test_seeded_children_differ_reproducibly(model):
    e1, _ = run(model, scenario(seed=1234))
    e2, _ = run(model, scenario(seed=1234))
    toks = [o["token_ids"] for o in e1.grouped_outputs()["A"]["outputs"]]
    assert toks == [o["token_ids"] for o in e2.grouped_outputs()["A"]["outputs"]]
    assert len({tuple(t) for t in toks}) > 1, "seeds 1234, 1235, 1236 gave the same tokens"
    # each child's own generator (seed + index): its tokens do not depend on its siblings
    alone, _ = run(model, scenario(n=1, seed=1235))
    assert alone.outputs()["A"]["token_ids"] == toks[1]


def test_trace_keeps_children_and_their_parent(model):
    e, records = run(model, scenario())
    text = "\n".join([step_line(r) for r in records] + [outputs_line(e.outputs(), e.parents())])
    t = read_trace(text)
    assert t.parents == {"A": ["0_A", "1_A", "2_A"]} and set(t.outputs) == {"0_A", "1_A", "2_A"}
    assert group_outputs(t.outputs, t.parents) == e.grouped_outputs()
    assert scenario_parents(scenario().requests, e.outputs()) == t.parents
    bad = "\n".join([step_line(records[0]), json.dumps({"outputs": {}, "parents": {"A": ["0_A"]}})])
    with pytest.raises(TraceError, match="parents name children with no output: 0_A"):
        read_trace(bad)
    with pytest.raises(TraceError, match="parents must map parent ids to lists of child ids"):
        read_trace(
            "\n".join([step_line(records[0]), json.dumps({"outputs": {}, "parents": {"A": 3}})])
        )
    plain = read_trace("\n".join([step_line(records[0]), outputs_line({})]))
    assert plain.parents is None


def test_playground_adds_a_request_with_n():
    from support.app import Browser, app

    at = app("playground")
    Browser(at, "playground").show(1)
    at.text_input(key="pg_req_id").set_value("Q")
    at.number_input(key="pg_req_n").set_value(2)
    at.number_input(key="pg_req_seed").set_value(5)
    at.button(key="FormSubmitter:addreq:playground-Add request").click().run()
    assert not at.exception and not at.error
    state = at.session_state["lesson:playground"]
    (q,) = [r for r in state.run.scenario.requests if r.id == "Q"]
    assert (q.n, q.seed) == (2, 5)
    b = Browser(at, "playground").until_recorded(2)
    assert {e[1] for e in b.steps[1]["ev"] if e[0] == "arrived"} >= {"0_Q", "1_Q"}


def test_cli_trace_groups_children_in_the_trace_viewer(tmp_path):

    from support.app import app, sidebar_set
    from support.cli import run_cli_here

    root = ROOT
    out = tmp_path / "ps.jsonl"
    r = run_cli_here(
        "run",
        root / "paged_kv_lab" / "content" / "examples" / "parallel_sampling.json",
        "--model",
        "tiny-random",
        "--device",
        "cpu",
        "--trace",
        out,
        "--quiet",
    )
    assert r.returncode == 0, r.stderr
    assert "A (n = 3): 0_A, 1_A, 2_A" in r.stdout and "B (n = 2): 0_B, 1_B" in r.stdout
    t = read_trace(out.read_text())
    assert t.parents == {"A": ["0_A", "1_A", "2_A"], "B": ["0_B", "1_B"]}
    assert t.outputs["0_B"]["token_ids"] == t.outputs["1_B"]["token_ids"], "greedy children agree"
    at = app("trace")
    sidebar_set(at, "model_name", "tiny-random")
    at.file_uploader(key="up:trace").upload("ps.jsonl", out.read_bytes(), "application/jsonl").run()
    assert not at.exception, [e.value for e in at.exception]
    tables = [d.value for d in at.dataframe]
    groups = [tb for tb in tables if list(tb.columns) == ["parent", "n", "children"]]
    assert groups and groups[0].values.tolist() == [["A", 3, "0_A, 1_A, 2_A"], ["B", 2, "0_B, 1_B"]]
