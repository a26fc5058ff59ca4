"""The Python-side charts over steps: pure functions of engine records (no model). The per-step
pictures are the browser player's (tests/test_player.py, tests/test_browser.py)."""
from kvcore.engine import Engine, NoModelRunner
from kvcore.scenario import load_scenario
from lesson import figures as F


def engine_records(n_steps=6):
    scn = load_scenario({"engine": {"block_size": 4, "num_gpu_blocks": 10}, "requests": [
        {"id": "A", "prompt_token_ids": list(range(1, 11)), "max_tokens": 4},
        {"id": "B", "prompt_token_ids": list(range(1, 9)) + [50, 51], "max_tokens": 4, "arrival_step": 1}]})
    eng = Engine(scn, runner=NoModelRunner())
    first = eng.snapshot()
    return first, [eng.step() for _ in range(n_steps)]


def test_charts_from_engine_records():
    first, recs = engine_records()
    snaps = [first] + [r.snapshot for r in recs]
    m = F.metrics_over_time(snaps)
    assert list(m.data[0].x) == list(range(len(snaps)))
    b = F.token_budget(recs, 256)
    assert {t.name for t in b.data} >= {"A", "B", "max_num_batched_tokens"}
    assert sum(b.data[0].y) == sum(r.scheduled.get("A", 0) for r in recs)
    h = F.blocks_held(snaps)
    assert max(h.data[0].y) >= 3
