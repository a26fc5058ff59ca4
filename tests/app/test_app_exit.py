"""The app's process exits cleanly after every page ran: each page of the registry opened under
Streamlit's AppTest in one subprocess (the tiny model, the server's warm-up on, a class started, the
Live page's demo server started), then the interpreter exits while the warm-up, the run store's
worker, the topic studies, the room server, the demo source and the watcher are still at work. The
process must exit with status 0 (a daemon thread torn down inside a model step or a ZeroMQ call
while the interpreter finalizes aborts it: SIGABRT, "terminate called without an active
exception"), with no thread but the main one left that is not a daemon, and none of the app's
background threads alive once the exit hooks ran (store/server_cache.py: stop_background)."""

import ast
import os
import subprocess
import sys
import textwrap

import pytest

from support.paths import ROOT

RUN_S = 420  # the subprocess's bound: pages about 1-2 min on two busy cores, the exit seconds
# the names of the threads the app starts (store/server_cache.py, store/run_store.py,
# classroom/rooms.py,
# fleet/demo_publisher.py, watch/watcher.py, kvcore/distributed/kv_events.py)
APP_THREADS = (
    "shared:",
    "run-store-worker",
    "paged-kv-lab-rooms",
    "kv-demo",
    "kv-events-watcher",
    "kv-events-publisher",
)

SCRIPT = textwrap.dedent("""
    import atexit, os, sys, threading
    # registered first, so it runs last: the threads alive once every other exit hook ran
    atexit.register(lambda: print("AT_EXIT", sorted(t.name for t in threading.enumerate()
                                                    if t is not threading.main_thread()),
                                  flush=True))
    from streamlit import config
    from streamlit.testing.v1 import AppTest
    from streamlit.util import calc_hash
    from paged_kv_lab.content.registry import pages

    config.set_option("server.address", "127.0.0.1")  # where the room server binds
    at = AppTest.from_file(sys.argv[1], default_timeout=float(sys.argv[2])).run()
    problems, opened = [], []

    def ran(where):
        opened.append(where)
        problems.extend((where, str(e.value)[:300]) for e in at.exception)

    ran("home")
    at.button(key="room_start:home").click().run()  # a class: the room server's thread
    ran("home: start a class")
    for p in pages()[1:]:  # the home page (the default, first) is open already
        # as tests/_app_helpers.open_page does: the pages are functions, routed by URL path
        at._page_hash = calc_hash(p.url_path)
        at.run()
        ran(p.id)
        if p.id == "live":  # the demo server: its fleet, its publishers, a watcher
            at.button(key="live:demo").click().run()
            ran("live: demo server")
    print("OPENED", opened, flush=True)
    print("PROBLEMS", problems, flush=True)
    print("THREADS", [(t.name, t.daemon) for t in threading.enumerate()], flush=True)
""")


def _line(out: str, tag: str):
    lines = [ln for ln in out.splitlines() if ln.startswith(tag + " ")]
    assert lines, f"no {tag} line in:\n{out[-3000:]}"
    return ast.literal_eval(lines[-1][len(tag) + 1 :])


@pytest.mark.early  # one long test: handed out first under xdist, not left to run alone last
@pytest.mark.timeout(RUN_S + 60)
def test_every_page_then_a_clean_exit():
    from paged_kv_lab.content.registry import pages

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PAGED_KV_LAB_MODEL": "tiny-random",
        "PAGED_KV_LAB_DEVICE": "cpu",
        "PAGED_KV_LAB_WARM_UP": "1",  # its thread is mid-work at exit: the abort's usual place
        "PAGED_KV_LAB_ROOMS_PORT": "",  # any free port
    }
    app = str(ROOT / "paged_kv_lab" / "streamlit_app.py")
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, app, str(RUN_S)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_S,
    )
    out = p.stdout + "\n" + p.stderr[-3000:]
    assert p.returncode == 0, f"exit status {p.returncode}:\n{out}"
    assert _line(p.stdout, "PROBLEMS") == [], out
    opened = _line(p.stdout, "OPENED")
    assert [x for x in opened if ":" not in x] == [pg.id for pg in pages()], "every page ran"
    threads = _line(p.stdout, "THREADS")
    assert [name for name, daemon in threads if not daemon] == ["MainThread"], threads
    started = {name for name, _ in threads}
    assert any(n.startswith("shared:") for n in started), f"the warm-up ran: {threads}"
    assert {"paged-kv-lab-rooms", "kv-demo"} <= started, threads
    left = [n for n in _line(p.stdout, "AT_EXIT") if n.startswith(APP_THREADS)]
    assert left == [], f"still running after the exit hooks: {left}\n{out}"
