"""`python -m paged_kv_lab run` says a one-time conversion once (it said it twice: kvcore/model
prints
it, and the CLI's progress callback printed it again) and keeps it off the trace on stdout."""

import kvcore.model as kvmodel
from support.paths import ROOT

SAY = "converting the SmolLM2 tokenizer once to /cache/x (about 10 s)"


def test_run_prints_the_conversion_message_once(monkeypatch, capsys):
    from kvcore.model.gguf_cache import _say
    from paged_kv_lab.cli.main import main

    real = kvmodel.load_model

    def fresh_machine(name, device="cpu", dtype="float32", progress=None):
        _say(progress, SAY)  # what the first load on a fresh machine says (gguf_cache.py)
        return real("tiny-random", "cpu", "float32")

    monkeypatch.setattr(kvmodel, "load_model", fresh_machine)
    scenario = ROOT / "paged_kv_lab" / "content" / "examples" / "shared_prefix.json"
    rc = main(["run", str(scenario), "--model", "tiny-random", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert (out + err).count(SAY) == 1, (out.count(SAY), err.count(SAY))
    assert SAY in err and "== step 1" in out, "the message on stderr, the run on stdout"
