"""How fast KV events go: msgpack decode, index apply, and publisher -> watcher over ZeroMQ.

    .venv/bin/python bench/bench_kv_events.py [--batches 20000] [--blocks 8]

Synthetic batches shaped like vLLM 0.34's (one BlockStored of ``--blocks`` 16-token blocks
and, every other batch, one BlockRemoved), uint64 hashes. The end-to-end figure is our
ZmqEventPublisher sending as fast as it can to a KVEventWatcher over ipc:// on this machine,
counted until every batch is applied (replay fills what the PUB socket drops).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from kvcore.distributed import kv_events as ke  # noqa: E402
from paged_kv_lab.watch.prefix_index import PrefixCacheIndex  # noqa: E402
from paged_kv_lab.watch.watcher import KVEventWatcher  # noqa: E402


def batches(n: int, blocks: int) -> list[ke.KVEventBatch]:
    rnd = random.Random(0)
    out, live = [], []
    for i in range(n):
        hashes = [rnd.getrandbits(64) for _ in range(blocks)]
        events = [
            ke.BlockStored(
                block_hashes=hashes,
                parent_block_hash=live[-1] if live else None,
                token_ids=[rnd.randrange(50_000) for _ in range(16 * blocks)],
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                extra_keys=[None] * blocks,
                group_idx=0,
                kv_cache_spec_kind="full_attention",
            )
        ]
        live.extend(hashes)
        if i % 2 and len(live) > blocks:
            events.insert(0, ke.BlockRemoved(block_hashes=[live.pop(0)], medium="GPU", group_idx=0))
        out.append(ke.KVEventBatch(ts=time.time(), events=events, data_parallel_rank=0))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=20_000)
    p.add_argument("--blocks", type=int, default=8)
    a = p.parse_args()
    bs = batches(a.batches, a.blocks)
    payloads = [ke.encode_batch(b) for b in bs]
    print(
        f"{a.batches} batches, {a.blocks} blocks each, "
        f"{sum(map(len, payloads)) / len(payloads):.0f} bytes/payload"
    )

    t = time.perf_counter()
    decoded = [ke.decode_batch(pl) for pl in payloads]
    dt = time.perf_counter() - t
    print(f"decode:        {a.batches / dt:10.0f} batches/s")

    index = PrefixCacheIndex()
    t = time.perf_counter()
    for b in decoded:
        for ev in b.events:
            index.apply(ev)
    dt = time.perf_counter() - t
    print(
        f"index apply:   {a.batches / dt:10.0f} batches/s ({sum(index.num_blocks().values())} "
        "blocks held)"
    )

    with tempfile.TemporaryDirectory() as d:
        pub_ep, replay_ep = f"ipc://{d}/pub", f"ipc://{d}/replay"
        pub = ke.ZmqEventPublisher(0, pub_ep, replay_ep, buffer_steps=a.batches + 1)
        w = KVEventWatcher(pub_ep, replay_ep).start()
        try:
            w.connected.wait(5)
            time.sleep(0.3)
            t = time.perf_counter()
            for pl in payloads:
                pub.publish_payload(pl)
            deadline = time.monotonic() + 120
            while (
                w.snapshot(with_state=False).stats.batches < a.batches
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
            dt = time.perf_counter() - t
            st = w.snapshot(with_state=False).stats
            print(
                f"end to end:    {st.batches / dt:10.0f} batches/s ({st.batches} applied, "
                f"{st.replayed_batches} through replay, {st.gaps} gaps, {st.lost_batches} lost)"
            )
        finally:
            w.stop()
            pub.shutdown()


if __name__ == "__main__":
    main()
