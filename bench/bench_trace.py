"""What reading a trace file and rendering its events cost (block manager only, no model).

    .venv/bin/python bench/bench_trace.py [--requests 40] [--repeat 3]

A run of ``--requests`` requests (shared 40-token prefixes, 30 output tokens each) on a
400-block pool is written as a trace with the CLI's own line writers; then, best of
``--repeat``: ``read_trace`` (every line checked by pydantic), ``Event.to_dict`` /
``Event.from_dict`` per event, and one sentence per event in each language.
"""

from __future__ import annotations

import argparse
import json
import time

from paged_kv_lab.recording.events import Event
from paged_kv_lab.run import trace_file as trace
from paged_kv_lab.run.engine import Engine, NoModelRunner
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario, scenario_to_dict
from paged_kv_lab.why.sentences import sentence


def make_trace(num_requests: int) -> str:
    reqs = tuple(
        RequestSpec(
            f"r{i}",
            prompt_token_ids=tuple([i % 5] * 40 + list(range(100 + i, 140 + i))),
            max_tokens=30,
            arrival_step=i,
            ignore_eos=True,
        )
        for i in range(num_requests)
    )
    settings = EngineSettings(
        block_size=8, num_gpu_blocks=400, max_num_batched_tokens=256, hash_algo="sha256"
    )
    eng = Engine(Scenario(name="bench", engine=settings, requests=reqs), runner=NoModelRunner())
    lines = [trace.header_line(scenario_to_dict(eng.scenario), eng.snapshot())]
    lines += [trace.step_line(r) for r in eng.run()]
    lines.append(trace.outputs_line(eng.outputs()))
    return "\n".join(lines) + "\n"


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    text = make_trace(args.requests)
    t = trace.read_trace(text)
    evs = [e for r in t.records for e in r.events]
    dicts = [json.loads(json.dumps(e.to_dict())) for e in evs]
    read = best(lambda: trace.read_trace(text), args.repeat)
    to_d = best(lambda: [e.to_dict() for e in evs], args.repeat)
    from_d = best(lambda: [Event.from_dict(d) for d in dicts], args.repeat)
    say = best(lambda: [sentence(e, lang) for e in evs for lang in ("en", "zh")], args.repeat)
    mb = len(text.encode()) / 1e6
    print(
        f"| trace: {len(t.records)} steps, {len(evs)} events, {mb:.1f} MB | best of {args.repeat} |"
    )
    print("|---|---|")
    print(f"| read_trace (pydantic, strict) | {read:.2f} s ({mb / read:.0f} MB/s) |")
    print(f"| Event.to_dict | {to_d / len(evs) * 1e6:.1f} µs/event |")
    print(f"| Event.from_dict | {from_d / len(evs) * 1e6:.1f} µs/event |")
    print(f"| sentence (EN + ZH) | {say / len(evs) / 2 * 1e6:.1f} µs/sentence |")


if __name__ == "__main__":
    main()
