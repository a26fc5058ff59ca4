"""Our Scheduler against vLLM 0.34.0's own, with ``num_lookahead_tokens > 0``, on random traces.

Run it with the Python of the scratch vLLM environment (``bash scripts/vllm_env.sh``):

    /tmp/vllm034-venv/bin/python scripts/vllm_lookahead_diff.py --traces 40 --seed 1

Both schedulers get the same requests (random prompts, some sharing prefixes, random arrivals)
and, every step, the same model output: each request's tokens are a fixed function of its id and
position, and its drafts are right up to a random point, so some are accepted and some rejected.
Both get the same drafts back (``update_draft_token_ids``). After every ``schedule()`` the script
compares what each scheduled (tokens per request, the drafts scheduled, preempted requests),
every request's block table in physical block ids, the free block count, and after every
``update_from_output`` the requests that finished and their ``num_computed_tokens``. The first
difference is printed with its trace, seed and step, and the exit status is 1.

How vLLM's Scheduler is built here: from a real ``VllmConfig`` (scheduler and cache configs as
ours) but without a model: building vLLM's ``ModelConfig`` inspects the model class, which needs
the GPU-only parts of vLLM. The scheduler reads few model fields (``max_model_len``, whether the
model is encoder-decoder or uses M-RoPE), so a stand-in gives them. ``num_lookahead_tokens`` and
``num_spec_tokens`` are then set on it as ``VllmConfig`` derives them for a draft model (both
``num_speculative_tokens``). Prefix caching on; both hash blocks with sha256 over CBOR.

``--lora``: requests carry LoRA adapters too (three adapters, some requests none) and both
schedulers serve LoRA with ``max_loras`` 1 or 2 (vLLM's ``LoRAConfig``): a waiting request whose
adapter would be one too many is skipped, on both sides, and the adapter is in its blocks' hashes.

``--cache-aware``: vLLM 0.34's cache-aware admission on both sides. Each trace draws (from a
stream of its own, so the traces without the flag stay as they were)
``cache_aware_admission_window`` (0, 1, 2, 3 or 8) and ``cache_aware_admission_threshold`` (0,
0.25, 0.5, 0.75 or 1), more requests and two shared prefixes, so that warm and cold requests
wait together in a pool that is often more than half used; the counts of steps where vLLM's
``_reorder_waiting_by_cached_prefix`` changed its waiting queue, and where it left it as it was
because the usage was below the threshold, are printed.

Padding is compared too: when others run (or the request has computed tokens already), vLLM
pads the admission of a request with one token left to compute to 1 + k rows with placeholder
drafts (-1), which the 'model' here rejects as the target would; the count is printed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import types
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from kvcore.core.sched.scheduler import Scheduler as OurScheduler  # noqa: E402
from kvcore.lora.request import LoRARequest as OurLoRARequest  # noqa: E402
from kvcore.outputs import ModelRunnerOutput as OurOutput  # noqa: E402
from kvcore.request import Request as OurRequest  # noqa: E402
from paged_kv_lab.run.engine import (  # noqa: E402
    block_hasher_for,
    kv_cache_groups,
    kv_cache_manager_for,
    lora_config_for,
    scheduler_config_for,
)
from paged_kv_lab.run.scenario import EngineSettings, SpeculativeConfig  # noqa: E402

VOCAB = 1000
STATS = {
    "steps": 0,
    "preemptions": 0,
    "blocks_only_for_lookahead": 0,
    "lora_skips": 0,
    "padded": 0,
    "reordered": 0,
    "below_threshold": 0,
}
LORA = False  # main's --lora: requests with adapters, schedulers with max_loras
CACHE_AWARE = False  # main's --cache-aware: cache-aware admission's window and threshold drawn


def token_at(rid: str, pos: int) -> int:
    """The 'model': the token after position ``pos - 1`` of request ``rid`` (never EOS)."""
    return 1 + (zlib.crc32(rid.encode()) + 7919 * pos) % (VOCAB - 1)


def make_trace(rng: random.Random) -> dict:
    bs = rng.choice([2, 4, 8])
    k = rng.randint(1, 4)
    num_blocks = rng.randint(8, 40)
    shared = [rng.randrange(1, VOCAB) for _ in range(rng.randint(0, 3 * bs))]
    reqs = []
    for i in range(rng.randint(1, 6)):
        own = [rng.randrange(1, VOCAB) for _ in range(rng.randint(2, 3 * bs))]
        prompt = (shared if rng.random() < 0.5 else []) + own
        reqs.append(
            dict(
                id=f"r{i}", prompt=prompt, max_tokens=rng.randint(1, 24), arrival=rng.randint(0, 6)
            )
        )
    max_num_seqs = rng.randint(1, 4)
    t = dict(
        block_size=bs,
        k=k,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        # vLLM's SchedulerConfig refuses a token budget below max_num_seqs
        max_num_batched_tokens=rng.randint(max(k + 2, max_num_seqs), 64),
        max_model_len=512,
        requests=reqs,
        draft_seed=rng.randrange(1 << 30),
    )
    # LoRA from a stream of its own: the traces without --lora stay as they were
    lora = random.Random(t["draft_seed"] + 1)
    t["max_loras"] = lora.randint(1, 2) if LORA else None
    for r in reqs:
        r["lora"] = lora.choice([None, 1, 2, 3]) if LORA else None
    t["window"], t["threshold"] = 0, 0.5  # vLLM 0.34's defaults: arrival order
    if CACHE_AWARE:  # a stream of its own too: warm and cold requests queued together
        ca = random.Random(t["draft_seed"] + 2)
        t["window"] = ca.choice([0, 1, 2, 3, 8])
        t["threshold"] = ca.choice([0.0, 0.25, 0.5, 0.75, 1.0])
        prefixes = [[ca.randrange(1, VOCAB) for _ in range(ca.randint(bs, 4 * bs))] for _ in "ab"]
        for i in range(len(reqs), ca.randint(len(reqs), 9)):
            reqs.append(
                dict(id=f"r{i}", prompt=[], max_tokens=ca.randint(1, 12), arrival=0, lora=None)
            )
        for r in reqs:
            own = [ca.randrange(1, VOCAB) for _ in range(ca.randint(1, 2 * bs))]
            r["prompt"] = ca.choice([*prefixes, []]) + own
            r["arrival"] = ca.randint(0, 8)
    return t


def lora_of(spec: dict, cls):
    """The request's adapter as ``cls`` (vLLM's or our LoRARequest); None without one."""
    n = spec["lora"]
    return None if n is None else cls(f"adapter{n}", n, f"/adapters/{n}")


# -- vLLM's side --------------------------------------------------------------------------------
def vllm_scheduler(t: dict):
    from vllm.config import CacheConfig, DeviceConfig, SchedulerConfig, VllmConfig
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    sc = SchedulerConfig(
        max_num_seqs=t["max_num_seqs"],
        max_num_batched_tokens=t["max_num_batched_tokens"],
        max_model_len=t["max_model_len"],
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        **(
            dict(
                cache_aware_admission_window=t["window"],
                cache_aware_admission_threshold=t["threshold"],
            )
            if t["window"]
            else {}
        ),
    )
    cc = CacheConfig(block_size=t["block_size"], enable_prefix_caching=True)
    cc.num_gpu_blocks = t["num_blocks"]
    cfg = VllmConfig(scheduler_config=sc, cache_config=cc, device_config=DeviceConfig("cpu"))
    if t["max_loras"] is not None:
        from vllm.config.lora import LoRAConfig

        cfg.lora_config = LoRAConfig(max_loras=t["max_loras"], max_lora_rank=8)
    cfg.model_config = types.SimpleNamespace(  # the few model fields the scheduler reads
        max_model_len=t["max_model_len"],
        is_encoder_decoder=False,
        uses_mrope=False,
        is_diffusion=False,
        return_sampling_mask=False,
        runner_type="generate",
        supports_multimodal_inputs=False,
        multimodal_config=None,
        get_multimodal_config=lambda: None,
    )
    spec = FullAttentionSpec(
        block_size=t["block_size"], num_kv_heads=1, head_size=8, dtype=__import__("torch").float32
    )
    kv = KVCacheConfig(
        num_blocks=t["num_blocks"],
        kv_cache_tensors=[],
        # the draft model's layers join the target's group: one block id names a slot in each
        kv_cache_groups=[KVCacheGroupSpec(["layers.0", "draft_model.layers.0"], spec)],
    )
    init_none_hash(sha256_cbor)
    sched = Scheduler(
        vllm_config=cfg,
        kv_cache_config=kv,
        structured_output_manager=types.SimpleNamespace(  # no grammar: drafts pass as they are
            # 0.34 calls trim_spec_tokens; 0.33 called the same hook validate_tokens
            validate_tokens=lambda request, tokens: tokens,
            trim_spec_tokens=lambda request, tokens: tokens,
            accept_tokens=lambda request, tokens: True,
            grammar_bitmask=lambda *a, **kw: None,
        ),
        block_size=t["block_size"],
    )
    # VllmConfig.num_lookahead_tokens / num_speculative_tokens for method "draft_model"
    sched.num_lookahead_tokens = t["k"]
    sched.num_spec_tokens = t["k"]
    hasher = get_request_block_hasher(t["block_size"], sha256_cbor)
    return sched, hasher


def vllm_request(spec: dict, hasher):
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    sp = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, temperature=0.0)
    lora = lora_of(spec, LoRARequest)
    return Request(
        spec["id"], list(spec["prompt"]), sp, None, lora_request=lora, block_hasher=hasher
    )


# -- ours: the builders the Engine itself uses --------------------------------------------------
def our_scheduler(t: dict) -> OurScheduler:
    s = EngineSettings(
        block_size=t["block_size"],
        num_gpu_blocks=t["num_blocks"],
        max_num_seqs=t["max_num_seqs"],
        max_num_batched_tokens=t["max_num_batched_tokens"],
        max_model_len=t["max_model_len"],
        hash_algo="sha256_cbor",
        speculative=SpeculativeConfig(method="draft_model", num_speculative_tokens=t["k"]),
        enable_lora=t["max_loras"] is not None,
        max_loras=t["max_loras"] or 1,
        cache_aware_admission_window=t["window"],
        cache_aware_admission_threshold=t["threshold"],
    )
    groups, _ = kv_cache_groups(s, 1)
    kvm = kv_cache_manager_for(s, groups, t["max_model_len"], enable_kv_cache_events=False)
    sched = OurScheduler(
        scheduler_config_for(s, t["max_model_len"]), kvm, lora_config=lora_config_for(s)
    )
    sched._hasher = block_hasher_for(s)
    return sched


def our_request(spec: dict, sched: OurScheduler) -> OurRequest:
    return OurRequest(
        spec["id"],
        list(spec["prompt"]),
        spec["max_tokens"],
        ignore_eos=True,
        block_hasher=sched._hasher,
        lora_request=lora_of(spec, OurLoRARequest),
    )


# -- one model step, the same for both -----------------------------------------------------------
def verified(rid: str, num_tokens: int, drafts: list[int]) -> list[int]:
    """Greedy verification against the 'model': drafts up to the first wrong one, then its token."""
    out = []
    for i, d in enumerate(drafts):
        want = token_at(rid, num_tokens + i)
        out.append(want)
        if d != want:
            return out
    out.append(token_at(rid, num_tokens + len(drafts)))
    return out


def drafts_for(seed: int, rid: str, num_tokens: int, k: int) -> list[int]:
    """Right up to a random point, then wrong: some accepted, some rejected."""
    rng = random.Random(f"{seed}/{rid}/{num_tokens}")
    good = rng.randint(0, k)
    return [
        token_at(rid, num_tokens + i) if i < good else 1 + (token_at(rid, num_tokens + i) % 997)
        for i in range(k)
    ]


def step_outputs(scheduled: dict, spec_tokens: dict, computed_before: dict, num_tokens: dict):
    """Per scheduled request, the tokens it gains (nothing for a prefill chunk)."""
    out = {}
    for rid, n in scheduled.items():
        d = list(spec_tokens.get(rid, ()))
        if computed_before[rid] + n - len(d) >= num_tokens[rid]:
            out[rid] = verified(rid, num_tokens[rid], d)
    return out


def run_trace(t: dict, max_steps: int = 400) -> str | None:
    """None if both schedulers agree all the way; else where they first differ."""
    from vllm.v1.outputs import DraftTokenIds
    from vllm.v1.outputs import ModelRunnerOutput as VOutput

    vs, vhasher = vllm_scheduler(t)
    ours = our_scheduler(t)
    if t["window"]:  # count the steps where vLLM's reorder moved someone
        reorder = vs._reorder_waiting_by_cached_prefix

        def counted():
            before = [r.request_id for r in vs.waiting]
            if len(before) > 1 and vs.kv_cache_manager.usage < vs.cache_aware_threshold:
                STATS["below_threshold"] += 1
            reorder()
            STATS["reordered"] += before != [r.request_id for r in vs.waiting]

        vs._reorder_waiting_by_cached_prefix = counted
    pending = sorted(t["requests"], key=lambda r: r["arrival"])
    for step in range(max_steps):
        for spec in [r for r in pending if r["arrival"] <= step]:
            vs.add_request(vllm_request(spec, vhasher))
            ours.add_request(our_request(spec, ours))
            pending.remove(spec)
        if not pending and not vs.has_unfinished_requests() and not ours.has_unfinished_requests():
            return None
        # what each knows before scheduling
        v_tokens = {rid: r.num_tokens for rid, r in vs.requests.items()}
        v_running = {r.request_id for r in vs.running}
        vo = vs.schedule()
        oo = ours.schedule()
        where = f"step {step}"
        vsched = dict(vo.num_scheduled_tokens)
        STATS["padded"] += sum(
            1 for rid, d in oo.scheduled_spec_decode_tokens.items() if d and d[0] < 0
        )
        if vsched != oo.num_scheduled_tokens:
            return f"{where}: scheduled {vsched} vs ours {oo.num_scheduled_tokens}"
        vspec = {r: list(d) for r, d in vo.scheduled_spec_decode_tokens.items()}
        if vspec != oo.scheduled_spec_decode_tokens:
            return f"{where}: drafts {vspec} vs ours {oo.scheduled_spec_decode_tokens}"
        vpre = set(getattr(vo, "preempted_req_ids", None) or ())
        if vpre != oo.preempted_req_ids:
            return f"{where}: preempted {vpre} vs ours {oo.preempted_req_ids}"
        for rid in sorted(set(vs.requests) | set(ours.requests)):
            a = (
                [list(g) for g in vs.kv_cache_manager.get_block_ids(rid)]
                if rid in vs.requests
                else None
            )
            b = (
                [list(g) for g in ours.kv_cache_manager.get_block_ids(rid)]
                if rid in ours.requests
                else None
            )
            if a != b:
                return f"{where}: {rid} blocks {a} vs ours {b}"
        vfree = vs.kv_cache_manager.block_pool.get_num_free_blocks()
        ofree = ours.kv_cache_manager.block_pool.get_num_free_blocks()
        if vfree != ofree:
            return f"{where}: free blocks {vfree} vs ours {ofree}"
        STATS["steps"] += 1
        if t["max_loras"] is not None:  # waiting with an adapter, not admitted, others admitted
            waiting = [r for r in t["requests"] if r["id"] in v_tokens and r["id"] not in v_running]
            STATS["lora_skips"] += sum(
                1
                for r in waiting
                if r["lora"] is not None
                and r["id"] not in vsched
                and any(x not in v_running for x in vsched)
            )
        STATS["preemptions"] += len(oo.preempted_req_ids)
        bs = t["block_size"]
        for rid in oo.num_scheduled_tokens:
            req = ours.requests[rid]
            held = len(ours.kv_cache_manager.get_block_ids(rid)[0])
            if held * bs - req.num_tokens >= bs:  # a whole block past every token it has
                STATS["blocks_only_for_lookahead"] += 1
        if not vo.num_scheduled_tokens and not pending:
            return None  # both refuse the head of the queue for good (it never fits): same
        before = {
            rid: vs.requests[rid].num_computed_tokens - n
            for rid, n in vo.num_scheduled_tokens.items()
        }
        gained = step_outputs(dict(vo.num_scheduled_tokens), vspec, before, v_tokens)
        req_ids = list(vo.num_scheduled_tokens)
        vs.update_from_output(
            vo,
            VOutput(
                req_ids=req_ids,
                sampled_token_ids=[gained.get(r, []) for r in req_ids],
            ),
        )
        ours.update_from_output(oo, OurOutput.from_token_lists(req_ids, gained))
        for rid in sorted(set(vs.requests) | set(ours.requests)):
            a = vs.requests.get(rid)
            b = ours.requests.get(rid)
            if (a is None) != (b is None):
                return f"{where}: {rid} finished in one scheduler only"
            if a is not None and (a.num_computed_tokens, a.num_tokens) != (
                b.num_computed_tokens,
                b.num_tokens,
            ):
                return (
                    f"{where}: {rid} computed/tokens {a.num_computed_tokens}/{a.num_tokens} "
                    f"vs ours {b.num_computed_tokens}/{b.num_tokens}"
                )
        ids = [rid for rid in req_ids if rid in vs.requests]
        props = [
            drafts_for(t["draft_seed"], rid, vs.requests[rid].num_tokens, t["k"]) for rid in ids
        ]
        vs.update_draft_token_ids(DraftTokenIds(ids, [list(p) for p in props]))
        ours.update_draft_token_ids(dict(zip(ids, props)))
    return f"still running after {max_steps} steps"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lora", action="store_true", help="requests with LoRA adapters")
    ap.add_argument(
        "--cache-aware", action="store_true", help="cache-aware admission's window and threshold"
    )
    args = ap.parse_args()
    global LORA, CACHE_AWARE
    LORA, CACHE_AWARE = args.lora, args.cache_aware
    rng = random.Random(args.seed)
    for i in range(args.traces):
        t = make_trace(rng)
        problem = run_trace(t)
        if problem is not None:
            print(
                f"trace {i} (seed {args.seed}, k={t['k']}, block_size={t['block_size']}, "
                f"{t['num_blocks']} blocks): {problem}"
            )
            return 1
    print(
        f"SAME: {args.traces} random traces (seed {args.seed}), {STATS['steps']} steps "
        f"({STATS['preemptions']} preemptions, {STATS['blocks_only_for_lookahead']} times a "
        f"block held only for lookahead, {STATS['padded']} one-token admissions padded to "
        "1 + k rows), each as vLLM 0.34.0's Scheduler with num_lookahead_tokens = k"
        + (
            f"; with LoRA adapters and max_loras 1-2 ({STATS['lora_skips']} times a waiting "
            "request with an adapter stayed out while another was admitted)"
            if LORA
            else ""
        )
        + (
            f"; with cache-aware admission's window and threshold drawn per trace "
            f"({STATS['reordered']} steps where the window reordered the waiting queue, "
            f"{STATS['below_threshold']} where the usage was below the threshold)"
            if CACHE_AWARE
            else ""
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
