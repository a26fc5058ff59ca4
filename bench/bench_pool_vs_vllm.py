"""Our BlockPool against vLLM 0.34.0's own BlockPool: every pool operation, the same op sequence.

Both pools are built the way an engine has them (prefix caching on, KV cache events on) and driven
through one op sequence, written once below (``pool_round``), over the whole pool in chunks of
``CHUNK`` blocks. Each call is timed on its own, with the garbage collector off, and each call's
best of several rounds is kept (a preemption on this shared machine then spoils one call of one
round, not a whole pass; each side pays the same timer read a call); their sum is given per block
(per lookup for ``get_cached_block``):

- ``get_new_blocks``             fresh blocks from the head of the free queue (no hash to drop)
- ``cache_full_blocks``          hash full blocks into the prefix-cache map (+ a BlockStored a call)
- ``get_cached_block (hit)``     prefix-cache lookups of cached hashes; ``(miss)`` of unknown ones
- ``free_blocks``                a finished request's blocks, in reverse, to the queue's tail
- ``touch``                      prefix hits revive free hashed blocks from the middle of the queue
- ``get_new_blocks (evicting)``  blocks that still carry a hash: lazy eviction + BlockRemoved
- ``evict_blocks``               drop the hashes of blocks in use (a KV connector's report)
- ``reset_prefix_cache``         forget every hash of a pool whose blocks are all free

vLLM's pool runs in a worker process started with the Python of a scratch environment that has
the real vllm==0.34.0 package (``bash scripts/vllm_env.sh`` builds it; ``VLLM_VENV`` names it).
Ours runs here, with recording off and on (a ``record.recorder.Recorder`` attached). Rounds of
the three alternate, so a busy machine slows them alike; the figures that matter are the ratios
ours/vLLM (target: recording off <= 1.0, on <= 1.5), which survive a noisy machine where times
do not. Both sides must also publish the same KV events, op by op: the bench checks it.

    bash scripts/vllm_env.sh
    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/bench_pool_vs_vllm.py            # 10k, 100k
    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/bench_pool_vs_vllm.py --quick    # 10k only
    ... --json out.json                                                              # also as JSON

Without ``VLLM_VENV`` it says how to make one and exits 0 (skipped).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if REPO not in sys.path:  # the worker runs this file isolated (-I), under vLLM's interpreter
    sys.path.insert(0, REPO)
from bench.timing import step_seconds_without_gc  # noqa: E402  (stdlib only: fine in the worker too)

BLOCK_SIZE = 16
CHUNK = 32  # blocks per call: a request's table growing by a prompt's worth
GROUP_IDS = [0]  # one KV cache group (a full-attention model)
VLLM_VERSION = "0.34.0"

OPS = (
    "get_new_blocks",
    "cache_full_blocks",
    "get_cached_block (hit)",
    "get_cached_block (miss)",
    "free_blocks",
    "touch",
    "get_new_blocks (evicting)",
    "evict_blocks",
    "reset_prefix_cache",
)
UNITS = {"get_cached_block (hit)": "lookup", "get_cached_block (miss)": "lookup"}
TARGET_OFF, TARGET_ON = 1.0, 1.5


# -- the request both pools read -------------------------------------------------------------------
class FakeRequest:
    """What ``cache_full_blocks`` reads from a request, on either side.

    vLLM reads ``block_hashes`` (BlockHash: bytes), ``all_token_ids``, ``lora_request``,
    ``session_id`` and, for each block's extra keys, ``mm_features``, ``cache_salt`` and
    ``prompt_embeds``. Ours reads ``block_hashes`` (bytes too), ``all_token_ids``,
    ``extra_keys_for_block`` (as kvcore.request.Request has it) and ``request_id``.
    Hashes are 32 bytes, as sha256 gives them.
    """

    def __init__(self, index: int, num_blocks: int) -> None:
        self.request_id = f"r{index}"
        self.block_hashes = [
            index.to_bytes(16, "big") + i.to_bytes(16, "big") for i in range(num_blocks)
        ]
        self.all_token_ids = list(range(index, index + num_blocks * BLOCK_SIZE))
        self.lora_request = None
        self.session_id = None
        self.mm_features: list = []
        self.cache_salt = None
        self.prompt_embeds = None

    def extra_keys_for_block(self, block_index: int):
        # As kvcore.request.Request: the cache salt goes into the first block only.
        if block_index == 0 and self.cache_salt:
            return (("cache_salt", self.cache_salt),)
        return None


# -- the two sides ---------------------------------------------------------------------------------
def make_our_pool(num_blocks: int, recording: bool):
    """Our BlockPool as an engine has it, and with ``recording`` a Recorder attached.

    -> (pool, recorder or None).
    """
    BlockPool = _our_block_pool()
    if _old_api(BlockPool):
        from paged_kv_lab.recording import events

        rec = events.Recorder() if recording else None
        return BlockPool(
            num_blocks, True, BLOCK_SIZE, recorder=rec, enable_kv_cache_events=True
        ), rec
    pool = BlockPool(num_blocks, True, BLOCK_SIZE, enable_kv_cache_events=True)
    rec = None
    if recording:
        from paged_kv_lab.recording.recorder import Recorder

        rec = Recorder()
        rec.attach_block_pool(pool)
    return pool, rec


def _our_block_pool():
    from kvcore.core.block_pool import BlockPool

    return BlockPool


def _old_api(block_pool_class) -> bool:
    """The API before issue #20: recording on = ``BlockPool(..., recorder=Recorder())``."""
    return "recorder" in inspect.signature(block_pool_class).parameters


