"""The demo source (fleet/demo_publisher.py): a fleet's KV events on ZeroMQ in vLLM's wire format,
read
back by the watcher into exactly the router's own index; ``python -m paged_kv_lab serve-events``."""

import json
import random
import time
from pathlib import Path

import pytest

from paged_kv_lab.cli.main import main
from paged_kv_lab.fleet.demo_publisher import DemoSource, demo_fleet, free_port_run, wait_until
from paged_kv_lab.watch.watcher import KVEventWatcher
from paged_kv_lab.workloads.trace_formats import load_trace
from support.paths import FIXTURES, ROOT

SLICE = FIXTURES / "traces" / "mooncake_slice.jsonl"


def ports(n: int) -> int:
    """The first of n free ports, searched from a random start: xdist workers running these
    tests at once would otherwise find the same run and race to bind it."""
    return free_port_run(n, start=random.randrange(20000, 50000))


def test_a_watcher_rebuilds_each_replicas_index_from_the_demo_stream():
    fleet = demo_fleet(load_trace(SLICE).slice(0, 12), replicas=3)
    port = ports(6)
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
    port = ports(2)
    args = ["serve-events", str(SLICE), "--requests", "3", "--pace-ms", "0", "--linger-s", "0"]
    args += ["--endpoint", f"tcp://127.0.0.1:{port}"]
    args += ["--replay-endpoint", f"tcp://127.0.0.1:{port + 1}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "--bind" in out and "batches published" in out


EXAMPLES = ROOT / "paged_kv_lab" / "content" / "examples"


def _tiny_scenario(tmp_path) -> Path:
    data = json.loads((EXAMPLES / "shared_prefix.json").read_text())
    data["model"] = "tiny-random"
    path = tmp_path / "shared_prefix_tiny.json"
    path.write_text(json.dumps(data))
    return path


def _cached_hashes(engine) -> set[str]:
    """The pool's cached blocks, keyed as its KV events name them."""
    from kvcore.core.kv_cache_utils import get_block_hash
    from kvcore.distributed.kv_events import external_hash_text

    pool = engine.kv_cache_manager.block_pool
    return {
        external_hash_text(get_block_hash(b.block_hash))
        for b in pool.blocks
        if b.block_hash is not None
    }


@pytest.mark.parametrize("replicas", [1, 2])
def test_serve_events_publishes_a_scenario_run_on_its_model(tmp_path, tiny_model, replicas):
    """``serve-events SCENARIO.json``: the watcher, fed only by the stream, ends up holding
    exactly the blocks the scenario's own run leaves cached (per replica with --replicas)."""
    from kvcore.config.kv_events import KVEventsConfig
    from paged_kv_lab.fleet.model_fleet import model_fleet
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.run.scenario import load_scenario

    path = _tiny_scenario(tmp_path)
    scenario = load_scenario(str(path))
    if replicas == 1:
        engine = Engine(scenario, model=tiny_model, kv_events=KVEventsConfig(True, "null"))
        engine.run()
        expected = [_cached_hashes(engine)]
    else:
        fleet = model_fleet(scenario, replicas, "round_robin", tiny_model)
        fleet.run()
        expected = [_cached_hashes(e) for e in fleet.replicas]
    assert all(expected) and len(set().union(*expected)) > 1
    port = ports(2 * replicas)
    endpoint, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + replicas}"
    watcher = KVEventWatcher(endpoint, replay, "", True, replicas).start()
    try:
        assert watcher.connected.wait(10)
        args = ["serve-events", str(path), "--pace-ms", "0", "--linger-s", "0"]
        args += ["--endpoint", endpoint, "--replay-endpoint", replay]
        args += ["--replicas", str(replicas), "--router", "round_robin"]
        assert main(args) == 0
        got = lambda: [set(watcher.entries(r, "GPU", "0")) for r in range(replicas)]  # noqa: E731
        assert wait_until(lambda: got() == expected, 10), (got(), expected)
        assert watcher.snapshot(False).stats.garbage_messages == 0
    finally:
        watcher.stop()


def test_serve_events_refuses_a_bad_scenario_and_replica_count(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"engine": {"block_size": 0}}')
    assert main(["serve-events", str(bad), "--linger-s", "0"]) == 2
    assert "block_size" in capsys.readouterr().err
    good = _tiny_scenario(tmp_path)
    assert main(["serve-events", str(good), "--replicas", "0", "--linger-s", "0"]) == 2
    assert "--replicas 0" in capsys.readouterr().err
