"""kvcore benchmark: BlockPool operations are O(1) per block; cost of a scheduler step.

Pool operations (recorder off: no observer attached, prefix caching on, KV cache
events on as the engine has them) are timed on pools of 10k and 100k blocks. Each operation is
driven over the *whole* pool in chunks of ``CHUNK`` blocks and reported in microseconds per
block; if an operation is O(1) per block, the 100k figure equals the 10k one (ratio ~1):

- ``get_new_blocks``                 pop from the head of the free queue (no hashes to drop)
- ``cache_full_blocks``              hash full blocks into the prefix-cache map (+ BlockStored)
- ``free_blocks``                    ref_cnt -= 1 and queue hashed blocks at the tail
- ``touch``                          a prefix hit pulls free blocks out of the middle of the queue
- ``get_new_blocks (evicting)``      pop blocks that still carry a hash: lazy eviction +
                                     BlockRemoved

Two more rows show what the *recorder* costs when it is on (the Engine always has one):
``touch`` with the recorder reports each block's position in the free queue (a key lookup and a
bisect, no walk of the queue) -- reported per call.

The scheduler step is timed with 256 running requests in decode (Engine + NoModelRunner, no
torch), with the Snapshot the engine takes after every step and without it.

    python bench/bench_kvcore.py            # full run (about a minute)
    python bench/bench_kvcore.py --quick    # one repeat, fewer steps (~10 s)

Runs are repeated and the best kept, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.timing import timed_without_gc  # noqa: E402
from kvcore.core.block_pool import BlockPool  # noqa: E402
from kvcore.utils.math_utils import cdiv
from paged_kv_lab.recording.recorder import Recorder  # noqa: E402
from paged_kv_lab.run.engine import Engine, NoModelRunner  # noqa: E402
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario  # noqa: E402

BLOCK_SIZE = 16
CHUNK = 32  # blocks per call, like a request's table growing by a prompt's worth


class FakeRequest:
    """What cache_full_blocks reads from a request: its hashes, tokens and extra keys."""

    def __init__(self, index: int, num_blocks: int) -> None:
        self.block_hashes = [
            index.to_bytes(8, "big") + i.to_bytes(8, "big") for i in range(num_blocks)
        ]
        self.all_token_ids = list(range(num_blocks * BLOCK_SIZE))

    def extra_keys_for_block(self, i: int):
        return None


def pool_round(num_blocks: int) -> dict[str, float]:
    """One pass of every operation over the whole pool; seconds per block for each."""
    n_chunks = num_blocks // CHUNK
    pool = BlockPool(n_chunks * CHUNK + 1, True, BLOCK_SIZE, True)
    reqs = [FakeRequest(i, CHUNK) for i in range(n_chunks)]
    chunks: list[list] = []
    out: dict[str, float] = {}
    n = n_chunks * CHUNK

    def alloc():
        for _ in range(n_chunks):
            chunks.append(pool.get_new_blocks(CHUNK))

    out["get_new_blocks"] = timed_without_gc(alloc) / n

    def cache():
        for req, blocks in zip(reqs, chunks):
            pool.cache_full_blocks(req, blocks, 0, CHUNK, BLOCK_SIZE, 0)

    out["cache_full_blocks"] = timed_without_gc(cache) / n
    pool.take_events()

    def free():
        for blocks in chunks:
            pool.free_blocks(reversed(blocks))

    out["free_blocks"] = timed_without_gc(free) / n

    # Touch the chunks middle-out, so blocks leave from the middle of the queue.
    order = sorted(range(n_chunks), key=lambda i: abs(i - n_chunks // 2))

    def touch():
        for i in order:
            pool.touch(chunks[i])

    out["touch"] = timed_without_gc(touch) / n
    for blocks in chunks:
        pool.free_blocks(reversed(blocks))
    chunks.clear()

    def alloc_evicting():
        for _ in range(n_chunks):
            chunks.append(pool.get_new_blocks(CHUNK))

    out["get_new_blocks (evicting)"] = timed_without_gc(alloc_evicting) / n
    assert len(pool.cached_block_hash_to_block) == 0
    pool.take_events()
    return out


def touch_with_recorder(num_blocks: int, calls: int) -> float:
    """Seconds per touch() call of one free block when the recorder is on."""
    pool = BlockPool(num_blocks + 1, True, BLOCK_SIZE, True)
    rec = Recorder().attach_block_pool(pool)
    blocks = pool.get_new_blocks(num_blocks)
    pool.free_blocks(blocks)
    mid = blocks[num_blocks // 2 : num_blocks // 2 + calls]

    def run():
        for b in mid:
            pool.touch([b])

    t = timed_without_gc(run) / len(mid)
    rec.drain()
    return t


def best(fn, repeat: int):
    runs = [fn() for _ in range(repeat)]
    if isinstance(runs[0], dict):
        return {k: min(r[k] for r in runs) for k in runs[0]}
    return min(runs)


# -- scheduler step --------------------------------------------------------------------------------
def scheduler_steps(num_reqs: int, steps: int, snapshot: bool) -> tuple[float, float, int]:
    """Median seconds per decode step with ``num_reqs`` running, and the pool size used."""
    prompt_len = 64
    max_tokens = steps + 8
    per_req = cdiv((prompt_len + max_tokens), BLOCK_SIZE)
    num_gpu_blocks = num_reqs * per_req + 64
    settings = EngineSettings(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=num_gpu_blocks,
        max_num_seqs=num_reqs,
        max_num_batched_tokens=8192,
        hash_algo="xxhash",
    )
    shared = list(range(1000, 1032))  # half of every prompt is a shared prefix
    reqs = tuple(
        RequestSpec(
            f"r{i}",
            prompt_token_ids=tuple(shared + [i * 37 % 997 + j for j in range(32)]),
            max_tokens=max_tokens,
            ignore_eos=True,
        )
        for i in range(num_reqs)
    )
    eng = Engine(
        Scenario(name="bench", engine=settings, requests=reqs), runner=NoModelRunner(), debug=False
    )
    if not snapshot:
        eng.snapshot = lambda: None  # StepRecord keeps None; nothing else reads it
    while len(eng.scheduler.running) < num_reqs or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running
    ):
        eng.step()
        eng.history.clear()
    times = []
    for _ in range(steps):
        gc.collect()
        t0 = time.perf_counter()
        rec = eng.step()
        times.append(time.perf_counter() - t0)
        assert len(rec.scheduled) == num_reqs
        eng.history.clear()
    return statistics.median(times), statistics.mean(times), num_gpu_blocks


def snapshot_cost(num_reqs: int) -> tuple[float, int]:
    settings = EngineSettings(
        block_size=BLOCK_SIZE,
        num_gpu_blocks=num_reqs * 8 + 64,
        max_num_seqs=num_reqs,
        max_num_batched_tokens=8192,
        hash_algo="xxhash",
    )
    reqs = tuple(
        RequestSpec(
            f"r{i}", prompt_token_ids=tuple(range(i, i + 64)), max_tokens=50, ignore_eos=True
        )
        for i in range(num_reqs)
    )
    eng = Engine(
        Scenario(name="bench", engine=settings, requests=reqs), runner=NoModelRunner(), debug=False
    )
    for _ in range(4):
        eng.step()
    t = min(timed_without_gc(eng.snapshot) for _ in range(5))
    return t, settings.num_gpu_blocks


# -- report ----------------------------------------------------------------------------------------
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and steps (a few seconds)")
    args = ap.parse_args(argv)
    repeat = 1 if args.quick else 5
    sizes = (10_000, 100_000)
    steps = 5 if args.quick else 50
    num_reqs = 256

    pool = {n: best(lambda n=n: pool_round(n), repeat) for n in sizes}
    calls = 10 if args.quick else 100
    rec_touch = {n: best(lambda n=n: touch_with_recorder(n, calls), repeat) for n in sizes}
    step_snap, step_snap_mean, nblocks = scheduler_steps(num_reqs, steps, snapshot=True)
    step_bare, step_bare_mean, _ = scheduler_steps(num_reqs, steps, snapshot=False)
    snap_t, snap_blocks = snapshot_cost(num_reqs)

    a, b = sizes
    print(
        f"## kvcore pool operations (block_size {BLOCK_SIZE}, {CHUNK} blocks per call, recorder "
        "off)\n"
    )
    print(
        f"| operation | {a // 1000}k blocks: µs/block | {b // 1000}k blocks: µs/block | ratio "
        f"{b // 1000}k/{a // 1000}k |"
    )
    print("|---|---:|---:|---:|")
    ratios = []
    for op in pool[a]:
        x, y = pool[a][op] * 1e6, pool[b][op] * 1e6
        ratios.append(y / x)
        print(f"| `{op}` | {x:.2f} | {y:.2f} | {y / x:.2f} |")
    x, y = rec_touch[a] * 1e6, rec_touch[b] * 1e6
    print(f"| `touch` of 1 block, recorder on (µs/call) | {x:.1f} | {y:.1f} | {y / x:.2f} |")
    print()
    print(
        f"## Scheduler step, {num_reqs} running requests in decode (Engine + NoModelRunner, "
        f"{nblocks} blocks)\n"
    )
    print("| step | median ms/step | mean ms/step |")
    print("|---|---:|---:|")
    print(f"| with the Snapshot (default) | {step_snap * 1e3:.2f} | {step_snap_mean * 1e3:.2f} |")
    print(f"| without the Snapshot | {step_bare * 1e3:.2f} | {step_bare_mean * 1e3:.2f} |")
    print(
        f"| `Engine.snapshot()` alone ({snap_blocks} blocks, {num_reqs} requests) | "
        f"{snap_t * 1e3:.2f} | |"
    )
    print()
    print(
        f"Summary: pool operations are O(1) per block ({b // a}x more blocks changes the "
        "per-block cost "
        f"by x{min(ratios):.2f}-x{max(ratios):.2f}); a decode step with {num_reqs} running "
        "requests takes "
        f"{step_snap * 1e3:.1f} ms ({step_bare * 1e3:.1f} ms without the snapshot); with the "
        "recorder on, "
        f"a touch() call costs x{y / x:.1f} at {b // a}x the blocks."
    )


if __name__ == "__main__":
    main()
