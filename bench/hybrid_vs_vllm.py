"""kvcore's KVCacheManager against vLLM 0.34.0's own on hybrid KV cache configs, step by step.

A hybrid model here is one full-attention group and one Mamba group (``MambaSpec``, the state of
a linear-attention layer such as Mamba2 or a gated delta-net) sharing one block pool. Both
managers are built from the same config and driven through the same random trace by one small
scheduler loop, written once below (``drive``): running requests first, in order, preempting
the newest running request when a chunk does not fit; then waiting requests in order, each
looking the prefix cache up and taking one chunk. In Mamba "align" mode a prefill chunk is cut
to the block boundaries by the scheduler's own ``_mamba_block_aligned_split`` (vLLM's and
kvcore's, each on its side). After every step both sides must agree on everything a step leaves
behind: every running request's block table in every group, the free queue in order, the
prefix-cache hits, the blocks handed out, and the KV events (kinds, hashes, group).

Configurations: align mode with prefix caching (retention 0, vLLM's default, and None: every
state kept), align mode with speculative (lookahead) slots and one speculative Mamba block, and
"none" mode without prefix caching. Both sides run in one process under vLLM's Python (kvcore
needs no torch for its manager), so the command is:

    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/hybrid_vs_vllm.py --seeds 200
    /tmp/vllm034-venv/bin/python -I bench/hybrid_vs_vllm.py --worker --seeds 200  # the same

Groups of different block sizes (``GROUP_SIZE_CONFIGS``): a full-attention group and a
sliding-window or second full-attention group, one at the trace's block size and one at twice
it, as vLLM 0.34 makes them when one layer kind's page is half the other's
(``unify_kv_cache_spec_page_size`` doubles that kind's block). Hits then align to the scheduler's
block size (the least common multiple) and hashes are made every greatest common divisor.

Without ``VLLM_VENV`` it says how to make one and exits 0 (skipped). Not covered yet:
``prefix_match_unit`` (hash blocks finer than the Mamba block: partial hits and the tail block's
copy-on-write) and prefill-checkpoint blocks; kvcore does not model them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import subprocess
import sys
from collections import deque
from types import SimpleNamespace

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
VLLM_VERSION = "0.34.0"

CONFIGS = {
    "align": dict(mode="align", retention=0, lookahead=0, spec_blocks=0, caching=True),
    "align-dense": dict(mode="align", retention=None, lookahead=0, spec_blocks=0, caching=True),
    "align-lookahead": dict(mode="align", retention=0, lookahead=2, spec_blocks=1, caching=True),
    "none": dict(mode="none", retention=0, lookahead=0, spec_blocks=0, caching=False),
    # Requests with a LoRA adapter, multimodal items, prompt embeddings and a cache salt, each
    # drawn from a small set, so some share a prefix's extra keys and some do not.
    "extra-keys": dict(
        mode="align", retention=0, lookahead=0, spec_blocks=0, caching=True, extras=True
    ),
    # prefix_match_unit = 2 under blocks of 4 or 8: hits inside a block, the prompt tail keyed
    # inside its block, the tail block's copy-on-write.
    "prefix-match-unit": dict(
        mode="align", retention=0, lookahead=0, spec_blocks=0, caching=True, unit=2
    ),
    "prefix-match-unit-dense": dict(
        mode="align", retention=None, lookahead=0, spec_blocks=0, caching=True, unit=2
    ),
}


# Two groups whose block sizes differ: (kind, multiple of the trace's block size) per group.
# Sliding windows are 3 of the trace's blocks. Attention only, so no chunk alignment.
GROUP_SIZE_CONFIGS = {
    "sizes-full-sliding": dict(groups=(("full", 1), ("sliding", 2)), retention=0),
    "sizes-full-sliding-dense": dict(groups=(("full", 1), ("sliding", 2)), retention=None),
    "sizes-sliding-full": dict(groups=(("full", 2), ("sliding", 1)), retention=0),
    "sizes-full-full": dict(groups=(("full", 1), ("full", 2)), retention=0),
}
for _cfg in GROUP_SIZE_CONFIGS.values():
    _cfg.update(mode="attention", lookahead=0, spec_blocks=0, caching=True)
CONFIGS.update(GROUP_SIZE_CONFIGS)
HYBRID_CONFIGS = [name for name in CONFIGS if name not in GROUP_SIZE_CONFIGS]


def group_block_sizes(trace: dict, cfg: dict) -> tuple[int, int]:
    """(scheduler_block_size, hash_block_size) vLLM 0.34 resolves for the trace's groups."""
    import math

    bs = trace["block_size"]
    if "groups" not in cfg:
        return bs, min(cfg.get("unit") or bs, bs)
    sizes = [bs * k for _, k in cfg["groups"]]
    return math.lcm(*sizes), math.gcd(*sizes)


