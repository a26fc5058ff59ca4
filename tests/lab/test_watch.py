"""The KV-event watcher through real ZeroMQ sockets on 127.0.0.1 (every wait bounded)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import zmq

from kvcore.distributed import kv_events as ke
from paged_kv_lab.watch.prefix_index import leading_hits
from paged_kv_lab.watch.watcher import KVEventWatcher
from support.kv_pub import ScriptedPublisher, bind_free, fixture, wait_for
from support.paths import ROOT


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def publisher(ctx):
    pub = ScriptedPublisher(ctx)
    yield pub
    pub.close()


def watcher_for(pub, ctx, **kw):
    return KVEventWatcher(pub.endpoint, pub.replay_endpoint, topic="kv-events", context=ctx, **kw)


def test_a_late_watcher_catches_up_through_the_startup_replay(publisher, ctx):
    expected, frames = fixture("eviction")
    for topic, seq, payload in frames:  # all sent before anyone listens: lost live
        publisher.send(topic, seq, payload)
    w = watcher_for(publisher, ctx).start()
    try:
        assert wait_for(lambda: w.snapshot().stats.batches == len(frames))
        snap = w.snapshot()
        assert snap.ranks[0].state == expected["final_state"]
        assert snap.ranks[0].next_seq == len(frames)
        assert snap.stats.replayed_batches == len(frames) and snap.stats.lost_batches == 0
    finally:
        w.stop()


def test_a_dropped_live_frame_is_detected_and_refilled_from_replay(publisher, ctx):
    expected, frames = fixture("hybrid")
    w = watcher_for(publisher, ctx).start()
    try:
        assert w.connected.wait(5)
        assert wait_for(lambda: publisher.replay_requests >= 1)
        time.sleep(0.3)  # the subscription has reached the PUB socket
        for topic, seq, payload in frames:
            publisher.send(topic, seq, payload, live=(seq != 2))
        assert wait_for(lambda: w.snapshot().stats.batches == len(frames))
        snap = w.snapshot()
        assert snap.stats.gaps >= 1 and snap.stats.lost_batches == 0
        assert snap.ranks[0].state == expected["final_state"]
        checkpoint = expected["checkpoints"][0]
        assert checkpoint["after_seq"] < len(frames)
    finally:
        w.stop()


def _pair(ctx):
    """Two publishers on consecutive ports (rank 0 on P, rank 1 on P + 1), as vLLM lays ranks
    out."""
    for _ in range(20):
        first = ScriptedPublisher(ctx)
        try:
            second = ScriptedPublisher(ctx, first.pub_port + 1, first.replay_port + 1)
            return first, second
        except zmq.ZMQError:
            first.close()
    pytest.skip("no two consecutive free ports")


def test_two_ranks_each_with_its_own_seq_and_cache(ctx):
    r0, r1 = _pair(ctx)
    exp0, frames0 = fixture("shared_prefix")
    exp1, frames1 = fixture("eviction")
    w = KVEventWatcher(
        r0.endpoint, r0.replay_endpoint, topic="kv-events", data_parallel_size=2, context=ctx
    )
    try:
        assert (
            w.ranks[1].endpoint == r1.endpoint and w.ranks[1].replay_endpoint == r1.replay_endpoint
        )
        for topic, seq, payload in frames0:
            r0.send(topic, seq, payload)
        w.start()
        assert w.connected.wait(5)
        time.sleep(0.3)
        for topic, seq, payload in frames1:
            r1.send(topic, seq, payload)
        assert wait_for(lambda: w.snapshot().stats.batches == len(frames0) + len(frames1))
        snap = w.snapshot()
        assert (
            snap.ranks[0].state == exp0["final_state"]
            and snap.ranks[1].state == exp1["final_state"]
        )
        assert snap.ranks[0].next_seq == len(frames0) and snap.ranks[1].next_seq == len(frames1)
        assert snap.dump()["groups"] == exp0["final_state"]["groups"]
    finally:
        w.stop()
        r0.close()
        r1.close()


def test_a_seq_going_back_means_a_restarted_server_and_clears_the_cache(publisher, ctx):
    expected, frames = fixture("shared_prefix")
    w = watcher_for(publisher, ctx).start()
    try:
        assert w.connected.wait(5)
        time.sleep(0.3)
        for topic, seq, payload in frames:
            publisher.send(topic, seq, payload)
        assert wait_for(lambda: w.snapshot().stats.batches == len(frames))
        # A new server process: seq 0 again, another payload, an empty cache then one store.
        fresh = ke.encode_batch(
            ke.KVEventBatch(
                ts=1.0,
                events=[
                    ke.BlockStored(
                        block_hashes=[42],
                        parent_block_hash=None,
                        token_ids=[1, 2, 3, 4],
                        block_size=4,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                        group_idx=0,
                    )
                ],
                data_parallel_rank=0,
            )
        )
        publisher.buffer.clear()
        publisher.send("kv-events", 0, fresh)
        assert wait_for(lambda: w.snapshot().stats.restarts == 1)
        assert wait_for(
            lambda: list(w.snapshot().ranks[0].state["groups"].get("0", {})) == ["000000000000002a"]
        )
    finally:
        w.stop()


def test_garbage_is_counted_and_skipped_and_the_stream_goes_on(publisher, ctx):
    expected, frames = fixture("eviction")
    w = watcher_for(publisher, ctx, max_payload_bytes=1 << 20).start()
    try:
        assert w.connected.wait(5)
        time.sleep(0.3)
        publisher.send_raw([b"kv-events", b"only two frames"])
        publisher.send_raw([b"kv-events", b"\x00\x01", b"seq frame too short"])
        publisher.send_raw([b"kv-events", (10**6).to_bytes(8, "big"), os.urandom(64), b"extra"])
        n = len(frames)
        publisher.send("kv-events", 0, frames[0][2])
        publisher.send("kv-events", 1, os.urandom(200))  # undecodable
        publisher.send("kv-events", 2, b"\x93" + b"\x00" * (2 << 20))  # over the size cap
        for topic, seq, payload in frames[3:]:
            publisher.send(topic, seq, payload)
        assert wait_for(lambda: w.snapshot().stats.batches >= n - 2)
        st = w.snapshot().stats
        assert st.garbage_messages >= 4 and st.oversized_messages >= 1
        assert w.running and w.snapshot().error is None
    finally:
        w.stop()


def test_leading_hits_hashes_a_prompt_as_the_server_did():
    expected, frames = fixture("eviction")
    from paged_kv_lab.watch.prefix_index import PrefixCacheIndex

    index = PrefixCacheIndex()
    for _, _, payload in frames[:5]:  # up to before_eviction
        for ev in ke.decode_batch(payload).events:
            index.apply(ev)
    held = index.tiers[("GPU", "0")]
    e2 = next(op for op in expected["ops"] if op.get("req") == "E2")["tokens"]
    e4 = next(op for op in expected["ops"] if op.get("req") == "E4")
    n, texts = leading_hits(held, e2, 4, "sha256", "0")
    assert n == 4 and len(texts) == 4
    # another seed, other hashes
    assert leading_hits(held, e2, 4, "sha256", "vllm-none-hash")[0] == 0
    assert leading_hits(held, e4["tokens"], 4, "sha256", "0", cache_salt="tenant-b")[0] == 3
    assert leading_hits(held, [5] + e2[1:], 4, "sha256", "0")[0] == 0


@pytest.mark.parametrize("name", ["eviction", "hybrid", "shared_prefix", "shared_prefix_bytes"])
def test_an_index_without_token_ids_keeps_everything_else(name):
    """The fleet's router index (keep_tokens=False) ends as the full one, token ids apart, on
    every recorded vLLM stream (stores aligned and sparse, repeats, removals, clears)."""
    from paged_kv_lab.watch.prefix_index import PrefixCacheIndex

    full, lean = PrefixCacheIndex(), PrefixCacheIndex(keep_tokens=False)
    for _, _, payload in fixture(name)[1]:
        for ev in ke.decode_batch(payload).events:
            full.apply(ev)
            lean.apply(ev)
            for medium in full.media():
                want = full.state(medium)
                for group in want["groups"].values():
                    for entry in group.values():
                        entry["token_ids"] = None
                assert lean.state(medium) == want
    assert lean.num_blocks() == full.num_blocks() and full.num_blocks()
    assert lean.group_info == full.group_info and lean.media() == full.media()


def test_our_engine_publishes_frames_the_watcher_reads_as_vllm_events(ctx, tmp_path):
    from support.kv_events import engine_for, run_ops  # the same ops as the fixture tests

    expected, frames = fixture("eviction")
    pub_ep, replay_ep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"  # ipc: vLLM binds it
    got = []
    w = KVEventWatcher(
        pub_ep,
        replay_ep,
        topic="kv-events",
        context=ctx,
        on_batch=lambda rank, seq, batch, replayed: got.append((seq, batch)),
    )
    eng = engine_for(expected, endpoint=pub_ep, replay_endpoint=replay_ep, topic="kv-events")
    try:
        w.start()
        assert w.connected.wait(5)
        run_ops(expected, eng)
        assert wait_for(lambda: len(got) == len(frames))
        for (seq, batch), (_, want_seq, payload) in zip(got, frames):
            want = ke.decode_batch(payload)
            assert seq == want_seq and batch.events == want.events and batch.data_parallel_rank == 0
        assert w.snapshot().ranks[0].state == expected["final_state"]
    finally:
        w.stop()
        eng.close()


def test_cli_watch_dumps_the_fixture_state_and_stops_cleanly_on_sigterm(publisher, tmp_path):
    expected, frames = fixture("eviction")
    out = tmp_path / "state.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "paged_kv_lab",
            "watch",
            publisher.endpoint,
            "--replay",
            publisher.replay_endpoint,
            "--topic",
            "kv-events",
            "--dump-state",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(out.exists, 20), "no state file once connected"
        assert json.loads(out.read_text())["groups"] == {}
        time.sleep(0.3)
        for topic, seq, payload in frames:
            publisher.send(topic, seq, payload)

        def done():
            try:
                return json.loads(out.read_text())["groups"] == expected["final_state"]["groups"]
            except (OSError, ValueError):
                return False

        assert wait_for(done, 15)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=10)
        assert proc.returncode == 0, stderr
        assert "rank 0 seq 9" in stdout and "cleared all blocks" in stdout
        final = json.loads(out.read_text())
        assert final["groups"] == expected["final_state"]["groups"]
        assert final["stats"]["batches"] == len(frames)
        assert not list(tmp_path.glob(".kv-state-*"))  # no temp file left behind
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_cli_watch_stops_after_duration_and_refuses_bad_endpoints(tmp_path):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    port = bind_free(sock)
    sock.close(0)
    ctx.destroy(0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "paged_kv_lab",
            "watch",
            f"tcp://127.0.0.1:{port}",
            "--duration",
            "1",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and time.monotonic() - t0 < 25
    r = subprocess.run(
        [sys.executable, "-m", "paged_kv_lab", "watch", "http://example.com"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2 and "endpoint" in r.stderr


def test_a_scenario_with_engine_kv_events_publishes_every_step_that_had_events(ctx, tmp_path):
    from paged_kv_lab.run.engine import Engine, NoModelRunner
    from paged_kv_lab.run.scenario import load_scenario
    from paged_kv_lab.watch.prefix_index import PrefixCacheIndex

    pub_ep, replay_ep = f"ipc://{tmp_path}/p", f"ipc://{tmp_path}/r"
    scenario = load_scenario(
        {
            "model": "tiny-random",
            "engine": {
                "block_size": 4,
                "num_gpu_blocks": 10,
                "hash_algo": "sha256",
                "kv_events": {
                    "enable_kv_cache_events": True,
                    "endpoint": pub_ep,
                    "replay_endpoint": replay_ep,
                    "topic": "lab",
                },
            },
            "requests": [
                {"id": "a", "prompt_token_ids": list(range(1, 14)), "max_tokens": 6},
                {
                    "id": "b",
                    "prompt_token_ids": list(range(1, 9)) + [99] * 9,
                    "max_tokens": 6,
                    "arrival_step": 2,
                },
            ],
        }
    )
    # a file alone opens no socket
    assert Engine(scenario, runner=NoModelRunner()).kv_event_publisher is None
    # as the CLI does
    eng = Engine(scenario, runner=NoModelRunner(), kv_events=scenario.engine.kv_events)
    w = KVEventWatcher(pub_ep, replay_ep, topic="lab", context=ctx).start()
    try:
        assert w.connected.wait(5)
        time.sleep(0.2)
        mine = PrefixCacheIndex()
        sent = 0
        while eng.has_unfinished():
            eng.step()
            if eng.last_kv_event_batch is not None:
                sent += 1
                for ev in eng.last_kv_event_batch.events:
                    mine.apply(ev)
        assert sent >= 3
        assert wait_for(lambda: w.snapshot().stats.batches == sent)
        assert w.snapshot().ranks[0].state == mine.state() and mine.state()["groups"]["0"]
    finally:
        w.stop()
        eng.close()


def test_our_publisher_sends_vllms_live_frames_and_answers_replay_as_vllm_did(ctx, tmp_path):
    import base64

    from support.kv_pub import FIXTURES

    expected, frames = fixture("eviction")
    example = json.loads((FIXTURES / "eviction.replay_example.json").read_text())
    pub = ke.ZmqEventPublisher(
        0, f"ipc://{tmp_path}/p", f"ipc://{tmp_path}/r", topic="kv-events", context=ctx
    )
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(pub.replay_endpoint)
    try:
        time.sleep(0.3)
        for _, _, payload in frames:
            pub.publish_payload(payload)
        for topic, seq, payload in frames:
            assert sub.poll(5000)
            assert sub.recv_multipart() == [topic.encode(), seq.to_bytes(8, "big"), payload]
        dealer.send_multipart([base64.b64decode(f) for f in example["request"]["dealer_sends"]])
        for reply in example["replies"]:
            assert dealer.poll(5000)
            assert dealer.recv_multipart() == [base64.b64decode(f) for f in reply["frames_b64"]]
        dealer.send_multipart([b"", b"\x00", b"a third frame"])  # not a replay request: no answer
        assert not dealer.poll(300)
    finally:
        sub.close(0)
        dealer.close(0)
        pub.shutdown()
