"""Fairness of the run store: a victim's Step latency while long work runs in another session.

The victim steps a lesson at its frontier (each Step waits for the store's worker to compute
that step, as Step at the frontier does in the app). Meanwhile another "session" (a thread with
its own cursor, as a Streamlit script thread would be) does one long action:

  run_to_end   Run to end of a long playground scenario (4 requests x 80 tokens)
  far_step     a link with step=1000000000 on the same kind of scenario
  play         four sessions whose long runs are computed ahead (what Play streams)
  prefill      a large prefill: 4 prompts of 250 tokens in one step (max_num_batched_tokens 2048)

Reported: the victim's p50 / p90 Step latency alone and during each action, and the ratio.
``--think S`` makes the victim pause S seconds between Steps, as a person reading the step does
(the default 0 clicks back to back); during the pause the long work gets the engine.

    .venv/bin/python bench/bench_fairness.py [--model smollm2|tiny-random] [--steps 12] \
        [--think 0.3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from paged_kv_lab.content import BY_ID  # noqa: E402
from paged_kv_lab.run.budget import Limits  # noqa: E402
from paged_kv_lab.run.engine import Engine  # noqa: E402
from paged_kv_lab.run.scenario import load_scenario  # noqa: E402
from paged_kv_lab.store.run_store import RunStore  # noqa: E402
from paged_kv_lab.store.timeline import Timeline, lesson_scenario  # noqa: E402


def long_scenario(tag: str, model: str, prompt_tokens: int = 0) -> dict:
    reqs = [
        {
            "id": c,
            "max_tokens": 80,
            "ignore_eos": True,
            **(
                {"prompt_token_ids": [(7 * i + ord(c)) % 1000 + 1 for i in range(prompt_tokens)]}
                if prompt_tokens
                else {"prompt": f"{c} {tag} tells a long story about blocks"}
            ),
        }
        for c in "ABCD"
    ]
    eng = {
        "block_size": 16,
        "num_gpu_blocks": 200,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 2048 if prompt_tokens else 256,
    }
    return {"name": f"long-{tag}", "model": model, "engine": eng, "requests": reqs}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get("PAGED_KV_LAB_MODEL", "smollm2"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument(
        "--think", type=float, default=0.0, help="seconds the victim waits between Steps"
    )
    args = ap.parse_args()
    from kvcore.model import load_model

    model = load_model(args.model, "cpu")
    store = RunStore(limits=Limits())
    key = (model.name, str(model.device), str(model.dtype))
    factory = lambda s: Engine(s, model=model)  # noqa: E731
    lesson = BY_ID["prefix"]
    rounds = [0]

    def victim_latencies() -> list[float]:
        """Step at the frontier of a fresh copy of the lesson (a new run each round: nothing "
        "ahead)."""
        rounds[0] += 1
        sc = lesson_scenario(lesson, model.num_layers, {"seed": 1000 + rounds[0]}, model.name)
        cursor = Timeline(store.run(sc, factory, key, model), ahead=False)
        out = []
        for _ in range(args.steps):
            if args.think:
                time.sleep(args.think)
            t0 = time.perf_counter()
            rec = cursor.forward()
            out.append(time.perf_counter() - t0)  # a timed-out Step (None) counts with its wait
            if rec is None and cursor.run.done:
                break
        return out

    def run_to_end(tag):
        Timeline(
            store.run(load_scenario(long_scenario(tag, model.name)), factory, key, model)
        ).run_to_end(400, timeout=600)

    def far_step(tag):
        Timeline(
            store.run(load_scenario(long_scenario(tag, model.name)), factory, key, model)
        ).goto(1_000_000_000, timeout=600)

    def play(tag):
        cursors = [
            Timeline(
                store.run(
                    load_scenario(long_scenario(f"{tag}{k}", model.name)), factory, key, model
                )
            )
            for k in range(4)
        ]
        for c in cursors:
            c.run.wait(400, timeout=600)

    def prefill(tag):
        Timeline(
            store.run(
                load_scenario(long_scenario(tag, model.name, prompt_tokens=250)),
                factory,
                key,
                model,
            )
        ).run_to_end(400, timeout=600)

    victim_latencies()  # warm-up
    base = victim_latencies()
    print(
        f"model {model.name}, load average {os.getloadavg()[0]:.2f}; victim = lesson 'prefix', "
        f"{len(base)} Steps at the frontier per measurement, {args.think:g} s between them"
    )
    print(f"{'action elsewhere':<12} {'p50 ms':>8} {'p90 ms':>8} {'p50 / alone':>12}")
    b50 = statistics.median(base)
    print(f"{'(alone)':<12} {b50 * 1e3:8.0f} {pct(base, 0.9) * 1e3:8.0f} {1.0:12.2f}")
    for name, action in (
        ("run_to_end", run_to_end),
        ("far_step", far_step),
        ("play", play),
        ("prefill", prefill),
    ):
        th = threading.Thread(target=action, args=(f"{name}-{time.time()}",), daemon=True)
        th.start()
        time.sleep(0.3)  # the long work is under way
        lat = victim_latencies()
        busy = th.is_alive()
        print(
            f"{name:<12} {statistics.median(lat) * 1e3:8.0f} {pct(lat, 0.9) * 1e3:8.0f} "
            f"{statistics.median(lat) / b50:12.2f}"
            f"{'' if busy else '  (the action ended during the measurement)'}"
        )
        th.join(timeout=600)
    store.close()


if __name__ == "__main__":
    main()
