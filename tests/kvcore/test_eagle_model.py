"""Speculative decoding with the EAGLE-style head (kvcore/worker/gpu/spec_decode/eagle/
speculator.py) on the real model path: greedy output equal to transformers' ``generate`` whatever
the head guesses (alone, batched, with prefix hits, with preemption; the tiny model always, SmolLM2
in the slow set), each draft equal to the head's own chain over the target's hidden states, every
hit exactly one block shorter than without a drafter, and the settings vLLM's rule turns on or
refuses."""

from __future__ import annotations

import pytest
import torch

from kvcore.model.eagle_head import eagle_head_for
from paged_kv_lab.recording import events
from paged_kv_lab.run.engine import Engine, EngineRefused, NoModelRunner
from paged_kv_lab.run.scenario import (
    CPUOffloadConfig,
    EngineSettings,
    RequestSpec,
    Scenario,
    SpeculativeConfig,
)
from support.models import reference_tokens

K = 3
EAGLE = SpeculativeConfig(
    method="eagle", num_speculative_tokens=K, disable_lookahead_block_hashes=True
)
REP = [17, 254, 1033, 88, 4012, 7, 391]


def req(rid, ids, n=16, **kw):
    kw.setdefault("ignore_eos", True)
    return RequestSpec(id=rid, prompt_token_ids=tuple(ids), max_tokens=n, **kw)


def run(loaded, requests, speculative=EAGLE, **engine):
    sc = Scenario(
        model=loaded.name,
        device=loaded.device.type,
        engine=EngineSettings(speculative=speculative, **engine),
        requests=tuple(requests),
    )
    eng = Engine(sc, model=loaded, debug=True)
    return eng, eng.run()


def events_of(recs, kind):
    return [e for r in recs for e in r.events if e.kind == kind]


CASES = {
    "alone": ([req("A", REP * 2 + [5])], dict(block_size=4)),
    "batched": (
        [req("A", REP * 2), req("B", REP[:4] * 3 + [5, 6], n=12), req("C", [3, 1, 4, 1, 5, 9])],
        dict(block_size=4),
    ),
    "prefix_hits": (
        [req("A", REP * 2, n=10), req("B", REP * 2 + [9], n=10, arrival_step=4)],
        dict(block_size=4),
    ),
    "preemption": (
        [req("A", REP * 2, n=20), req("B", REP[::-1] * 2, n=20)],
        dict(block_size=4, num_gpu_blocks=14),
    ),
}


