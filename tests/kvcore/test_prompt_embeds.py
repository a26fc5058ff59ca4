"""Prompt embeddings and multimodal placeholder items (issue #33), real through the paged engine.

An embeddings prompt (``prompt_embeds``: a text's own embedding rows plus seeded noise) and a token
prompt with a multimodal item (``mm_features``: rows standing for an encoder's output, merged at
the placeholder range) give the greedy tokens transformers' ``generate(inputs_embeds=...)`` gives
on the same weights, alone and batched with token requests; their block hashes are the ones
vLLM's rule makes (written out here); prefix hits follow those hashes; bad scenarios are refused
with the catalogue's sentences."""

import hashlib
import json
from dataclasses import replace

import pytest
import torch

from kvcore.model.prompt_embeds import embedding_rows, rows_tensor
from paged_kv_lab.recording.snapshot import Snapshot
from paged_kv_lab.run.budget import BudgetError, Limits, check_scenario
from paged_kv_lab.run.engine import Engine, EngineRefused, NoModelRunner
from paged_kv_lab.run.scenario import (
    EmbedsNoise,
    EmbedsSource,
    EngineSettings,
    MultiModalItem,
    RequestSpec,
    Scenario,
    ScenarioError,
    load_scenario,
    scenario_to_dict,
)
from paged_kv_lab.why.explain import EXTRA_KEYS, RecordedSteps, explain_hit
from paged_kv_lab.why.explain_blocks import compare_requests
from paged_kv_lab.why.explain_text import comparison_sentences, hit_sentences
from support.app import app
from support.kv import VLLM_NONE_HASH_SHA256, vllm_sha256
from support.models import P, eos_of, req
from support.models import check_equal as check_token_requests
from support.paths import ROOT
from support.words import FULL_RUN_S

# the app tests below run the app on the tiny model
pytestmark = pytest.mark.usefixtures("one_torch_thread", "tiny_model_env")

EXAMPLE = ROOT / "paged_kv_lab" / "content" / "examples" / "prompt_embeds.json"

TEXT = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun"
NOISE = EmbedsNoise(seed=3, scale=0.02)
BS = 4


def embeds_req(rid, text=TEXT, noise=NOISE, n=6, **kw):
    return RequestSpec(
        id=rid, prompt_embeds=EmbedsSource(text, noise), max_tokens=n, ignore_eos=True, **kw
    )


def image(offset, length, seed, identifier=None, scale=0.05):
    return MultiModalItem(
        offset, length, EmbedsSource(None, EmbedsNoise(seed, scale)), "image", identifier
    )


def run(loaded, requests, runner=None, **engine):
    engine = {"block_size": BS, "num_gpu_blocks": 64, "enable_prompt_embeds": True, **engine}
    sc = Scenario(
        model=loaded.name if loaded else "tiny-random",
        device=loaded.device.type if loaded else "cpu",
        engine=EngineSettings(**engine),
        requests=tuple(requests),
    )
    eng = Engine(sc, model=loaded, runner=runner, debug=True)
    eng.run()
    return eng


def hits(eng) -> dict[str, int]:
    return {
        e.request_id: e.num_tokens for r in eng.history for e in r.events if e.kind == "cache_hit"
    }


def fed_embeds(loaded, request) -> torch.Tensor:
    """What the model is fed for a request's prompt, built here from the request's own fields: its
    prompt_embeds rows, or its tokens' embeddings with each multimodal item's rows at its range."""
    if request.prompt_embeds is not None:
        return rows_tensor(request.prompt_embeds, loaded.dtype)
    weight = loaded.model.get_input_embeddings().weight.detach()
    x = weight[torch.tensor(request.prompt_token_ids, device=weight.device)].cpu()
    for f in request.mm_features:
        p = f.mm_position
        x[p.offset : p.offset + p.length] = rows_tensor(f.data, loaded.dtype)
    return x


