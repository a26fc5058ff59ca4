"""What the myths and the quiz say, step by step, on runs without a model that reach every branch
of the myths' live lines and of the quiz, in EN and 中文 (pinned in tests/fixtures/words_pinned.json
by tests/lab/test_words_pinned.py), and ``FULL_RUN_S``, how long a test waits for a run's end.

``PAGED_KV_LAB_UPDATE_WORDS=1 .venv/bin/python -m pytest tests/lab/test_words_pinned.py`` rewrites
the fixture; only do that for a change of wording that is meant (say so in the commit)."""

from __future__ import annotations

import hashlib
import json

from paged_kv_lab.run.engine import Engine, NoModelRunner
from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.store.timeline import LabRun
from support.paths import FIXTURES

# Run to end, in a test: until the run has ended (the app's few seconds are a visitor's wait; on a
# loaded machine the background recording can take longer)
FULL_RUN_S = 120

FIXTURE = FIXTURES / "words_pinned.json"
LANGS = ("en", "zh")
PREFER = ((), ("preempted",), ("evicted",), ("cache_hit",), ("allocated",), ("touched",))


def _req(rid, ids, max_tokens, arrival=0):
    return {
        "id": rid,
        "prompt_token_ids": list(ids),
        "max_tokens": max_tokens,
        "arrival_step": arrival,
        "ignore_eos": True,
    }


# Each run reaches some branches: hits and evictions; preemptions; a CPU tier whose load fails;
# a sliding-window model and a hybrid one (the quiz's miss sentence per group kind).
SCENARIOS = {
    "evict": {
        "engine": {"block_size": 4, "num_gpu_blocks": 12, "max_num_seqs": 3},
        "requests": [
            _req("A", range(1, 14), 4),
            _req("B", range(100, 128), 6, 4),
            _req("C", range(1, 14), 4, 10),
        ],
    },
    "preempt": {
        "engine": {"block_size": 2, "num_gpu_blocks": 8, "max_num_seqs": 3},
        "requests": [_req(r, [i + 1, i + 2], 8) for i, r in enumerate("ABC")],
    },
    "priority": {
        "engine": {"block_size": 2, "num_gpu_blocks": 8, "max_num_seqs": 3, "policy": "priority"},
        "requests": [
            dict(_req(r, [i + 1, i + 2, i + 3], 8), priority=p)
            for i, (r, p) in enumerate(zip("ABC", (1, 0, 2)))
        ],
    },
    "cpu_tier": {
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 7,
            "cpu_offload": {
                "num_cpu_blocks": 12,
                "fail_loads": ["C"],
                "kv_load_failure_policy": "recompute",
            },
        },
        "requests": [
            _req("A", range(16), 3),
            _req("B", range(100, 116), 3, 4),
            _req("C", range(16), 3, 8),
        ],
    },
    "sliding": {
        "engine": {"block_size": 4, "num_gpu_blocks": 16, "sliding_window": 8},
        "requests": [_req("A", range(1, 18), 3), _req("B", range(1, 18), 3, 6)],
    },
    "hybrid": {
        "engine": {
            "block_size": 4,
            "num_gpu_blocks": 24,
            "sliding_window": 8,
            "layer_types": ["full_attention", "sliding_attention"],
        },
        "requests": [_req("A", range(1, 18), 3), _req("B", range(50, 60), 3, 2)],
    },
}


def new_run(name: str) -> LabRun:
    return LabRun(
        load_scenario(SCENARIOS[name]), lambda s: Engine(s, runner=NoModelRunner(), debug=True)
    )


def myths_and_quiz(name: str) -> dict:
    """Every myth section and every quiz question of run ``name``, at every step, in each
    language: the distinct texts in order of first appearance, and a digest of all of them in
    order (so a text said at another step than before fails too)."""
    from paged_kv_lab.content.myths import myth_sections
    from paged_kv_lab.content.quiz import make_prediction

    run = new_run(name)
    run.run_to_end(timeout=FULL_RUN_S)
    snaps, records = run.snapshots(), run.records
    out = {}
    for lang in LANGS:
        seq, seen = [], {}
        for i in range(1, len(snaps) + 1):
            for with_records in (True, False):
                secs = myth_sections(snaps[:i], lang, records[: i - 1] if with_records else None)
                for k, sec in enumerate(secs):
                    for part, text in zip(("claim", "truth", "live"), sec):
                        item = json.dumps(["myth", k, part, text], ensure_ascii=False)
                        seq.append(item)
                        seen.setdefault(item, None)
            if i < len(snaps):
                for prefer in PREFER:
                    p = make_prediction(snaps[i - 1], records[i - 1], lang, prefer)
                    if p is None:
                        continue
                    item = json.dumps(
                        ["quiz", p.kind, p.prompt, list(p.options), p.answer, p.explain],
                        ensure_ascii=False,
                    )
                    seq.append(item)
                    seen.setdefault(item, None)
        out[lang] = {
            "digest": hashlib.sha256("\n".join(seq).encode()).hexdigest(),
            "texts": [json.loads(s) for s in seen],
        }
    return out


def everything() -> dict:
    return {"runs": {name: myths_and_quiz(name) for name in SCENARIOS}}
