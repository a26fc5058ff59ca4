"""LoRA through the paged engine: adapter requests equal transformers + peft, base requests equal
plain transformers, alone and in one batch; the prefix cache keeps each adapter's blocks apart.

The adapters are made with peft by scripts/make_lora.py (seeded, B non-zero) into a temporary
folder once per session: nothing is downloaded, nothing large is kept in the repository.
"""

import importlib.util
import json
import sys
from collections import Counter

import pytest
import torch

from kvcore.config.lora import LoRAConfig
from kvcore.lora.peft_helper import PEFTHelper
from kvcore.model.reference import shared_clone
from paged_kv_lab.run.engine import Engine, EngineRefused
from paged_kv_lab.run.scenario import (
    EngineSettings,
    LoRAModulePath,
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_to_dict,
)
from support.models import P, eos_of, greedy_no_eos, reference_tokens, req
from support.paths import ROOT

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SCRIPTS = ROOT / "scripts"


def make_lora():
    if importlib.util.find_spec("peft") is None:
        pytest.skip("peft is not installed (it is in the test extra: pip install -e '.[test]')")
    sys.path.insert(0, str(SCRIPTS))
    try:
        import make_lora as module
    finally:
        sys.path.remove(str(SCRIPTS))
    return module.make_lora


def peft_reference(loaded, folder):
    """transformers + peft: the model (a copy of its module tree, same weights) with the adapter."""
    from peft import PeftModel

    return PeftModel.from_pretrained(shared_clone(loaded.model), str(folder)).eval()


@pytest.fixture(scope="session")
def tiny_adapters(tmp_path_factory):
    make = make_lora()
    root = tmp_path_factory.mktemp("lora")
    return {
        "a": make("tiny-random", root / "a", seed=1),
        "b": make("tiny-random", root / "b", seed=2, r=4, lora_alpha=8),
    }


@pytest.fixture(scope="session")
def tiny_peft(tiny_model, tiny_adapters):
    """transformers + peft on the test device, per adapter (the engine's model's weights)."""
    return {name: peft_reference(tiny_model, path) for name, path in tiny_adapters.items()}


def lora_engine(loaded, adapters, requests, **engine):
    modules = tuple(LoRAModulePath(name, str(path)) for name, path in adapters.items())
    engine = {"block_size": 4, "num_gpu_blocks": 48, **engine}
    sc = Scenario(
        model=loaded.name,
        device=loaded.device.type,
        engine=EngineSettings(enable_lora=True, lora_modules=modules, **engine),
        requests=tuple(requests),
    )
    eng = Engine(sc, model=loaded, debug=True)
    eng.run()
    return eng


def check_outputs(loaded, eng, requests, refs):
    """Each request's tokens equal its reference's generate: peft with its adapter, or the base
    model."""
    outs, wanted = eng.outputs(), {}
    for spec in requests:
        model = refs[spec.lora_name] if spec.lora_name else loaded.model
        key = (spec.lora_name, tuple(spec.prompt_token_ids), spec.max_tokens)
        if key not in wanted:  # requests alike in all three (a later hit) share one generate
            wanted[key] = reference_tokens(
                model, list(spec.prompt_token_ids), spec.max_tokens, eos_of(loaded)
            )
        assert outs[spec.id]["token_ids"] == wanted[key], f"{spec.id} ({spec.lora_name}) differs"


def hits(eng):
    return {
        e.request_id: e.num_tokens for r in eng.history for e in r.events if e.kind == "cache_hit"
    }


def test_an_adapter_request_equals_peft_and_differs_from_the_base_model(
    tiny_model, tiny_adapters, tiny_peft
):
    reqs = [req("A", P[:13], 10, lora_name="a")]
    eng = lora_engine(tiny_model, tiny_adapters, reqs)
    check_outputs(tiny_model, eng, reqs, tiny_peft)
    base = reference_tokens(tiny_model.model, P[:13], 10, eos_of(tiny_model))
    assert eng.outputs()["A"]["token_ids"] != base  # the delta was applied


