"""The EAGLE/MTP block drop: kvcore's KVCacheManager against vLLM 0.34.0's own, step by step.

With an EAGLE or MTP drafter and plain block hashes, vLLM's scheduler builds its KVCacheManager
with ``use_eagle=True``: every prefix-cache hit gives up its last matched block, so the drafter
gets the hidden states of those tokens again (``find_longest_cache_hit(...,
drop_eagle_block=True)`` in vllm/v1/core/single_type_kv_cache_manager.py; the hybrid
coordinator's convergence loop in vllm/v1/core/kv_cache_coordinator.py). Both managers are built
from the same config and driven through the same random trace by one small scheduler loop,
written once below (``drive``): running requests first, preempting the newest when a chunk does
not fit, then waiting requests in order, each looking the prefix cache up and taking one chunk,
with ``num_lookahead_tokens`` slots as an EAGLE drafter reserves them. After every step both
sides must agree on each admission's hit (its length and block ids per group), the blocks handed
out, every running request's block tables, the free queue in order and the KV events.

Configurations: one full-attention group, one sliding-window group, and full attention beside a
sliding window (the convergence loop), each with the drop, a hybrid where only the
full-attention group is flagged as the drafter's (``KVCacheGroupSpec.is_eagle_group``), sparse
and dense retention, and controls without the drop. Both sides run in one process under vLLM's
Python (kvcore's manager needs no torch):

    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/eagle_vs_vllm.py --seeds 200
    /tmp/vllm034-venv/bin/python -I bench/eagle_vs_vllm.py --worker --seeds 200   # the same

Without ``VLLM_VENV`` it says how to make one and exits 0 (skipped). Not covered: a Mamba group
(vLLM moves its prefill checkpoints for EAGLE; kvcore refuses the drop there), hits inside a
block (``prefix_match_unit``), multi-module MTP's re-prefilled tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from collections import deque

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
VLLM_VERSION = "0.34.0"

# groups: "full", "sliding" or "sliding2" (the trace picks the two windows); flag: the groups
# flagged is_eagle_group (None: none flagged, so with the drop vLLM flags them all)
CONFIGS = {
    "full": dict(groups=("full",), eagle=True, retention=None, flag=None, lookahead=2),
    "full-plain": dict(groups=("full",), eagle=False, retention=None, flag=None, lookahead=2),
    "sliding": dict(groups=("sliding",), eagle=True, retention=None, flag=None, lookahead=1),
    "sliding-sparse": dict(groups=("sliding",), eagle=True, retention=0, flag=None, lookahead=1),
    "hybrid": dict(groups=("full", "sliding"), eagle=True, retention=None, flag=None, lookahead=2),
    "hybrid-sparse": dict(
        groups=("full", "sliding"), eagle=True, retention=0, flag=None, lookahead=2
    ),
    "hybrid-flagged": dict(
        groups=("full", "sliding"), eagle=True, retention=None, flag=(0,), lookahead=2
    ),
    # two windows: three attention groups, so the loop can run more than one round
    "hybrid-two-windows": dict(
        groups=("full", "sliding", "sliding2"), eagle=True, retention=None, flag=None, lookahead=2
    ),
    "hybrid-two-windows-flagged": dict(
        groups=("full", "sliding", "sliding2"), eagle=True, retention=None, flag=(1,), lookahead=2
    ),
    "hybrid-plain": dict(
        groups=("full", "sliding"), eagle=False, retention=0, flag=None, lookahead=0
    ),
}


def make_trace(seed: int) -> dict:
    """Prompts sharing prefixes (some resent whole, some extended, some leaving the shared
    prefix mid-block), a small pool (preemption, eviction), a few output tokens each."""
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 8])
    stems = []
    for _ in range(3):
        n = rng.randrange(1, 6) * bs + rng.choice([0, 0, rng.randrange(bs)])
        stems.append([rng.randrange(50) for _ in range(max(n, 2))])
    reqs = []
    for i in range(rng.randrange(4, 10)):
        stem = rng.choice(stems)
        kind = rng.random()
        if kind < 0.3:
            prompt = list(stem)  # a resend
        elif kind < 0.6:
            prompt = stem + [rng.randrange(50) for _ in range(rng.randrange(1, 2 * bs + 1))]
        else:
            cut = rng.randrange(1, len(stem) + 1)
            prompt = stem[:cut] + [50 + rng.randrange(50) for _ in range(rng.randrange(1, 9))]
        outputs = [rng.randrange(50) for _ in range(rng.randrange(1, 6))]
        reqs.append({"id": f"r{i}", "prompt": prompt, "outputs": outputs, "arrive": i // 2})
    return {
        "block_size": bs,
        "window": rng.choice([1, 2, 3, bs, bs + 1, 2 * bs, 3 * bs]),
        "window2": rng.choice([2, bs + 1, 2 * bs + 1, 4 * bs]),
        "num_blocks": rng.randrange(12, 48),
        "chunk": rng.choice([3, 5, 8, 64]),
        "budget": rng.choice([8, 16, 64]),
        "requests": reqs,
    }


# -- the two sides ---------------------------------------------------------------------------------
class KvcoreSide:
    name = "kvcore"

    def __init__(self, trace: dict, cfg: dict) -> None:
        if REPO not in sys.path:
            sys.path.insert(0, REPO)
        from kvcore.core.kv_cache_manager import KVCacheManager
        from kvcore.core.kv_cache_utils import get_request_block_hasher
        from kvcore.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            SlidingWindowSpec,
        )
        from kvcore.request import Request, RequestStatus
        from kvcore.utils.hashing import get_hash_fn_by_name

        bs = trace["block_size"]
        groups = tuple(
            KVCacheGroupSpec(
                (f"{kind}.{i}",),
                FullAttentionSpec(bs)
                if kind == "full"
                else SlidingWindowSpec(bs, trace["window" if kind == "sliding" else "window2"]),
                is_eagle_group=cfg["flag"] is not None and i in cfg["flag"],
            )
            for i, kind in enumerate(cfg["groups"])
        )
        config = KVCacheConfig(trace["num_blocks"], groups, cfg["retention"])
        self.manager = KVCacheManager(
            config, 4096, True, enable_kv_cache_events=True, use_eagle=cfg["eagle"]
        )
        self.hash_fn = get_hash_fn_by_name("sha256")
        self._Request, self._Hasher, self.status = Request, get_request_block_hasher, RequestStatus
        self.bs = bs

    def make_request(self, spec):
        return self._Request(
            spec["id"],
            list(spec["prompt"]),
            len(spec["outputs"]),
            block_hasher=self._Hasher(self.bs, self.hash_fn),
        )

    def append(self, req, token):
        req.append_output_token_ids([token])

    def free_queue(self):
        return [b.block_id for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()]


class VllmSide:
    name = "vllm"

    def __init__(self, trace: dict, cfg: dict) -> None:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.request import Request, RequestStatus

        init_none_hash(sha256)
        bs = trace["block_size"]
        dims = dict(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float32)
        groups = [
            KVCacheGroupSpec(
                [f"{kind}.{i}"],
                FullAttentionSpec(**dims)
                if kind == "full"
                else SlidingWindowSpec(
                    **dims, sliding_window=trace["window" if kind == "sliding" else "window2"]
                ),
                is_eagle_group=cfg["flag"] is not None and i in cfg["flag"],
            )
            for i, kind in enumerate(cfg["groups"])
        ]
        config = KVCacheConfig(
            num_blocks=trace["num_blocks"],
            kv_cache_tensors=[],
            kv_cache_groups=groups,
            prefix_cache_retention_interval=cfg["retention"],
        )
        self.manager = KVCacheManager(
            config,
            max_model_len=4096,
            scheduler_block_size=bs,
            hash_block_size=bs,
            enable_caching=True,
            use_eagle=cfg["eagle"],
            enable_kv_cache_events=True,
        )
        self.hasher = get_request_block_hasher(bs, sha256)
        self._Request, self._Params, self.status = Request, SamplingParams, RequestStatus

    def make_request(self, spec):
        return self._Request(
            spec["id"],
            list(spec["prompt"]),
            self._Params(max_tokens=len(spec["outputs"])),
            None,
            block_hasher=self.hasher,
        )

    def append(self, req, token):
        req.append_output_token_ids(token)

    def free_queue(self):
        return [b.block_id for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()]


# -- one scheduler loop for both -------------------------------------------------------------------
def _event(ev) -> list:
    hashes = [int(h) if isinstance(h, int) else h.hex() for h in getattr(ev, "block_hashes", [])]
    return [type(ev).__name__, hashes, getattr(ev, "group_idx", None)]


def drive(side, trace: dict, cfg: dict) -> list:
    """Run the trace; -> one record per step (what both sides must agree on)."""
    m = side.manager
    lookahead = cfg["lookahead"]
    pending = deque(trace["requests"])
    reqs: dict = {}
    waiting: deque = deque()
    running: list = []
    out: list = []
    for step in range(400):
        while pending and pending[0]["arrive"] <= step:
            spec = pending.popleft()
            r = side.make_request(spec)
            reqs[spec["id"]] = (r, spec["outputs"])
            waiting.append(r)
        if not (pending or waiting or running):
            break
        m.new_step_starts()
        budget = trace["budget"]
        scheduled: list = []
        rec: dict = {"step": step, "hits": {}, "new": {}, "preempted": []}
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(trace["chunk"], r.num_tokens - r.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            while True:
                new = m.allocate_slots(r, n, num_lookahead_tokens=lookahead)
                if new is not None:
                    break
                victim = running.pop()
                m.free(victim)
                victim.status = side.status.PREEMPTED
                victim.num_computed_tokens = 0
                victim.num_preemptions += 1
                waiting.appendleft(victim)
                rec["preempted"].append(victim.request_id)
                if victim is r:
                    break
            if new is None:
                break
            rec["new"][r.request_id] = [list(g) for g in new.get_block_ids()]
            scheduled.append((r, n))
            budget -= n
            i += 1
        while waiting and budget > 0 and not rec["preempted"]:
            r = waiting[0]
            blocks, num_hit, r.shared_prefix_boundary = m.get_computed_blocks(r)
            n = min(trace["chunk"], r.num_tokens - num_hit, budget)
            if n <= 0:
                break
            new = m.allocate_slots(r, n, num_hit, blocks, num_lookahead_tokens=lookahead)
            if new is None:
                break
            waiting.popleft()
            r.status = side.status.RUNNING
            r.num_computed_tokens = num_hit
            rec["hits"][r.request_id] = [num_hit, [list(g) for g in blocks.get_block_ids()]]
            rec["new"][r.request_id] = [list(g) for g in new.get_block_ids()]
            running.append(r)
            scheduled.append((r, n))
            budget -= n
        for r, n in scheduled:
            r.num_computed_tokens += n
            if r.num_computed_tokens >= r.num_tokens:
                outputs = reqs[r.request_id][1]
                side.append(r, outputs[len(r.output_token_ids)])
                if len(r.output_token_ids) >= len(outputs):
                    r.status = side.status.FINISHED_LENGTH_CAPPED
                    m.free(r)
                    running.remove(r)
        rec["tables"] = {
            r.request_id: [list(g) for g in m.get_block_ids(r.request_id)] for r in running
        }
        rec["free_queue"] = side.free_queue()
        rec["events"] = [_event(e) for e in m.take_events()]
        out.append(rec)
        if not scheduled and not rec["preempted"]:
            break
    return out


def compare(seed: int, name: str) -> dict:
    trace = make_trace(seed)
    cfg = CONFIGS[name]
    runs = {}
    for side_cls in (VllmSide, KvcoreSide):
        try:
            runs[side_cls.name] = drive(side_cls(trace, cfg), trace, cfg)
        except Exception as e:  # a crash on one side is a difference too
            runs[side_cls.name] = [{"error": f"{type(e).__name__}: {e}"}]
    a, b = runs["vllm"], runs["kvcore"]
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            return {
                "seed": seed,
                "config": name,
                "step": i,
                "differ": keys,
                "vllm": {k: x.get(k) for k in keys},
                "kvcore": {k: y.get(k) for k in keys},
            }
    if len(a) != len(b):
        return {"seed": seed, "config": name, "differ": ["number of steps"]}
    hits = [h for r in a for h in r["hits"].values()]
    return {
        "seed": seed,
        "config": name,
        "steps": len(a),
        "same": True,
        "hits": sum(1 for h in hits if h[0]),
        "hit_tokens": sum(h[0] for h in hits),
        "preemptions": sum(len(r["preempted"]) for r in a),
        "evictions": sum(1 for r in a for e in r["events"] if e[0] == "BlockRemoved"),
    }


def worker_main(seeds: range, configs: list[str]) -> int:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # vLLM's logger writes to stdout: keep it off the report
    sys.stdout = sys.stderr
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    import vllm

    results = [compare(s, c) for c in configs for s in seeds]
    bad = [r for r in results if not r.get("same")]
    per_config = {
        c: {
            "runs": sum(1 for r in results if r["config"] == c),
            "identical": sum(1 for r in results if r["config"] == c and r.get("same")),
            "hits": sum(r.get("hits", 0) for r in results if r["config"] == c),
            "hit_tokens": sum(r.get("hit_tokens", 0) for r in results if r["config"] == c),
        }
        for c in configs
    }
    summary = {
        "vllm": vllm.__version__,
        "runs": len(results),
        "steps": sum(r.get("steps", 0) for r in results),
        "identical": len(results) - len(bad),
        "prefix_hits": sum(r.get("hits", 0) for r in results),
        "preemptions": sum(r.get("preemptions", 0) for r in results),
        "evictions": sum(r.get("evictions", 0) for r in results),
        "configs": per_config,
        "first_differences": bad[:3],
    }
    out.write(json.dumps(summary, indent=1) + "\n")
    return 0 if not bad else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=50, help="random traces per config")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma separated")
    ap.add_argument("--worker", action="store_true", help="run here (under vLLM's Python)")
    args = ap.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    configs = args.configs.split(",")
    if args.worker:
        return worker_main(seeds, configs)
    venv = os.environ.get("VLLM_VENV")
    if not venv or not os.path.exists(os.path.join(venv, "bin", "python")):
        print(
            f"skipped: no vLLM {VLLM_VERSION} environment (VLLM_VENV={venv or 'unset'}).\n"
            f"Make one with `bash scripts/vllm_env.sh`, then run\n"
            f"  VLLM_VENV=<its folder> .venv/bin/python bench/eagle_vs_vllm.py"
        )
        return 0
    summary = differential(venv, seeds, configs)
    print(json.dumps(summary, indent=1))
    return 0 if summary["identical"] == summary["runs"] else 1


def differential(venv: str, seeds: range, configs: list[str]) -> dict:
    """Run the comparison under the venv's Python; -> the worker's summary."""
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING", VLLM_NO_USAGE_STATS="1")
    cmd = [os.path.join(venv, "bin", "python"), "-I", os.path.abspath(__file__), "--worker"]
    cmd += ["--seeds", str(len(seeds)), "--first-seed", str(seeds[0])]
    cmd += ["--configs", ",".join(configs)]
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=1800)
    return json.loads(done.stdout)


if __name__ == "__main__":
    sys.exit(main())
