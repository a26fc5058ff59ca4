"""Memory soak: 1,000 playground steps through the run store, RSS sampled along the way.

Each round is what a playground visitor does: a new scenario (a request added with new text,
so a new run), Step through it to its end on a cursor, then move on (the old cursor dropped,
as when the session changes scenario or ends). The store keeps runs by bytes (LRU); the
process's memory must level off after warm-up instead of growing with every run.
Also prints the memory of each lesson's recorded run (the README's figure).

    .venv/bin/python bench/bench_soak.py [--model smollm2|tiny-random] [--steps 1000] \
        [--store-mb 64]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paged_kv_lab.content import BY_ID  # noqa: E402
from paged_kv_lab.run.budget import Limits  # noqa: E402
from paged_kv_lab.run.engine import Engine  # noqa: E402
from paged_kv_lab.run.scenario import load_scenario  # noqa: E402
from paged_kv_lab.store.run_store import RunStore  # noqa: E402
from paged_kv_lab.store.timeline import Timeline, lesson_scenario  # noqa: E402

WORDS = "paged attention keeps keys and values in blocks that requests share by hash".split()


def rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def playground(i: int, model: str) -> dict:
    base = BY_ID["playground"].scenario
    text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(6 + i % 5))
    reqs = list(base.get("requests", [])) + [
        {"id": f"Q{i}", "prompt": f"{i}: {text}", "max_tokens": 12, "arrival_step": i % 4}
    ]
    return {**base, "name": f"soak-{i}", "model": model, "requests": reqs}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get("PAGED_KV_LAB_MODEL", "smollm2"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--store-mb", type=int, default=64)
    args = ap.parse_args()
    from kvcore.model import load_model

    model = load_model(args.model, "cpu")
    store = RunStore(max_bytes=args.store_mb * 10**6, limits=Limits())
    key = (model.name, str(model.device), str(model.dtype))
    factory = lambda s: Engine(s, model=model)  # noqa: E731

    print(f"model {model.name}; memory of each lesson's recorded run (records + initial snapshot):")
    for lid, lesson in BY_ID.items():
        cursor = Timeline(
            store.run(
                lesson_scenario(lesson, model.num_layers, None, model.name), factory, key, model
            )
        )
        cursor.run_to_end(400, timeout=600)
        r = cursor.run
        print(
            f"  {lid:<12} {len(r.records):4d} steps  {r.nbytes / 1e6:7.2f} MB  "
            f"({r.nbytes / max(1, len(r.records)) / 1e3:.1f} kB/step)"
        )
        del cursor
    gc.collect()

    if args.steps <= 0:
        return
    steps, i, samples, t0 = 0, 0, [], time.perf_counter()
    start = rss()
    while steps < args.steps:
        cursor = Timeline(
            store.run(load_scenario(playground(i, model.name)), factory, key, model), ahead=False
        )
        while steps < args.steps and cursor.forward() is not None:
            steps += 1
            if steps % 100 == 0:
                gc.collect()
                samples.append((steps, rss(), store.total_bytes, len(store)))
        i += 1
        del cursor
    print(
        f"\n{args.steps} playground steps over {i} runs in {time.perf_counter() - t0:.0f} s; "
        f"store limit {args.store_mb} MB; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"{'steps':>6} {'RSS MB':>8} {'store MB':>9} {'runs':>5}")
    print(f"{0:6d} {start / 1e6:8.1f}")
    for s, r, b, n in samples:
        print(f"{s:6d} {r / 1e6:8.1f} {b / 1e6:9.1f} {n:5d}")
    warm = [r for s, r, _, _ in samples if s >= args.steps // 2]
    print(
        f"RSS over the second half: min {min(warm) / 1e6:.1f} MB, max {max(warm) / 1e6:.1f} MB "
        f"(growth {(max(warm) - min(warm)) / 1e6:.1f} MB)"
    )
    store.close()


if __name__ == "__main__":
    main()