def head_chain(loaded, context, k):
    """The head's k drafts after ``context``, from transformers' own hidden states (the output
    of the final norm at the next-to-last position) and the target's LM head."""
    head = eagle_head_for(loaded)
    m = loaded.model
    with torch.inference_mode():
        ids = torch.tensor([context], device=loaded.device)
        feature = m.model(input_ids=ids).last_hidden_state[0, -2]
        token = context[-1]
        out = []
        for _ in range(k):
            emb = m.model.embed_tokens(torch.tensor([token], device=loaded.device))[0]
            feature = head.next_feature(feature, emb).to(feature.dtype)
            token = int(torch.argmax(m.lm_head(feature)))
            out.append(token)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_output_equals_generate_whatever_the_head_drafts(loaded, case):
    requests, engine = CASES[case]
    eng, recs = run(loaded, requests, **engine)
    outs = eng.outputs()
    for r in requests:
        want = reference_tokens(loaded.model, list(r.prompt_token_ids), r.max_tokens, ())
        assert outs[r.id]["token_ids"] == want, f"{r.id}: differs from transformers' generate"
    proposed = events_of(recs, events.DRAFT_PROPOSED)
    assert proposed and eng.spec_decoding_stats.num_draft_tokens > 0
    # each proposal is the head's chain from the target's hidden state before the last token
    full = {r.id: list(r.prompt_token_ids) + outs[r.id]["token_ids"] for r in requests}
    for e in proposed[:: max(1, len(proposed) // 8)]:
        ctx = full[e.request_id][: e.num_tokens]
        want = head_chain(loaded, ctx, len(e.draft_token_ids))
        if loaded.dtype == torch.float32:
            assert list(e.draft_token_ids) == want
    kinds = {e.kind for r in recs for e in r.events}
    if case == "prefix_hits":
        assert events.CACHE_HIT in kinds
    if case == "preemption":
        assert events.PREEMPTED in kinds


def test_the_head_is_accepted_sometimes(tiny_model, one_torch_thread):
    """Fitted on the model's own greedy text, the head guesses some drafts right (on the tiny
    random model about half of its first drafts); greedy output does not depend on it."""
    eng, _ = run(tiny_model, [req("A", REP * 2, n=40)], block_size=4)
    stats = eng.spec_decoding_stats
    assert stats.num_accepted_tokens > 0
    assert eng.scheduler.config.num_lookahead_tokens == K  # reserved as vLLM does for EAGLE


@pytest.mark.parametrize("method", ["eagle", "mtp"])
def test_every_hit_is_one_block_shorter_than_without_a_drafter(
    tiny_model, one_torch_thread, method
):
    """B arrives after A finished and shares A's prompt (then goes its own way): with no
    drafter it hits every full block of the shared prompt; with the drop, one block less."""
    bs = 4
    prompt = REP * 3  # 21 tokens
    requests = [req("A", prompt, n=6), req("B", prompt + [9, 8, 7, 6, 5], n=4, arrival_step=30)]
    hits = {}
    for name, sp in (
        ("none", None),
        (method, SpeculativeConfig(method, K, disable_lookahead_block_hashes=True)),
    ):
        eng, recs = run(tiny_model, requests, speculative=sp, block_size=bs, num_gpu_blocks=64)
        hit = [e for e in events_of(recs, events.CACHE_HIT) if e.request_id == "B"]
        assert len(hit) == 1
        hits[name] = hit[0].num_tokens
        assert eng.kv_cache_manager.use_eagle is (sp is not None)
    assert hits["none"] == 20  # the 5 full blocks of the shared 21-token prompt
    assert hits[method] == hits["none"] - bs


# -- when vLLM drops, and what is refused -------------------------------------------------------
def test_lookahead_block_hashes_are_refused_by_name(tiny_model):
    """vLLM's default for EAGLE with prefix caching: each block hashed with the token after it,
    no drop. The lab does not model those hashes and says so; the CPU tier's connector supports
    them too."""
    for sp, extra in (
        (SpeculativeConfig("eagle", K), {}),
        (
            SpeculativeConfig("mtp", K),
            {"cpu_offload": CPUOffloadConfig(num_cpu_blocks=8), "block_size": 4},
        ),
    ):
        with pytest.raises(EngineRefused, match="disable_lookahead_block_hashes"):
            run(tiny_model, [req("A", REP)], speculative=sp, **extra)


def test_the_experimental_switch_turns_the_drop_off(tiny_model, one_torch_thread):
    sp = SpeculativeConfig("eagle", K, disable_eagle_block_drop=True)
    eng, _ = run(tiny_model, [req("A", REP, n=4)], speculative=sp)
    assert eng.kv_cache_manager.use_eagle is False
    # without prefix caching and no connector vLLM keeps plain hashes and passes the drop on
    eng, _ = run(
        tiny_model,
        [req("A", REP, n=4)],
        speculative=SpeculativeConfig("eagle", K),
        enable_prefix_caching=False,
    )
    assert eng.kv_cache_manager.use_eagle is True


def test_the_head_needs_a_model():
    sc = Scenario(engine=EngineSettings(speculative=EAGLE), requests=(req("A", REP),))
    with pytest.raises(EngineRefused, match="hidden states"):
        Engine(sc, runner=NoModelRunner())