def test_base_and_two_adapters_in_one_step(tiny_model, tiny_adapters, tiny_peft):
    reqs = [
        req("base", P[:9], 8),
        req("A", P[2:15], 8, lora_name="a"),
        req("B", P[4:21], 8, lora_name="b"),
        req("A2", P[:11][::-1], 8, lora_name="a"),
    ]
    eng = lora_engine(tiny_model, tiny_adapters, reqs, max_loras=2)
    assert len(eng.history[0].scheduled) == 4  # one packed forward: base rows and two adapters
    check_outputs(tiny_model, eng, reqs, tiny_peft)


def test_base_rows_are_exactly_the_base_models(tiny_model, tiny_adapters):
    """A base request batched with an adapter request gets the very logits a runner without LoRA
    computes: the adapter touches its own rows only."""
    from kvcore.lora.request import LoRARequest
    from kvcore.worker.gpu.input_batch import SeqBatchItem
    from kvcore.worker.gpu.model_runner import GPUModelRunner

    lora = LoRARequest("a", 1, str(tiny_adapters["a"]))
    base = SeqBatchItem("base", P[:7], 0, ([1, 2],), True)
    adapted = SeqBatchItem("A", P[:9], 0, ([3, 4, 5],), True, lora_request=lora)
    with_lora = GPUModelRunner(tiny_model, 8, 4, lora_config=LoRAConfig())
    plain = GPUModelRunner(tiny_model, 8, 4)
    got = with_lora.execute_logits([adapted, base])
    want = plain.execute_logits([SeqBatchItem("A", P[:9], 0, ([3, 4, 5],), True), base])
    assert torch.equal(got["base"], want["base"])
    assert not torch.allclose(got["A"], want["A"])


def test_a_prefix_hit_between_two_requests_of_one_adapter(tiny_model, tiny_adapters, tiny_peft):
    a = req("A", P[:21], 6, lora_name="a")
    b = req("B", P[:16] + [3, 1, 4, 1, 5], 6, arrival_step=2, lora_name="a")
    eng = lora_engine(tiny_model, tiny_adapters, [a, b])
    assert hits(eng) == {"B": 16}
    check_outputs(tiny_model, eng, [a, b], tiny_peft)


def test_base_and_adapters_never_hit_each_others_blocks(tiny_model, tiny_adapters, tiny_peft):
    """One prompt, four ways: each later request hits only the blocks of its own adapter (or of
    the base model), as the block hashes carry the adapter (vLLM's extra keys)."""
    ids = P[:17]
    reqs = [
        req("A", ids, 4, lora_name="a"),
        req("base", ids, 4, arrival_step=3),
        req("B", ids, 4, arrival_step=6, lora_name="b"),
        req("A2", ids, 4, arrival_step=9, lora_name="a"),
        req("base2", ids, 4, arrival_step=9),
    ]
    eng = lora_engine(tiny_model, tiny_adapters, reqs, max_loras=2)
    assert hits(eng) == {"A2": 16, "base2": 16}
    owners: dict[int, set] = {}  # block hash -> the adapters its BlockStored events named
    for r in eng.history:
        for ev in r.kv_events:
            if type(ev).__name__ == "BlockStored":
                for h in ev.block_hashes:
                    owners.setdefault(h, set()).add((ev.lora_id, ev.lora_name))
    assert all(len(o) == 1 for o in owners.values())
    per_adapter = Counter(next(iter(o)) for o in owners.values())
    assert set(per_adapter) == {(None, None), (1, "a"), (2, "b")}
    assert min(per_adapter.values()) >= 4  # the prompt's 4 full blocks, once for each
    check_outputs(tiny_model, eng, reqs, tiny_peft)