def generate_from_embeds(loaded, x: torch.Tensor, n: int, ignore_eos: bool) -> list[int]:
    model = loaded.model
    with torch.inference_mode():
        x = x[None].to(model.device)
        out = model.generate(
            inputs_embeds=x,
            attention_mask=torch.ones(x.shape[:2], dtype=torch.long, device=model.device),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None if ignore_eos else list(eos_of(loaded)) or None,
        )
    return out[0].tolist()  # decoder-only generate from embeddings returns the new tokens alone


def check_equal(loaded, eng):
    outs = eng.outputs()
    for rid, r in eng.requests.items():
        if r.prompt_embeds is None and not r.mm_features:
            continue
        want = generate_from_embeds(loaded, fed_embeds(loaded, r), r.max_tokens, r.ignore_eos)
        assert outs[rid]["token_ids"] == want, f"{rid} differs from generate(inputs_embeds=...)"


# -- the model ----------------------------------------------------------------------------------
def test_embeds_and_an_image_alone_and_batched_with_tokens_equal_generate(loaded):
    ids = loaded.encode_prompt(TEXT, chat=False)
    reqs = [
        embeds_req("E"),
        req("T", P[:11], 6),
        RequestSpec(
            id="M", prompt=TEXT, max_tokens=6, ignore_eos=True, mm_features=(image(3, 5, seed=7),)
        ),
    ]
    eng = run(loaded, reqs)
    assert len(eng.history[0].scheduled) == 3  # one packed forward: rows and tokens together
    check_equal(loaded, eng)
    e, m = eng.requests["E"], eng.requests["M"]
    assert e.prompt_token_ids == [0] * len(ids)  # vLLM's ids for an embeddings prompt
    assert m.prompt_token_ids == ids
    check_token_requests(loaded, eng, reqs[1:2])  # the token request beside them: its own ids
    alone = run(loaded, [embeds_req("E")])
    assert alone.outputs()["E"] == eng.outputs()["E"]


def test_rows_are_the_texts_embeddings_plus_per_row_noise(tiny_model):
    ids = tiny_model.encode_prompt(TEXT, chat=False)
    plain = rows_tensor(embedding_rows(tiny_model, ids, len(ids)), tiny_model.dtype)
    weight = tiny_model.model.get_input_embeddings().weight.detach().cpu()
    assert torch.equal(plain, weight[ids])
    noisy = rows_tensor(embedding_rows(tiny_model, ids, len(ids), 3, 0.02), tiny_model.dtype)
    assert 0 < (noisy - plain).abs().max() < 0.2
    # row i's noise depends on the seed and i alone: a shorter prompt's rows are a prefix
    short = embedding_rows(tiny_model, ids[:5], 5, 3, 0.02)
    assert short == embedding_rows(tiny_model, ids, len(ids), 3, 0.02)[:5]


