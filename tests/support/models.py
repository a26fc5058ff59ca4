"""transformers' own greedy decoding on the same weights, the yardstick of every test that checks
the paged engine's tokens (tests/differential/test_engine_equality.py and the feature tests of
tests/kvcore/: drafts, LoRA, the CPU tier, prompt embeddings...), and the engine runs they
compare with it. The ``loaded`` fixture (the tiny model, and SmolLM2 in the slow set) is in
tests/conftest.py."""

import ast
import codecs
import importlib.util
from pathlib import Path

import torch

from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario

P = [
    17,
    254,
    1033,
    88,
    4012,
    7,
    391,
    2290,
    56,
    1777,
    640,
    12,
    9001,
    345,
    78,
    2048,
    31,
    4444,
    500,
    61,
    909,
]


def reference_tokens(model, ids, n, eos_ids):
    with torch.inference_mode():
        x = torch.tensor([ids], device=model.device)
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=list(eos_ids) or None,
        )
    toks = out[0, len(ids) :].tolist()
    for i, t in enumerate(toks):  # generate pads after EOS in a batch; alone it stops there
        if t in eos_ids:
            return toks[: i + 1]
    return toks


def eos_of(loaded):
    e = loaded.eos_token_id
    return tuple(e) if isinstance(e, (list, tuple)) else ((e,) if e is not None else ())


def run_engine(loaded, requests, **engine):
    sc = Scenario(
        model=loaded.name,
        device=loaded.device.type,
        engine=EngineSettings(**engine),
        requests=tuple(requests),
    )
    eng = Engine(sc, model=loaded, debug=True)
    records = eng.run()
    kinds = [e.kind for r in records for e in r.events]
    return eng, kinds


def check_equal(loaded, eng, requests, ref=None):
    ref = ref or loaded.model
    outs = eng.outputs()
    for spec in requests:
        ids = list(spec.prompt_token_ids)
        want = reference_tokens(ref, ids, spec.max_tokens, eos_of(loaded))
        assert outs[spec.id]["token_ids"] == want, f"request {spec.id} differs from transformers"


def req(rid, ids, n=8, **kw):
    return RequestSpec(id=rid, prompt_token_ids=tuple(ids), max_tokens=n, **kw)


def greedy_no_eos(model, ids, n):
    """transformers' own forward, no cache, argmax n times (EOS does not stop it)."""
    ids = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([ids], device=model.device), use_cache=False).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[-n:]


def _zen_lines() -> list[str]:
    """The Zen of Python from the standard library's ``this`` module, read without importing
    it (importing prints it)."""
    tree = ast.parse(Path(importlib.util.find_spec("this").origin).read_text(encoding="utf-8"))
    (s,) = [ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)][:1]
    return codecs.decode(s, "rot13").splitlines()[2:]


ZEN = _zen_lines()


def zen(first: int, last: int) -> str:
    return " ".join(ZEN[first:last])


# the CPU-tier tests' prompt (tests/kvcore/test_offload.py, test_kv_load_failure.py): A and C
# share its first 16 tokens, B is its reverse
TIER_P = P[:18]