def test_an_adapter_request_is_preempted_and_recomputed(tiny_model, tiny_adapters, tiny_peft):
    reqs = [
        req("A", P[:9], 14, ignore_eos=True, lora_name="a"),
        req("B", P[3:12], 14, ignore_eos=True),
        req("C", P[6:15], 14, ignore_eos=True, lora_name="b"),
    ]
    eng = lora_engine(tiny_model, tiny_adapters, reqs, num_gpu_blocks=13, max_loras=2)
    kinds = [e.kind for r in eng.history for e in r.events]
    assert "preempted" in kinds and "resumed" in kinds
    outs = eng.outputs()
    for spec in reqs:
        model = tiny_peft[spec.lora_name] if spec.lora_name else tiny_model.model
        want = greedy_no_eos(model, spec.prompt_token_ids, spec.max_tokens)
        assert outs[spec.id]["token_ids"] == want, spec.id


def test_max_loras_one_runs_the_second_adapter_later(tiny_model, tiny_adapters, tiny_peft):
    reqs = [
        req("A", P[:9], 6, lora_name="a"),
        req("B", P[:9], 6, lora_name="b"),
        req("base", P[:9], 6),
    ]
    eng = lora_engine(tiny_model, tiny_adapters, reqs, max_loras=1)
    first = eng.history[0]
    assert set(first.scheduled) == {"A", "base"}  # B skipped, the request after it admitted
    blocked = [e for e in first.events if e.kind == "blocked"]
    assert [(e.request_id, e.reason) for e in blocked] == [("B", "max_loras")]
    check_outputs(tiny_model, eng, reqs, tiny_peft)


def test_the_scenario_fields_round_trip_and_are_checked(tiny_adapters):
    d = {
        "model": "tiny-random",
        "engine": {
            "enable_lora": True,
            "max_loras": 2,
            "max_lora_rank": 8,
            "lora_modules": [{"name": "a", "path": str(tiny_adapters["a"])}],
        },
        "requests": [{"id": "A", "prompt_token_ids": [1, 2, 3], "lora_name": "a"}],
    }
    sc = load_scenario(d)
    assert sc.requests[0].lora_name == "a" and sc.engine.lora_modules[0].name == "a"
    assert load_scenario(scenario_to_dict(sc)) == sc
    # a scenario without LoRA keeps its file format: no new keys at their defaults
    plain = scenario_to_dict(load_scenario({"requests": [{"id": "A", "prompt": "x"}]}))
    assert not {"enable_lora", "max_loras", "max_lora_rank", "lora_modules"} & set(plain["engine"])
    assert "lora_name" not in plain["requests"][0]

    bad = json.loads(json.dumps(d))
    bad["engine"]["enable_lora"] = False
    bad["engine"]["lora_modules"].append({"name": "a", "path": "/elsewhere"})
    bad["requests"][0]["lora_name"] = "c"
    with pytest.raises(ScenarioError) as e:
        load_scenario(bad)
    said = str(e.value)
    assert "engine.enable_lora" in said
    assert "engine.lora_modules[1].name" in said
    assert "requests[0].lora_name" in said and "'c'" in said
    bad["engine"]["lora_modules"][1]["name"] = ""
    bad["engine"]["max_lora_rank"] = True  # not a rank, although True == 1
    with pytest.raises(ScenarioError) as e:
        load_scenario(bad)
    said = str(e.value)
    assert "engine.lora_modules[1].name: must be a non-empty string" in said
    assert "engine.max_lora_rank: must be one of 1, 8," in said


def test_an_adapter_the_settings_cannot_serve_is_refused_before_any_step(
    tiny_model, tiny_adapters, tmp_path
):
    with pytest.raises(EngineRefused) as e:  # rank 8 > max_lora_rank 1
        lora_engine(tiny_model, {"a": tiny_adapters["a"]}, [], max_lora_rank=1)
    assert "max_lora_rank" in str(e.value) and "'a'" in str(e.value)
    with pytest.raises(EngineRefused):  # not an adapter folder
        lora_engine(tiny_model, {"x": tmp_path}, [])


