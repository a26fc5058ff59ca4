"""An ``alone`` test's figures are its own (tests/conftest.py): while it runs, the other xdist
workers and the servers they listed (tests/support/browser.py: register_worker,
registered_server) are stopped, and they go on afterwards; this worker's own servers keep
running."""

import os
import signal
import subprocess
import time

from support.browser import SERVERS_ENV, others_paused, registered_server, resume_mine


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def wait_state(pid: int, want: set, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while (got := state(pid)) not in want and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


def test_other_workers_servers_stop_for_the_block_and_this_workers_run_on(tmp_path, monkeypatch):
    folder = tmp_path / "servers"
    monkeypatch.setenv(SERVERS_ENV, str(folder))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    procs = [
        subprocess.Popen(["sleep", "30"], start_new_session=True),
        subprocess.Popen(["sleep", "30"], start_new_session=True),
    ]
    other, mine = procs
    try:
        (folder).mkdir()
        (folder / f"gw3.{other.pid}").touch()  # another worker's server
        with registered_server(mine.pid):  # this worker's
            assert sorted(os.listdir(folder)) == sorted([f"gw3.{other.pid}", f"gw7.{mine.pid}"])
            with others_paused(str(folder)) as paused:
                assert paused == [f"gw3.{other.pid}"]
                assert wait_state(other.pid, {"T", "t"}) in ("T", "t")
                assert state(mine.pid) in ("S", "R")
            assert wait_state(other.pid, {"S", "R"}) in ("S", "R")
        assert os.listdir(folder) == [f"gw3.{other.pid}"]  # this worker's entry went with it
        # an alone test's worker killed mid-pause: the owner's next test continues its server
        os.killpg(other.pid, signal.SIGSTOP)
        assert wait_state(other.pid, {"T", "t"}) in ("T", "t")
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
        resume_mine(str(folder))
        assert wait_state(other.pid, {"S", "R"}) in ("S", "R")
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_another_workers_process_stops_for_the_block_too(tmp_path, monkeypatch):
    folder = tmp_path / "servers"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    worker = subprocess.Popen(["sleep", "30"])  # stands for another worker's process
    try:
        folder.mkdir()
        (folder / f"gw2.p{worker.pid}").touch()
        with others_paused(str(folder)) as paused:
            assert paused == [f"gw2.p{worker.pid}"]
            assert wait_state(worker.pid, {"T", "t"}) in ("T", "t")
        assert wait_state(worker.pid, {"S", "R"}) in ("S", "R")
    finally:
        worker.kill()
        worker.wait()