def our_api() -> str:
    if _old_api(_our_block_pool()):
        return "old (BlockPool(..., recorder=))"
    return "vLLM's signatures, Recorder.attach_block_pool"


def drain(pool, recorder) -> list:
    """Empty the pool's KV event queue (returned) and the recorder's events (dropped)."""
    kv_events = pool.take_events()
    if recorder is not None:
        recorder.drain()
    return kv_events


def make_vllm_pool(num_blocks: int):
    from vllm.v1.core.block_pool import BlockPool

    return BlockPool(num_blocks, True, BLOCK_SIZE, enable_kv_cache_events=True), None


def vllm_drain(pool, recorder) -> list:
    return pool.take_events()


# -- the op sequence -------------------------------------------------------------------------------
def pool_round(make: Callable[[int], tuple], drain_fn: Callable, num_blocks: int) -> dict:
    """One pass of every operation over a whole pool of about ``num_blocks`` blocks.

    Each call (of ``CHUNK`` blocks, or ``CHUNK`` lookups) is timed on its own, so that the
    summary can keep each call's best round (``reset_prefix_cache`` is one call for the pool).
    -> {"n": blocks, "seconds": {op: [seconds of each call]},
    "events": {op: {event class: count}}}.
    """
    n_chunks = num_blocks // CHUNK
    n = n_chunks * CHUNK
    pool, rec = make(n + 1)  # + the null block
    reqs = [FakeRequest(i, CHUNK) for i in range(n_chunks)]
    hit_hashes = [r.block_hashes for r in reqs]
    miss_hashes = [
        [(n_chunks + i).to_bytes(16, "big") + i.to_bytes(16, "big") for i in range(c, c + CHUNK)]
        for c in range(0, n, CHUNK)
    ]
    chunks: list[list] = []
    secs: dict[str, list[float]] = {}
    kv: dict[str, dict[str, int]] = {}
    found: list = []

    def timed(op: str, step: Callable[[int], Any], count: int = n_chunks) -> None:
        secs[op] = step_seconds_without_gc(step, count)
        kv[op] = dict(Counter(type(e).__name__ for e in drain_fn(pool, rec)))

    def alloc(i: int) -> None:
        chunks.append(pool.get_new_blocks(CHUNK))

    def cache_one(i: int) -> None:
        pool.cache_full_blocks(reqs[i], chunks[i], 0, CHUNK, BLOCK_SIZE, 0)

    def cache() -> None:
        for i in range(n_chunks):
            cache_one(i)

    def lookup(groups):
        get = pool.get_cached_block

        def step(i: int) -> None:
            for h in groups[i]:
                found.append(get(h, GROUP_IDS))

        return step

    def free_one(i: int) -> None:
        pool.free_blocks(reversed(chunks[i]))

    def free() -> None:
        for i in range(n_chunks):
            free_one(i)

    timed("get_new_blocks", alloc)
    timed("cache_full_blocks", cache_one)
    timed("get_cached_block (hit)", lookup(hit_hashes))
    assert len(found) == n and all(b is not None for b in found)
    found.clear()
    timed("get_cached_block (miss)", lookup(miss_hashes))
    assert len(found) == n and all(b is None for b in found)
    found.clear()
    timed("free_blocks", free_one)
    assert pool.get_num_free_blocks() == n

    # Prefix hits middle-out: the touched blocks leave from the middle of the free queue.
    order = sorted(range(n_chunks), key=lambda i: abs(i - n_chunks // 2))

    def touch(k: int) -> None:
        pool.touch(chunks[order[k]])

    timed("touch", touch)
    free()
    chunks.clear()
    drain_fn(pool, rec)

    timed("get_new_blocks (evicting)", alloc)
    assert len(pool.cached_block_hash_to_block) == 0

    cache()
    drain_fn(pool, rec)
    id_sets = [{b.block_id for b in blocks} for blocks in chunks]

    def evict(i: int) -> None:
        pool.evict_blocks(id_sets[i])

    timed("evict_blocks", evict)
    assert len(pool.cached_block_hash_to_block) == 0

    cache()
    free()
    drain_fn(pool, rec)
    ok: list = []
    timed("reset_prefix_cache", lambda i: ok.append(pool.reset_prefix_cache()), 1)
    assert ok == [True]
    return {"n": n, "seconds": secs, "events": kv}


# -- vLLM's side: a worker under the scratch environment's Python ----------------------------------
def worker_main() -> None:
    """One JSON line per request line {"n": blocks}; the first line says what was imported."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's logger writes to stdout: keep it off the replies
    sys.stdout = sys.stderr
    import vllm
    from vllm import envs
    from vllm.v1.core import block_pool

    # As EngineCore does once it is up: environment variables are read once, then cached
    # (BlockPool reads VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES for every hash it publishes).
    envs.enable_envs_cache()

    out.write(
        json.dumps(
            {
                "version": vllm.__version__,
                "file": block_pool.__file__,
                "python": sys.version.split()[0],
            }
        )
        + "\n"
    )
    for line in sys.stdin:
        req = json.loads(line)
        out.write(json.dumps(pool_round(make_vllm_pool, vllm_drain, req["n"])) + "\n")


class VllmWorker:
    def __init__(self, venv: str) -> None:
        python = os.path.join(venv, "bin", "python")
        env = dict(
            os.environ,
            VLLM_LOGGING_LEVEL="WARNING",
            VLLM_NO_USAGE_STATS="1",
            VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES="1",
            OMP_NUM_THREADS="1",
        )
        self.proc = subprocess.Popen(
            [python, "-I", os.path.abspath(__file__), "--worker"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.info = self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the vLLM worker died (exit {self.proc.wait()}); see its stderr above"
            )
        return json.loads(line)

    def round(self, n: int) -> dict:
        self.proc.stdin.write(json.dumps({"n": n}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# -- report ----------------------------------------------------------------------------------------
SIDES = ("vllm", "off", "on")


def run(sizes: tuple[int, ...], repeat: int, worker: VllmWorker) -> dict:
    """{n: {side: [round, ...]}}; the three sides take turns, who goes first rotating."""
    rounds: dict[int, dict[str, list]] = {n: {s: [] for s in SIDES} for n in sizes}
    ours = {
        "off": lambda n: pool_round(lambda m: make_our_pool(m, False), drain, n),
        "on": lambda n: pool_round(lambda m: make_our_pool(m, True), drain, n),
    }
    for n in sizes:
        for r in range(repeat):
            for side in SIDES[r % 3 :] + SIDES[: r % 3]:
                rounds[n][side].append(worker.round(n) if side == "vllm" else ours[side](n))
    return rounds


def best_per_call(rounds: list[dict], op: str) -> float:
    """Seconds per block (or lookup) of ``op``: each call's best round, summed over the pass.

    The rounds make the same calls on the same pool states, so call k of one round is call k
    of every other; a round preempted during a call loses only that call to a better round."""
    per_call = zip(*(r["seconds"][op] for r in rounds), strict=True)
    return sum(min(times) for times in per_call) / rounds[0]["n"]


def summarize(rounds: dict) -> dict:
    out: dict = {}
    for n, by_side in rounds.items():
        best = {s: {op: best_per_call(by_side[s], op) for op in OPS} for s in SIDES}
        events = {s: by_side[s][0]["events"] for s in SIDES}
        rows = {}
        for op in OPS:
            v, off, on = (best[s][op] * 1e6 for s in SIDES)
            rows[op] = {
                "unit": UNITS.get(op, "block"),
                "vllm_us": v,
                "ours_off_us": off,
                "ours_on_us": on,
                "ratio_off": off / v,
                "ratio_on": on / v,
                "same_kv_events": events["vllm"][op] == events["off"][op] == events["on"][op],
                "kv_events": events["vllm"][op],
            }
        out[n] = rows
    return out


def print_table(summary: dict, repeat: int) -> None:
    for n, rows in summary.items():
        print(
            f"\n## {n // 1000}k blocks (block_size {BLOCK_SIZE}, {CHUNK} blocks a call, "
            f"each call's best of {repeat} rounds)\n"
        )
        print("| op | vLLM µs | ours off µs | ours on µs | off/vLLM | on/vLLM |")
        print("|---|---:|---:|---:|---:|---:|")
        for op, r in rows.items():
            flag_off = "" if r["ratio_off"] <= TARGET_OFF else " ✗"
            flag_on = "" if r["ratio_on"] <= TARGET_ON else " ✗"
            unit = "" if r["unit"] == "block" else f" (per {r['unit']})"
            print(
                f"| {op}{unit} | {r['vllm_us']:.3f} | {r['ours_off_us']:.3f} | "
                f"{r['ours_on_us']:.3f} | "
                f"{r['ratio_off']:.2f}{flag_off} | {r['ratio_on']:.2f}{flag_on} |"
            )
        differ = [op for op, r in rows.items() if not r["same_kv_events"]]
        print(
            "\nKV events, op by op: "
            + ("the same on both sides" if not differ else "DIFFER for " + ", ".join(differ))
        )
    print(
        f"\nµs per block (per lookup where said); ✗: over the target "
        f"(off <= {TARGET_OFF}, on <= {TARGET_ON})."
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="10k blocks only, 3 rounds (about half a minute)"
    )
    ap.add_argument("--repeat", type=int, help="rounds per side (default 7, --quick 3)")
    ap.add_argument(
        "--sizes",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        help="pool sizes, comma separated (default 10000,100000; --quick 10000)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    venv = os.environ.get("VLLM_VENV")
    if not venv or not os.path.exists(os.path.join(venv, "bin", "python")):
        print(
            f"skipped: no vLLM {VLLM_VERSION} environment (VLLM_VENV={venv or 'unset'}).\n"
            f"Make one with `bash scripts/vllm_env.sh` (builds /tmp/vllm034-venv), then run\n"
            f"  VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/bench_pool_vs_vllm.py"
        )
        return 0
    repeat = args.repeat or (3 if args.quick else 7)
    sizes = args.sizes or ((10_000,) if args.quick else (10_000, 100_000))

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    worker = VllmWorker(venv)
    try:
        info = worker.info
        if info["version"] != VLLM_VERSION:
            print(f"warning: the worker imports vLLM {info['version']}, not {VLLM_VERSION}")
        rounds = run(sizes, repeat, worker)
    finally:
        worker.close()
    summary = summarize(rounds)
    load1 = os.getloadavg()
    api = our_api()
    print(f"# Our BlockPool vs vLLM {info['version']}'s ({info['file']})")
    print(
        f"Python {sys.version.split()[0]} here, {info['python']} in the worker; "
        f"our pool API: {api}; load average {load0[0]:.2f} before, {load1[0]:.2f} after; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    print_table(summary, repeat)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "vllm": info,
                    "repeat": repeat,
                    "block_size": BLOCK_SIZE,
                    "chunk": CHUNK,
                    "our_api": api,
                    "loadavg_before": load0,
                    "loadavg_after": load1,
                    "targets": {"ratio_off": TARGET_OFF, "ratio_on": TARGET_ON},
                    "sizes": {str(n): rows for n, rows in summary.items()},
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