def test_peft_features_vllm_refuses_are_refused():
    cfg = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
    PEFTHelper.from_dict(cfg).validate_legal(LoRAConfig())
    with pytest.raises(ValueError, match="DoRA"):
        PEFTHelper.from_dict({**cfg, "use_dora": True}).validate_legal(LoRAConfig())
    with pytest.raises(ValueError, match="bias"):
        PEFTHelper.from_dict({**cfg, "bias": "all"}).validate_legal(LoRAConfig())
    rs = PEFTHelper.from_dict({**cfg, "use_rslora": True, "rank_pattern": {"v_proj": 4}})
    assert rs.get_rank_and_scaling("model.layers.0.self_attn.q_proj") == (8, 16 / 8**0.5)
    assert rs.get_rank_and_scaling("model.layers.0.self_attn.v_proj") == (4, 16 / 2)


def test_the_app_reads_no_adapter_folder_a_scenario_names(tiny_adapters):
    from paged_kv_lab.run.budget import BudgetError
    from paged_kv_lab.store.run_store import RunStore

    sc = load_scenario(
        {
            "model": "tiny-random",
            "engine": {
                "enable_lora": True,
                "lora_modules": [{"name": "a", "path": str(tiny_adapters["a"])}],
            },
        }
    )
    built = []
    with pytest.raises(BudgetError) as e:
        RunStore().run(sc, lambda s: built.append(s))
    assert "engine.lora_modules" in str(e.value) and not built


def test_the_command_line_runs_adapters_and_set_replaces_them(
    tiny_model, tiny_adapters, tiny_peft, tmp_path
):
    """``python -m paged_kv_lab run`` (through ``main``): the file's adapter "a" is pointed at b's
    folder by ``--set``, and request A then writes what peft with b writes."""
    from paged_kv_lab.run.trace_file import read_trace
    from support.cli import run_cli_here

    file = tmp_path / "lora.json"
    file.write_text(
        json.dumps(
            {
                "model": "tiny-random",
                "device": "cpu",
                "engine": {
                    "block_size": 4,
                    "num_gpu_blocks": 32,
                    "enable_lora": True,
                    "lora_modules": [{"name": "a", "path": str(tiny_adapters["a"])}],
                },
                "requests": [
                    {"id": "A", "prompt_token_ids": P[:9], "max_tokens": 6, "lora_name": "a"},
                    {"id": "base", "prompt_token_ids": P[:9], "max_tokens": 6},
                ],
            }
        )
    )
    swapped = json.dumps([{"name": "a", "path": str(tiny_adapters["b"])}])
    trace = tmp_path / "t.jsonl"
    r = run_cli_here("run", file, "--set", f"lora_modules={swapped}", "--trace", trace, "--check")
    assert r.returncode == 0, r.stderr
    t = read_trace(trace.read_text())
    assert t.scenario["engine"]["lora_modules"] == json.loads(swapped)
    eos = eos_of(tiny_model)
    assert t.outputs["A"]["token_ids"] == reference_tokens(tiny_peft["b"], P[:9], 6, eos)
    assert t.outputs["base"]["token_ids"] == reference_tokens(tiny_model.model, P[:9], 6, eos)


@pytest.mark.slow
def test_smollm2_adapter_and_base_requests_batched(smollm2, tmp_path):
    make = make_lora()
    adapters = {"a": make("smollm2", tmp_path / "a", seed=1)}
    refs = {"a": peft_reference(smollm2, adapters["a"])}
    prompt = list(smollm2.encode_prompt("Name three colours of the rainbow.", True))
    reqs = [
        req("A", prompt, 12, lora_name="a"),
        req("base", prompt, 12),
        req("A2", prompt, 12, arrival_step=14, lora_name="a"),
    ]
    eng = lora_engine(smollm2, adapters, reqs, block_size=16, num_gpu_blocks=64)
    assert hits(eng) == {"A2": len(prompt) // 16 * 16}
    check_outputs(smollm2, eng, reqs, refs)
    outs = eng.outputs()
    assert outs["A"]["token_ids"] != outs["base"]["token_ids"]
