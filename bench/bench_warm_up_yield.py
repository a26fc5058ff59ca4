"""What a page's script run waits for while work runs ahead of visitors in the same process, by
how that work gives way (issue 45, point 3: "the warm-up yields to visitors").

A "page" is a fixed piece of pure-Python work (a script run: building elements, encoding the
player's JSON) run in its own thread, timed by the wall clock. Beside it, two background threads do
what the server's warm-up does between its stop points: pure Python (opening runs, a replay's
slices) and small torch operations (a model step on the tiny model), in chunks of about 20 ms, with
``server_cache.stop_point()`` between chunks. The modes, interleaved round by round:

- ``alone``: no background work;
- ``compete``: the background threads run freely (the server before visitors came first);
- ``nice 19``: the same, each background thread at the lowest OS priority (``os.setpriority`` on
  its thread id: Linux schedules threads by their own nice value);
- ``yield``: the background threads run inside ``yielding()`` and the page inside
  ``VISITORS.drawing()`` (store/server_cache.py), as the warm-up and a page do in the app.

Prints the median and the worst page time of each mode, and the machine's load average.
Run: ``.venv/bin/python bench/bench_warm_up_yield.py [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import torch

from paged_kv_lab.store.server_cache import VISITORS, stop_point, yielding

CHUNK_S = 0.02  # one piece of background work between two stop points


def page_work() -> None:
    """A fixed amount of pure-Python work, like a script run's."""
    rows = [{"step": i, "blocks": list(range(i % 64)), "text": f"token {i}"} for i in range(4000)]
    for _ in range(3):
        json.loads(json.dumps(rows))


def python_chunk() -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < CHUNK_S:
        sum(i * i for i in range(2000))


def torch_chunk(a: torch.Tensor) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < CHUNK_S:
        a = torch.tanh(a @ a.T)[:, : a.shape[1]]


def background(stop: threading.Event, kind: str, mode: str) -> None:
    if mode == "nice 19":
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    a = torch.rand(128, 128)
    with yielding() if mode == "yield" else _nothing():
        while not stop.is_set():
            stop_point()
            python_chunk() if kind == "python" else torch_chunk(a)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def one_page(mode: str) -> float:
    stop = threading.Event()
    threads = []
    if mode != "alone":
        threads = [
            threading.Thread(target=background, args=(stop, kind, mode), daemon=True)
            for kind in ("python", "torch")
        ]
        for t in threads:
            t.start()
        time.sleep(0.2)  # the background is under way when the page comes
    took: list[float] = []

    def page() -> None:
        t0 = time.perf_counter()
        with VISITORS.drawing() if mode == "yield" else _nothing():
            page_work()
        took.append(time.perf_counter() - t0)

    p = threading.Thread(target=page)
    p.start()
    p.join()
    stop.set()
    for t in threads:
        t.join()
    VISITORS.wait_idle(5.0)  # the grace after the page, before the next round
    return took[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    modes = ("alone", "compete", "nice 19", "yield")
    times: dict[str, list[float]] = {m: [] for m in modes}
    load0 = os.getloadavg()[0]
    for r in range(args.rounds):
        for m in modes[r % len(modes) :] + modes[: r % len(modes)]:  # a rotating order
            times[m].append(one_page(m))
    load1 = os.getloadavg()[0]
    print(f"torch threads {torch.get_num_threads()}, load average {load0:.1f} -> {load1:.1f}")
    base = statistics.median(times["alone"])
    print(f"{'mode':<10} {'median s':>9} {'worst s':>8} {'x alone':>8}")
    for m in modes:
        med = statistics.median(times[m])
        print(f"{m:<10} {med:9.3f} {max(times[m]):8.3f} {med / base:8.2f}")


if __name__ == "__main__":
    main()
