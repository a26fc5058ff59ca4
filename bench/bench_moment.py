"""A moment of a replay on the Real workloads page, the server's side of it, without a browser.

    PYTHONPATH=. .venv/bin/python bench/bench_moment.py [--requests 100] [--blocks 10000]
                                                        [--repeat 2]

The page's own path (paged_kv_lab/ui/workloads_page.py): the shipped trace's first ``--requests``
requests (0: the whole trace) replayed with the page's settings, its checkpoints filled and one
glimpse recorded ahead (``filled_and_warm``, what the page does once the replay shows), then, at
10 %, 50 % and 90 % of the run, a moment's glimpse recorded from the checkpoints and encoded for
the player (``pool_payload``, then JSON as Streamlit sends it), with the garbage collector paused
as the page pauses it. Each moment ``--repeat`` times; wall and CPU seconds of this thread, the
payload's bytes. What the browser adds (the trip, the parse, the drawing) is measured by
tests/browser/test_workloads_browser.py::test_a_moment_of_the_default_slice_opens_within_a_second.
Prints markdown; the load average with it.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=100, help="0: the whole shipped trace")
    ap.add_argument("--blocks", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    from paged_kv_lab.player.pool_payload import pool_payload
    from paged_kv_lab.store.server_cache import collector_paused
    from paged_kv_lab.ui.workloads_page import GLIMPSE, filled_and_warm
    from paged_kv_lab.workloads.page_data import (
        Settings,
        record_window,
        run_workload,
        shipped_trace,
        shipped_trace_path,
    )
    from paged_kv_lab.workloads.trace_formats import load_trace
    from paged_kv_lab.workloads.trace_limits import cli_trace_limits, page_trace_limits

    limits = page_trace_limits()
    if args.requests:
        trace = shipped_trace(0, args.requests, limits)
    else:  # the whole trace: past the page's default budget, under the command line's
        trace = load_trace(shipped_trace_path())
        limits = cli_trace_limits()
    settings = Settings(num_gpu_blocks=args.blocks)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    run = run_workload(trace, settings, limits)
    replay_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.thread_time()
    filled_and_warm(run)
    fill = (time.perf_counter() - t0, time.thread_time() - c0)
    steps = run.result.steps
    print(
        f"## A moment of {len(trace.requests):,} requests ({steps:,} steps, {args.blocks:,} blocks)"
    )
    print()
    print(
        f"replay {replay_s:.2f} s; checkpoints filled and one glimpse ahead {fill[0]:.2f} s "
        f"({fill[1]:.2f} CPU-s): {len(run.checkpoints)} checkpoints, "
        f"{run.checkpoints.nbytes / 1e6:.1f} MB"
    )
    print()
    print("| step | glimpse s (CPU s) | payload + JSON s (CPU s) | bytes |")
    print("|---:|---|---|---:|")
    for at in (steps // 10, steps // 2, steps - steps // 10):
        for _ in range(args.repeat):
            with collector_paused():
                t0, c0 = time.perf_counter(), time.thread_time()
                w = record_window(
                    run.trace,
                    run.settings,
                    at,
                    limits,
                    checkpoints=run.checkpoints,
                    show_before=GLIMPSE[0],
                    show_after=GLIMPSE[1],
                )
                t1, c1 = time.perf_counter(), time.thread_time()
                p = pool_payload(
                    w.frames,
                    num_gpu_blocks=w.num_gpu_blocks,
                    block_size=w.block_size,
                    start=w.start,
                )
                size = len(json.dumps(p))
                t2, c2 = time.perf_counter(), time.thread_time()
            print(
                f"| {at:,} | {t1 - t0:.3f} ({c1 - c0:.3f}) | {t2 - t1:.3f} ({c2 - c1:.3f}) "
                f"| {size:,} |"
            )
    print()
    print(f"load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
