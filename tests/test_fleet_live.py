"""The demo source (fleet/demo.py): a fleet's KV events on ZeroMQ in vLLM's wire format, read
back by the watcher into exactly the router's own index; ``python -m kvcore serve-events``."""

import time
from pathlib import Path

from paged_kv_lab.cli.main import main
from paged_kv_lab.fleet.demo import DemoSource, demo_fleet, free_port_run, wait_until
from paged_kv_lab.watch.watcher import KVEventWatcher
from paged_kv_lab.workload.trace import load_trace

SLICE = Path(__file__).parent / "fixtures" / "traces" / "mooncake_slice.jsonl"


def test_a_watcher_rebuilds_each_replicas_index_from_the_demo_stream():
    fleet = demo_fleet(load_trace(SLICE).slice(0, 12), replicas=3)
    port = free_port_run(6)
    endpoint, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 3}"
    watcher = KVEventWatcher(endpoint, replay, "", True, 3).start()
    source = None
    try:
        assert watcher.connected.wait(10)
        source = DemoSource(fleet, endpoint, replay, pace_ms=0).start()
        assert wait_until(source.finished.is_set, 60)
        assert wait_until(lambda: watcher.snapshot(False).stats.batches >= source.sent, 10)
        time.sleep(0.3)
        for r in range(3):
            assert set(watcher.entries(r, "GPU", "0")) == set(fleet.index.blocks(r))
        assert sum(len(fleet.index.blocks(r)) for r in range(3)) > 0
        assert watcher.snapshot(False).stats.garbage_messages == 0
    finally:
        if source is not None:
            source.stop()
        watcher.stop()


def test_serve_events_cli_publishes_and_ends(capsys):
    port = free_port_run(2)
    args = ["serve-events", str(SLICE), "--requests", "3", "--pace-ms", "0", "--linger-s", "0"]
    args += ["--endpoint", f"tcp://127.0.0.1:{port}"]
    args += ["--replay-endpoint", f"tcp://127.0.0.1:{port + 1}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "--bind" in out and "batches published" in out
