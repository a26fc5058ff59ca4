"""Clean shutdown: a process whose run store is computing a step, or whose watcher is connected,
exits with status 0, its background threads stopped before the interpreter tears down."""

import os
import subprocess
import sys
import textwrap

from support.paths import ROOT

SCRIPT = textwrap.dedent("""
    import atexit, threading, time
    # registered first, so it runs last: which of our threads are still alive by then?
    atexit.register(lambda: print("ALIVE", sorted(t.name for t in threading.enumerate()
                                                  if t.name in ("run-store-worker",
                                                                "kv-events-watcher")
                                                  and t.is_alive()), flush=True))
    from kvcore.model import load_model
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.store.timeline import lesson_run
    from paged_kv_lab.store.run_store import RunStore
    from paged_kv_lab.watch.watcher import KVEventWatcher
    store = RunStore()
    run = lesson_run(BY_ID["preemption"], load_model("tiny-random", "cpu"), store=store)
    run.run.want(10_000)
    deadline = time.monotonic() + 60
    while not run.records and time.monotonic() < deadline:
        time.sleep(0.01)
    watcher = KVEventWatcher("tcp://127.0.0.1:5599").start()
    print("STEPS", len(run.records), flush=True)
""")


def test_the_process_exits_cleanly_while_the_worker_and_a_watcher_run():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The abort this guards against was intermittent; that the threads are gone before the
    # interpreter tears down is not, so one run checks it.
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "STEPS" in p.stdout and "ALIVE []" in p.stdout, p.stdout + p.stderr[-2000:]