# -- the hashes and the hits ----------------------------------------------------------------------
def test_block_hashes_are_vllms_rule_written_out(tiny_model):
    """sha256 chain over (parent, the block's token ids, extra keys): an embeddings prompt hashes
    ids 0 with each block's row bytes; an image's blocks carry ("mm", identifier, offset from the
    block's start), the offset negative where the item began in an earlier block."""
    m = RequestSpec(
        id="M", prompt_token_ids=tuple(P[:13]), max_tokens=2, mm_features=(image(3, 6, seed=7),)
    )
    eng = run(tiny_model, [embeds_req("E", n=2), m], hash_algo="sha256")
    e = eng.requests["E"]
    parent, want = VLLM_NONE_HASH_SHA256, []
    for i in range(len(e.prompt_embeds) // BS):
        rows = b"".join(e.prompt_embeds[i * BS : (i + 1) * BS])
        keys = (("prompt_embeds", hashlib.sha256(rows).digest()),)
        parent = vllm_sha256((parent, (0,) * BS, keys))
        want.append(parent)
    assert e.block_hashes[: len(want)] == want
    r = eng.requests["M"]
    ident = hashlib.sha256(b"".join(r.mm_features[0].data)).hexdigest()
    assert r.mm_features[0].identifier == ident
    parent, want = VLLM_NONE_HASH_SHA256, []
    for i, keys in enumerate([(("mm", ident, 3),), (("mm", ident, -1),), (("mm", ident, -5),)]):
        parent = vllm_sha256((parent, tuple(P[i * BS : (i + 1) * BS]), keys))
        want.append(parent)
    assert r.block_hashes[:3] == want


def test_embeds_prompts_share_leading_rows_and_never_a_token_prompts_blocks(tiny_model):
    """Two embeddings prompts whose texts share their first words hit each other's leading blocks;
    an embeddings prompt without noise is fed exactly its text's token embeddings, so it generates
    what the token prompt does, yet shares none of its blocks (ids 0 and the rows' hash)."""
    ids = tiny_model.encode_prompt(TEXT, chat=False)
    short = tiny_model.tokenizer.decode(ids[:9])
    assert tiny_model.encode_prompt(short, chat=False) == ids[:9]
    reqs = [
        embeds_req("A"),
        embeds_req("B", text=short, arrival_step=8),
        RequestSpec(id="T", prompt=TEXT, max_tokens=6, ignore_eos=True, arrival_step=16),
        embeds_req("Z", noise=None, arrival_step=24),
        embeds_req("Z2", noise=None, arrival_step=32),
    ]
    eng = run(tiny_model, reqs)
    assert hits(eng) == {"B": 8, "Z2": (len(ids) - 1) // BS * BS}
    assert eng.outputs()["Z"]["token_ids"] == eng.outputs()["T"]["token_ids"]
    check_equal(tiny_model, eng)


def test_an_image_shares_the_blocks_before_its_range_only(tiny_model):
    """Same tokens, another image at offset 6: the later request hits block 0 alone (block 1
    holds part of the range); the same image hits every full prompt block."""
    first = image(6, 5, seed=7)
    reqs = [
        RequestSpec(id="A", prompt_token_ids=tuple(P[:17]), max_tokens=3, mm_features=(first,)),
        RequestSpec(
            id="B",
            prompt_token_ids=tuple(P[:17]),
            max_tokens=3,
            arrival_step=5,
            mm_features=(image(6, 5, seed=8),),
        ),
        RequestSpec(
            id="C",
            prompt_token_ids=tuple(P[:17]),
            max_tokens=3,
            arrival_step=10,
            mm_features=(first,),
        ),
        req("T", P[:17], 3, arrival_step=15),
    ]
    eng = run(tiny_model, reqs)
    assert hits(eng) == {"B": 4, "C": 16, "T": 4}
    check_equal(tiny_model, eng)


def test_without_a_model_an_identifier_is_a_hash_key_alone():
    """A model-free run carries an item's identifier into the hashes (as it carries an adapter's
    name): same identifier, full hit; another, a hit up to the range."""

    reqs = [
        RequestSpec(
            id=rid,
            prompt_token_ids=tuple(P[:17]),
            max_tokens=2,
            arrival_step=3 * i,
            mm_features=(MultiModalItem(5, 4, identifier=ident),),
        )
        for i, (rid, ident) in enumerate((("A", "x"), ("B", "y"), ("C", "x")))
    ]
    eng = run(None, reqs, runner=NoModelRunner())
    assert hits(eng) == {"B": 4, "C": 16}
    assert eng.requests["A"].extra_keys_for_block(1) == (("mm", "x", 1),)


# -- refusals --------------------------------------------------------------------------------------
def problems(d: dict) -> list[str]:
    with pytest.raises(ScenarioError) as e:
        load_scenario(d)
    return e.value.problems


def test_the_scenario_fields_are_checked_with_their_paths():
    embeds = {"text": "hi", "noise": {"seed": 1, "scale": 0.1}}
    base = {"model": "tiny-random", "requests": []}
    got = problems({**base, "requests": [{"id": "a", "prompt_embeds": embeds}]})
    assert got == [
        "requests[0].prompt_embeds: prompt embeddings need engine.enable_prompt_embeds true "
        "(vLLM refuses them otherwise)"
    ]
    on = {**base, "engine": {"enable_prompt_embeds": True}}
    got = problems({**on, "requests": [{"id": "a", "prompt_embeds": {"noise": {"seed": 1}}}]})
    assert got == [
        "requests[0].prompt_embeds: give a text: its tokens set how many rows there are "
        "(noise alone has no length)"
    ]
    got = problems({**on, "requests": [{"id": "a", "prompt": "x", "prompt_embeds": embeds}]})
    assert got == ["requests[0]: give exactly one of prompt, prompt_token_ids or prompt_embeds"]
    items = [{"offset": 1, "length": 4}, {"offset": 3, "length": 2}, {"offset": 9, "length": 3}]
    got = problems(
        {**on, "requests": [{"id": "a", "prompt_token_ids": list(range(10)), "mm_features": items}]}
    )
    assert got == [
        "requests[0].mm_features[2]: the placeholder range ends at 12, past the prompt's 10 tokens",
        "requests[0].mm_features[1]: its placeholder range overlaps that of mm_features[0]",
    ]
    bad = {"offset": -1, "length": 0, "embeds": {"noise": {"seed": 1, "scale": 1000}}}
    got = problems({**on, "requests": [{"id": "a", "prompt": "x", "mm_features": [bad]}]})
    assert got == [
        "requests[0].mm_features[0].offset: must be an integer >= 0; got -1",
        "requests[0].mm_features[0].length: must be an integer >= 1; got 0",
        "requests[0].mm_features[0].embeds.noise.scale: must be a number in [0, 100]; got 1000",
    ]
    many = [{"offset": i, "length": 1} for i in range(65)]
    got = problems({**on, "requests": [{"id": "a", "prompt": "x", "mm_features": many}]})
    assert got[0].startswith("requests[0].mm_features: must be a list of at most 64 objects")


def test_the_fields_round_trip_and_a_huge_text_is_refused_before_tokenizing():
    d = {
        "model": "tiny-random",
        "engine": {"enable_prompt_embeds": True},
        "requests": [
            {"id": "E", "prompt_embeds": {"text": "hi", "noise": {"seed": 1, "scale": 0.5}}},
            {
                "id": "M",
                "prompt": "x y z",
                "mm_features": [
                    {"offset": 0, "length": 2, "identifier": "cat", "modality": "audio"}
                ],
            },
        ],
    }
    s = load_scenario(d)
    assert load_scenario(scenario_to_dict(s)) == s
    assert scenario_to_dict(s)["engine"] == {
        **scenario_to_dict(Scenario())["engine"],
        "enable_prompt_embeds": True,
    }
    limits = Limits(max_prompt_chars=10)
    long = {"id": "E", "prompt_embeds": {"text": "x" * 11}}
    with pytest.raises(BudgetError, match=r"requests\[0\]\.prompt_embeds\.text"):
        check_scenario(load_scenario({**d, "requests": [long]}), limits)
    long = {
        "id": "M",
        "prompt": "x",
        "mm_features": [{"offset": 0, "length": 1, "embeds": {"text": "y" * 11}}],
    }
    with pytest.raises(BudgetError, match=r"requests\[0\]\.mm_features\[0\]\.embeds\.text"):
        check_scenario(load_scenario({**d, "requests": [long]}), limits)


def test_the_engine_refuses_what_it_cannot_feed(tiny_model):
    def refused(requests, loaded=tiny_model, runner=None, **engine):
        with pytest.raises(EngineRefused) as e:
            run(loaded, requests, runner=runner, **engine)
        return str(e.value)

    assert refused([embeds_req("E")], enable_prompt_embeds=False) == (
        "E.prompt_embeds: prompt embeddings need engine.enable_prompt_embeds true "
        "(vLLM refuses them otherwise)"
    )
    assert refused([embeds_req("E")], loaded=None, runner=NoModelRunner()) == (
        "request 'E': embedding rows are made from the model's own embeddings, which needs a model"
    )
    no_id = RequestSpec(id="M", prompt_token_ids=(1, 2, 3), mm_features=(MultiModalItem(0, 2),))
    assert "give its identifier" in refused([no_id], loaded=None, runner=NoModelRunner())
    words = MultiModalItem(0, 2, EmbedsSource("three small words"))
    wrong = RequestSpec(id="M", prompt=TEXT, mm_features=(words,))
    n = len(tiny_model.encode_prompt("three small words", chat=False))
    assert refused([wrong]) == (
        f"request 'M': mm_features[0].embeds.text has {n} tokens; the placeholder range is 2 "
        "long (one row per position)"
    )
    outside = RequestSpec(id="M", prompt="short", mm_features=(MultiModalItem(0, 40),))
    assert "past the prompt's" in refused([outside])


# -- the app ---------------------------------------------------------------------------------------


def test_the_example_uploaded_to_the_app_runs_with_its_hits():
    at = app("playground")
    at.session_state["scenario_open:playground"] = True
    at.run()
    at.file_uploader(key="up:playground").upload(
        "prompt_embeds.json", EXAMPLE.read_bytes(), "application/json"
    ).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    run = at.session_state["lesson:playground"].run
    assert run.scenario.name == "prompt-embeds-and-an-image"
    run.run_to_end(timeout=FULL_RUN_S)
    assert run.finished, f"the run did not end: {len(run.records)} steps recorded"
    got = {
        e.request_id: e.num_tokens for r in run.records for e in r.events if e.kind == "cache_hit"
    }
    assert got["image-b"] == 8 and "embeds" not in got


# -- why? --------------------------------------------------------------------------------------
def test_why_names_the_extra_keys_that_part_two_chains_of_the_same_tokens(tiny_model):
    """The example (tiny model), recorded: image-b's miss and the two images' chains are told by
    the extra keys of the block where they part (the items' identifiers); two embeddings prompts
    of equal length (ids 0 both) by their blocks' row digests; the trace keeps those keys."""
    scenario = replace(load_scenario(EXAMPLE), model="tiny-random", device="cpu")
    eng = Engine(scenario, model=tiny_model)
    initial = eng.snapshot()
    steps = RecordedSteps(initial, tuple(eng.run()), eng.settings)
    views = steps.request_views()
    (x,) = explain_hit(steps, "image-b")
    ident = {r: eng.requests[r].mm_features[0].identifier for r in ("image-a", "image-b")}
    assert (x.reason, x.block_index, x.other_request) == (EXTRA_KEYS, 2, "image-a")
    assert (x.extra_keys, x.other_extra_keys) == (
        f"mm({ident['image-b']!r}, 3)",
        f"mm({ident['image-a']!r}, 3)",
    )
    said = hit_sentences(x)[1]
    assert ident["image-a"] in said and "block 2 was hashed with other extra keys" in said
    c = compare_requests(steps, "image-a", "image-b")
    assert (c.reason, c.diverge_index) == (EXTRA_KEYS, 2)
    assert ident["image-b"] in comparison_sentences(c, "zh")[1]
    (x,) = explain_hit(steps, "noisy")
    assert (x.reason, x.block_index, x.other_request) == (EXTRA_KEYS, 0, "embeds")
    digest = hashlib.sha256(b"".join(eng.requests["noisy"].prompt_embeds[:4])).hexdigest()
    assert x.extra_keys == f"prompt_embeds({digest})"
    assert views["tokens"].block_extra_keys == ()  # a token prompt's hashes carry no extra key
    again = Snapshot.from_dict(json.loads(json.dumps(steps.records[-1].snapshot.to_dict())))
    assert again == steps.records[-1].snapshot
    assert "block_extra_keys" not in steps.records[-1].snapshot.to_dict()["requests"][0]