def make_trace(seed: int) -> dict:
    """Prompts sharing prefixes (so there are hits), a small pool (so there is preemption and
    eviction), a few output tokens each."""
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 8])
    stems = [[rng.randrange(50) for _ in range(rng.randrange(4, 24))] for _ in range(3)]
    reqs = []
    for i in range(rng.randrange(3, 9)):
        prompt = list(rng.choice(stems)) + [rng.randrange(50) for _ in range(rng.randrange(0, 9))]
        if len(prompt) < 2:
            prompt.append(1)
        outputs = [rng.randrange(50) for _ in range(rng.randrange(1, 6))]
        extras = {
            "lora": rng.choice([None, None, ["sql", 1, "/adapters/sql"], ["chat", 2, "/a/chat"]]),
            "salt": rng.choice([None, None, "tenant-1"]),
            "mm": [],
            "embeds": rng.random() < 0.3,
        }
        if rng.random() < 0.5:
            offset = rng.randrange(0, len(prompt))
            for _ in range(rng.randrange(1, 3)):
                if offset >= len(prompt):
                    break
                length = rng.randrange(1, 7)
                extras["mm"].append([rng.choice(["img-a", "img-b"]), offset, length])
                offset += length + rng.randrange(0, 4)
        reqs.append(
            {"id": f"r{i}", "prompt": prompt, "outputs": outputs, "arrive": i // 2, **extras}
        )
    return {
        "block_size": bs,
        "num_blocks": rng.randrange(10, 40),
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
        from kvcore.core.sched.scheduler import mamba_block_aligned_split
        from kvcore.kv_cache_interface import (
            KVCacheConfig,
            full_attention,
            mamba,
            sliding_window,
        )
        from kvcore.request import Request, RequestStatus
        from kvcore.utils.hashing import get_hash_fn_by_name

        bs = trace["block_size"]
        if "groups" in cfg:
            window = 3 * bs
            groups = tuple(
                full_attention(bs * k, (f"g{i}",))
                if kind == "full"
                else sliding_window(bs * k, window, (f"g{i}",))
                for i, (kind, k) in enumerate(cfg["groups"])
            )
            hbs = None  # kvcore resolves it (the groups' greatest common divisor)
        else:
            hbs = min(cfg.get("unit") or bs, bs)
            groups = (
                full_attention(bs),
                mamba(bs, cfg["mode"], num_speculative_blocks=cfg["spec_blocks"]),
            )
        config = KVCacheConfig(trace["num_blocks"], groups, cfg["retention"])
        self.manager = KVCacheManager(
            config, 4096, cfg["caching"], enable_kv_cache_events=True, hash_block_size=hbs
        )
        hbs = self.manager.hash_block_size
        self.hash_fn = get_hash_fn_by_name("sha256")
        self._Request, self._Hasher, self.status = Request, get_request_block_hasher, RequestStatus
        partial = getattr(self.manager.coordinator, "enable_partial_hash_hits", False)
        self.split = lambda req, n, hit=0: mamba_block_aligned_split(
            req,
            n,
            hit,
            block_size=bs,
            max_prefill_tokens=trace["budget"],
            hash_block_size=hbs,
            partial_cache_hit=partial,
        )
        self.bs = hbs

    def make_request(self, spec, extras):
        from kvcore.lora.request import LoRARequest
        from kvcore.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

        kw = {}
        if extras:
            kw["lora_request"] = LoRARequest(*spec["lora"]) if spec["lora"] else None
            kw["cache_salt"] = spec["salt"]
            kw["mm_features"] = [
                MultiModalFeatureSpec(ident, PlaceholderRange(off, n))
                for ident, off, n in spec["mm"]
            ]
            if spec["embeds"]:
                kw["prompt_embeds"] = [struct.pack("<2f", *row) for row in _embeds(spec["prompt"])]
        return self._Request(
            spec["id"],
            list(spec["prompt"]),
            len(spec["outputs"]),
            block_hasher=self._Hasher(self.bs, self.hash_fn),
            **kw,
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
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.request import Request, RequestStatus

        init_none_hash(sha256)
        bs = trace["block_size"]
        scheduler_bs, hbs = group_block_sizes(trace, cfg)
        if "groups" in cfg:
            # a layer with half the page bytes gets twice the block (unify_kv_cache_spec_page_size)
            kw = dict(num_kv_heads=1, dtype=torch.float32)
            group_specs = [
                KVCacheGroupSpec(
                    [f"g{i}"],
                    FullAttentionSpec(block_size=bs * k, head_size=16 // k, **kw)
                    if kind == "full"
                    else SlidingWindowSpec(
                        block_size=bs * k, head_size=16 // k, sliding_window=3 * bs, **kw
                    ),
                )
                for i, (kind, k) in enumerate(cfg["groups"])
            ]
        else:
            full = FullAttentionSpec(
                block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float32
            )
            state = MambaSpec(
                block_size=bs,
                shapes=((1,),),
                dtypes=(torch.float32,),
                mamba_cache_mode=cfg["mode"],
                num_speculative_blocks=cfg["spec_blocks"],
            )
            group_specs = [KVCacheGroupSpec(["full"], full), KVCacheGroupSpec(["mamba"], state)]
        config = KVCacheConfig(
            num_blocks=trace["num_blocks"],
            kv_cache_tensors=[],
            kv_cache_groups=group_specs,
            prefix_cache_retention_interval=cfg["retention"],
        )
        self.manager = KVCacheManager(
            config,
            max_model_len=4096,
            scheduler_block_size=scheduler_bs,
            hash_block_size=hbs,
            enable_caching=cfg["caching"],
            enable_kv_cache_events=True,
        )
        self.hasher = get_request_block_hasher(hbs, sha256)
        self._Request, self._Params, self.status = Request, SamplingParams, RequestStatus
        # The scheduler's own chunk alignment, on a stand-in holding the fields it reads.
        fields = SimpleNamespace(
            cache_config=SimpleNamespace(block_size=bs),
            block_size=bs,
            hash_block_size=hbs,
            mamba_partial_cache_hit=getattr(
                self.manager.coordinator, "enable_partial_hash_hits", False
            ),
            use_eagle_block_drop=False,
            num_hash_lookahead_tokens=0,
            mamba_has_prefill_checkpoint_blocks=False,
            mamba_prefill_checkpoint_alignment=None,
            mamba_shared_prefix_checkpoint=False,
            max_num_scheduled_tokens=trace["budget"],
            scheduler_config=SimpleNamespace(long_prefill_token_threshold=0),
        )
        self.split = lambda req, n, hit=0: Scheduler._mamba_block_aligned_split(fields, req, n, hit)

    def make_request(self, spec, extras):
        import torch
        from vllm.lora.request import LoRARequest
        from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

        kw = {}
        if extras:
            kw["lora_request"] = LoRARequest(*spec["lora"]) if spec["lora"] else None
            kw["cache_salt"] = spec["salt"]
            kw["mm_features"] = [
                MultiModalFeatureSpec(
                    data=None,
                    modality="image",
                    identifier=ident,
                    mm_position=PlaceholderRange(offset=off, length=n),
                )
                for ident, off, n in spec["mm"]
            ] or None
            if spec["embeds"]:
                kw["prompt_embeds"] = torch.tensor(_embeds(spec["prompt"]), dtype=torch.float32)
        return self._Request(
            spec["id"],
            list(spec["prompt"]),
            self._Params(max_tokens=len(spec["outputs"])),
            None,
            block_hasher=self.hasher,
            **kw,
        )

    def append(self, req, token):
        req.append_output_token_ids(token)

    def free_queue(self):
        return [b.block_id for b in self.manager.block_pool.free_block_queue.get_all_free_blocks()]


def _embeds(prompt) -> list:
    """Two float32 numbers per prompt token, from the token: shared prefixes share embeddings."""
    return [[float(t), t / 4.0] for t in prompt]


# -- one scheduler loop for both -------------------------------------------------------------------
def _plain(x):
    if isinstance(x, bytes):
        return x.hex()
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _event(ev) -> list:
    kind = type(ev).__name__
    hashes = [int(h) if isinstance(h, int) else h.hex() for h in getattr(ev, "block_hashes", [])]
    return [
        kind,
        hashes,
        getattr(ev, "group_idx", None),
        getattr(ev, "kv_cache_spec_kind", None),
        _plain(getattr(ev, "extra_keys", None)),
        getattr(ev, "lora_id", None),
        getattr(ev, "lora_name", None),
    ]


def drive(side, trace: dict, cfg: dict) -> list:
    """Run the trace; -> one record per step (what both sides must agree on)."""
    m = side.manager
    align = cfg["mode"] == "align"
    lookahead = cfg["lookahead"]
    pending = deque(trace["requests"])
    reqs: dict = {}
    waiting: deque = deque()
    running: list = []
    out: list = []
    for step in range(400):
        while pending and pending[0]["arrive"] <= step:
            spec = pending.popleft()
            r = side.make_request(spec, cfg.get("extras", False))
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
            if align:
                n = side.split(r, n)
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
            if align:
                n = side.split(r, n, num_hit)
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
        copies, retained = m.take_kv_cache_block_copies()
        m.block_pool.free_blocks(retained)  # the scheduler's, once the copies have run
        rec["copies"] = [list(c) for c in copies]
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
    return {
        "seed": seed,
        "config": name,
        "steps": len(a),
        "same": True,
        "hits": sum(1 for r in a for h in r["hits"].values() if h[0]),
        "preemptions": sum(len(r["preempted"]) for r in a),
        "evictions": sum(1 for r in a for e in r["events"] if e[0] == "BlockRemoved"),
        "block_copies": sum(len(r["copies"]) for r in a),
        "partial_hits": sum(1 for r in a for h in r["hits"].values() if h[0] % trace["block_size"]),
        # hits on a multiple of the finer group's block but not of the scheduler's (none may be)
        "unaligned_hits": sum(
            1 for r in a for h in r["hits"].values() if h[0] % group_block_sizes(trace, cfg)[0]
        ),
        "stored_with_extra_keys": sum(
            1 for r in a for e in r["events"] if e[0] == "BlockStored" and e[4] and any(e[4])
        ),
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
    steps = sum(r.get("steps", 0) for r in results)
    summary = {
        "vllm": vllm.__version__,
        "runs": len(results),
        "steps": steps,
        "identical": len(results) - len(bad),
        "prefix_hits": sum(r.get("hits", 0) for r in results),
        "preemptions": sum(r.get("preemptions", 0) for r in results),
        "evictions": sum(r.get("evictions", 0) for r in results),
        "block_copies": sum(r.get("block_copies", 0) for r in results),
        "partial_hits": sum(r.get("partial_hits", 0) for r in results),
        "stored_with_extra_keys": sum(r.get("stored_with_extra_keys", 0) for r in results),
        "unaligned_hits": sum(r.get("unaligned_hits", 0) for r in results),
        "configs": configs,
        "first_differences": bad[:3],
    }
    out.write(json.dumps(summary, indent=1) + "\n")
    return 0 if not bad else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=50, help="random traces per config")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument(
        "--configs",
        default=",".join(HYBRID_CONFIGS),
        help="comma separated (default: the Mamba ones; the others: "
        + ",".join(GROUP_SIZE_CONFIGS)
        + ")",
    )
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
            f"Make one with `bash scripts/vllm_env.sh` (builds /tmp/vllm034-venv), then run\n"
            f"  VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/hybrid_vs_vllm.py"
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
