"""The CPU tier against vLLM 0.34.0's own SimpleCPUOffloadScheduler, on random traces.

Each trace is a few requests over three shared prefixes, arriving one after another, in a GPU pool
too small to keep them all: blocks are stored to the CPU, evicted from the GPU, found on the CPU
and loaded back. Our engine runs the trace (kvcore's Scheduler, KVCacheManager and
SimpleCPUOffloadConnector, a stand-in model, a worker that finishes every copy in its step). Its
schedule (who was looked up, admitted, run, with how many tokens; the tokens sampled; who
finished) is then replayed step by step against vLLM's own ``KVCacheManager`` and
``SimpleCPUOffloadScheduler`` driven with a fake worker, as vLLM's tests drive it: the same calls
the vLLM Scheduler makes (``get_computed_blocks``, ``get_num_new_matched_tokens``,
``allocate_slots``, ``update_state_after_alloc``, ``build_connector_meta``,
``request_finished_all_groups``, ``update_connector_output``). vLLM decides every block by itself;
per step both sides must then agree on:

- the lookups: GPU hit tokens and CPU hit tokens of each request looked up;
- what is **stored**: the store job's GPU blocks and CPU blocks, in order;
- what is **loaded**: the load job's CPU blocks and GPU blocks, in order;
- the block tables of the requests scheduled, and both free queues (GPU and CPU) after the step;
- after a failed load (``invalid_block_ids``): the requests cut back with the tokens they keep,
  and the blocks handed to ``evict_blocks``.

An asynchronous load's ``allocate_slots`` gets ``reserved_blocks`` on vLLM's side from vLLM's own
``Scheduler._inflight_prefill_reserved_blocks``, over the requests the replay keeps in
``_inflight_prefills`` as vLLM's Scheduler does (admitted and not done prefilling, or loading).

Failed loads come two ways. Some traces list requests whose first CPU -> GPU copy fails
(``engine.cpu_offload.fail_loads``: an asynchronous load, as every SimpleCPUOffload load is); some
also have the worker report, at random steps, a computed block of a running request as invalid,
as a connector that loads synchronously would. Each trace draws ``kv_load_failure_policy``
("recompute" or "fail"). vLLM's side hands the same ids to vLLM's own
``Scheduler._handle_invalid_blocks`` and ``_update_waiting_for_remote_kv`` (on a Scheduler object
given just the state those methods read: the running requests in our order, the requests waiting
for their loads, the KV cache manager), and applies what they decide.

vLLM runs in a worker process started with the Python of a scratch environment that has the real
vllm==0.34.0 package (``bash scripts/vllm_env.sh`` builds it; ``VLLM_VENV`` names it).

    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/offload_vs_vllm.py            # 200 traces
    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/offload_vs_vllm.py --traces 20 \
        --json out.json

With ``--scheduler`` it runs instead vLLM 0.34.0's own ``Scheduler`` (``schedule()``,
``update_from_output()``, its ``SimpleCPUOffloadConnector`` in the scheduler role) and kvcore's
Engine side by side on each trace, each deciding by itself with the same fake worker, and compares
every step's three waiting queues, admissions, tokens, statuses and block tables. A run that makes
no progress for ``STALL_STEPS`` steps is reported as stalled, naming its queues, and must stall on
both sides alike (``our_run`` stops there too):

    VLLM_VENV=/tmp/vllm034-venv .venv/bin/python bench/offload_vs_vllm.py --scheduler --traces 200

Without ``VLLM_VENV`` it says how to make one and exits 0 (skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from typing import Any, Optional

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if REPO not in sys.path:
    sys.path.insert(0, REPO)

VLLM_VERSION = "0.34.0"
ASPECTS = (
    "lookups",
    "store",
    "load",
    "tables",
    "gpu_free_queue",
    "cpu_free_queue",
    "rolled_back",
    "evict_blocks",
)


# -- the traces and our side -------------------------------------------------------------------
def random_case(seed: int) -> dict[str, Any]:
    """Requests over three shared prefixes, one arriving every few steps, in a small GPU pool."""
    rng = random.Random(seed)
    block_size = rng.choice([2, 4])
    prefixes = [[rng.randrange(1000) for _ in range(24)] for _ in range(3)]
    requests = []
    step = 0
    for i in range(rng.randint(5, 10)):
        n = rng.randint(block_size + 1, 5 * block_size + 1)
        tail = [rng.randrange(1000) for _ in range(rng.randint(0, 2))]
        prompt = (prefixes[rng.randrange(3)][:n] + tail)[: 6 * block_size]
        requests.append(
            {"id": f"R{i}", "prompt": prompt, "max_tokens": rng.randint(1, 4), "arrival": step}
        )
        step += rng.randint(0, 5)
    case = {
        "seed": seed,
        "block_size": block_size,
        "num_gpu_blocks": rng.randint(8, 12),
        "num_cpu_blocks": rng.randint(3, 24),
        "lazy_offload": rng.random() < 0.3,
        "max_num_seqs": rng.choice([1, 2]),
        "requests": requests,
    }
    # drawn last, so the traces above stay what they were before failed loads were added
    case["kv_load_failure_policy"] = rng.choice(["recompute", "fail"])
    failing = rng.random() < 0.5
    case["fail_loads"] = [r["id"] for r in requests if failing and rng.random() < 0.5]
    case["sync_failure_rate"] = rng.choice([0.0, 0.0, 0.1])
    case["failure_seed"] = rng.randrange(1 << 30)
    return case


def scenario(case: dict[str, Any]):
    """The trace as a Scenario (the failed loads it lists included; not the synchronous ones
    that ``our_run``'s worker reports at random)."""
    from paged_kv_lab.run.scenario import CPUOffloadConfig, EngineSettings, RequestSpec, Scenario

    return Scenario(
        name=f"offload-{case['seed']}",
        engine=EngineSettings(
            block_size=case["block_size"],
            num_gpu_blocks=case["num_gpu_blocks"],
            max_num_seqs=case["max_num_seqs"],
            hash_algo="sha256",
            cpu_offload=CPUOffloadConfig(
                num_cpu_blocks=case["num_cpu_blocks"],
                lazy_offload=case["lazy_offload"],
                kv_load_failure_policy=case.get("kv_load_failure_policy", "fail"),
                fail_loads=tuple(case.get("fail_loads", ())),
            ),
        ),
        requests=tuple(
            RequestSpec(
                id=r["id"],
                prompt_token_ids=tuple(r["prompt"]),
                max_tokens=r["max_tokens"],
                arrival_step=r["arrival"],
                ignore_eos=True,
            )
            for r in case["requests"]
        ),
    )


def kept_scheduler_outputs(eng) -> list:
    """The list every step of ``eng``'s engine core appends its SchedulerOutput to, from now on
    (the harnesses read what each step scheduled, which the Engine does not keep)."""
    outs: list = []
    core_step = eng.engine_core.step

    def step():
        done = core_step()
        outs.append(done.scheduler_output)
        return done

    eng.engine_core.step = step
    return outs


def our_run(case: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """(the replay script, our observations), one entry per step."""
    from paged_kv_lab.run.engine import Engine, NoModelRunner

    eng = Engine(scenario(case), runner=NoModelRunner(), debug=True)
    outs = kept_scheduler_outputs(eng)
    manager = eng.kv_connector.scheduler_manager
    # what the step's failed loads were, and what the scheduler did with them
    worker = eng.engine_core.kv_connector.worker_handler
    reported_ids: list[int] = []
    evicted_ids: list[int] = []
    order: dict[str, list[str]] = {}
    report_errors = worker.get_block_ids_with_load_errors
    kvm_evict = eng.kv_cache_manager.evict_blocks
    update = eng.scheduler.update_from_output

    def get_block_ids_with_load_errors():
        ids = report_errors()
        if rng.random() < case.get("sync_failure_rate", 0.0):
            ids |= sync_failure()
        reported_ids.extend(ids)
        return ids

    def sync_failure() -> set[int]:
        """As a synchronously loading connector would report it: one block a running request
        computed before this step. Not one whose table from there on holds a block a store
        still pins (one this step issues, or one issued earlier whose copy has not completed):
        evicting such a block trips vLLM's own assertion in ``_process_store_completion`` (a
        combination vLLM never meets, the CPU tier's loads being asynchronous), and ours the
        same."""
        bs = case["block_size"]
        storing = set(worker._connector_metadata.store_gpu_blocks)
        for transfer in manager._store_event_to_blocks.values():
            storing.update(transfer.gpu_block_ids)
        scheduled = order["out"].num_scheduled_tokens
        computed = {}  # each running request's blocks computed before this step
        for r in eng.scheduler.running:
            table = eng.kv_cache_manager.get_block_ids(r.request_id)[0]
            n = r.num_computed_tokens - scheduled.get(r.request_id, 0)
            computed[r.request_id] = (table, n // bs, -(-n // bs))  # full blocks, any tokens
        choices = []
        for table, n_full, _ in computed.values():
            for b in table[:n_full]:
                # the scheduler evicts from the block on in every table holding it among the
                # blocks with computed tokens (a shared prefix: other tables' tails count too)
                tails = [t[t.index(b) :] for t, _, n in computed.values() if b in t[:n]]
                if b not in choices and not any(storing & set(tail) for tail in tails):
                    choices.append(b)
        return {rng.choice(choices)} if choices else set()

    def evict_blocks(block_ids):
        evicted_ids.extend(block_ids)
        return kvm_evict(block_ids)

    schedule = eng.scheduler.schedule

    def schedule_and_keep():
        order["out"] = schedule()
        return order["out"]

    def update_from_output(out, runner_output):
        order["running"] = [r.request_id for r in eng.scheduler.running]
        order["loading"] = [
            r.request_id
            for r in eng.scheduler.kv_holding_waiting.ordered()
            if r.status.value == "waiting_for_remote_kvs"
        ]
        return update(out, runner_output)

    worker.get_block_ids_with_load_errors = get_block_ids_with_load_errors
    eng.kv_cache_manager.evict_blocks = evict_blocks
    eng.scheduler.update_from_output = update_from_output
    eng.scheduler.schedule = schedule_and_keep
    rng = random.Random(case.get("failure_seed", 0))
    script, seen = [], []
    known: set[str] = set()
    watch = StallWatch()
    finished_ids: set[str] = set()
    while eng.has_unfinished() and len(outs) < 500:
        reported_ids.clear()
        evicted_ids.clear()
        order.clear()
        rec = eng.step()
        out = outs[-1]
        arrivals = [
            {"id": rid, "prompt": list(r.prompt_token_ids), "max_tokens": r.max_tokens}
            for rid, r in eng.requests.items()
            if rid not in known
        ]
        known.update(eng.requests)
        loads = {e.request_id for e in rec.events if e.kind == "cpu_load"}
        actions, lookups = [], []
        for rid in out.scheduled_cached_reqs.req_ids:  # running; a resumed one is a new one
            actions.append(["run", rid, out.num_scheduled_tokens[rid]])
        for e in rec.events:
            if e.kind in ("cache_hit", "cache_miss"):
                n = out.num_scheduled_tokens.get(e.request_id)
                n = 0 if e.request_id in loads else n
                actions.append(["admit", e.request_id, n])
                local = e.num_tokens if e.kind == "cache_hit" else 0
                ext = sum(
                    c.num_tokens
                    for c in rec.events
                    if c.kind == "cpu_hit" and c.request_id == e.request_id
                )
                lookups.append([e.request_id, local, ext])
            elif e.kind == "cpu_loaded":
                actions.append(["resume", e.request_id, out.num_scheduled_tokens.get(e.request_id)])
            elif (
                e.kind in ("admitted", "resumed")
                or (e.kind == "blocked" and e.reason == "no_free_blocks")
            ) and not any(a[1] == e.request_id for a in actions):
                # back from a load in an earlier step: no lookup, its tokens are computed
                actions.append(
                    ["continue", e.request_id, out.num_scheduled_tokens.get(e.request_id)]
                )
        md = out.kv_connector_metadata
        script.append(
            {
                "arrivals": arrivals,
                "actions": actions,
                # FCFS victims, in the order the running loop took them
                "preempted": [e.request_id for e in rec.events if e.kind == "preempted"],
                "new_tokens": {k: list(v) for k, v in rec.new_tokens.items()},
                "finished": [e.request_id for e in rec.events if e.kind == "finished"],
                "invalid_block_ids": sorted(reported_ids),
                "running": order.get("running", []),
                "loading": order.get("loading", []),
            }
        )
        seen.append(
            {
                "lookups": lookups,
                "store": [list(md.store_gpu_blocks), list(md.store_cpu_blocks)],
                "load": [list(md.load_cpu_blocks), list(md.load_gpu_blocks)],
                "tables": {
                    rid: list(eng.kv_cache_manager.get_block_ids(rid)[0])
                    for rid in out.num_scheduled_tokens
                    if rid in eng.scheduler.requests
                },
                "gpu_free_queue": [
                    b.block_id
                    for b in eng.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()
                ],
                "cpu_free_queue": [
                    b.block_id
                    for b in manager.cpu_block_pool.free_block_queue.get_all_free_blocks()
                ],
                "rolled_back": sorted(
                    [e.request_id, e.num_computed_tokens]
                    for e in rec.events
                    if e.kind == "kv_load_failed"
                ),
                "evict_blocks": sorted(evicted_ids),
            }
        )
        sched = eng.scheduler
        gone = [rid for rid in known if rid not in sched.requests and rid not in finished_ids]
        finished_ids.update(gone)
        state = scheduler_state(sched, out, gone)
        if watch.stalled(state, bool(loads) or bool(reported_ids)):
            # vLLM 0.34.0's own Scheduler stalls on the same traces (--scheduler): stop here
            script[-1]["stalled"] = stall_report(len(script), state)
            return script, seen
    assert not eng.has_unfinished(), f"trace {case['seed']} did not finish"
    return script, seen


# -- vLLM's side (runs under vLLM's interpreter) ------------------------------------------------
def vllm_replay(case: dict[str, Any], script: list[dict]) -> list[dict]:
    """The script replayed against vLLM's KVCacheManager and SimpleCPUOffloadScheduler."""
    from types import SimpleNamespace

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
        KVCacheTensor,
    )
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.simple_kv_offload.manager import SimpleCPUOffloadScheduler
    from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata

    bs, n_gpu = case["block_size"], case["num_gpu_blocks"]
    init_none_hash(sha256)
    hasher = get_request_block_hasher(bs, sha256)
    spec = FullAttentionSpec(bs, num_kv_heads=1, head_size=8, dtype=torch.float32)
    page = spec.page_size_bytes
    config = KVCacheConfig(
        num_blocks=n_gpu,
        kv_cache_tensors=[
            KVCacheTensor(size=page * n_gpu, layers=["l0"], layer_stride=0, block_stride=page)
        ],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)],
    )
    max_model_len = 1 << 16
    kvm = KVCacheManager(
        config, max_model_len, bs, bs, max_in_flight_tokens=256, enable_kv_cache_events=True
    )
    vllm_config = SimpleNamespace(
        kv_events_config=SimpleNamespace(enable_kv_cache_events=True),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, world_size=1),
        speculative_config=None,
        model_config=SimpleNamespace(max_model_len=max_model_len),
        max_in_flight_tokens=256,
        num_prefill_lookahead_tokens=0,
        num_hash_lookahead_tokens=0,  # read by 0.34's SimpleCPUOffloadScheduler
        scheduler_config=SimpleNamespace(max_num_batched_tokens=256),
    )
    mgr = SimpleCPUOffloadScheduler(
        vllm_config,
        config,
        cpu_capacity_bytes=page * 1024,
        scheduler_block_size=bs,
        hash_block_size=bs,
        lazy_offload=case["lazy_offload"],
        num_cpu_blocks=case["num_cpu_blocks"],
    )
    mgr.bind_gpu_block_pool(kvm.block_pool)
    # vLLM's own Scheduler methods for failed loads, on an object holding only what they read
    sch = object.__new__(Scheduler)
    sch.kv_cache_config = config
    sch.kv_cache_manager = kvm
    sch.block_size = bs
    sch.connector = mgr
    sch.recompute_kv_load_failures = case.get("kv_load_failure_policy", "fail") == "recompute"
    sch.failed_recving_kv_req_ids = set()
    sch.finished_recving_kv_req_ids = set()
    sch.needs_kv_cache_zeroing = False
    sch.prefix_replay_tokens = 0
    sch.prefix_replay_group_ids = []
    # what vLLM's _inflight_prefill_reserved_blocks reads: the gate on an asynchronous load
    sch.max_model_len = max_model_len
    sch.num_spec_tokens = 0
    sch.num_lookahead_tokens = 0
    sch._spec_decode_step_blocks = 0
    sch._inflight_prefills = set()
    # 0.34's parked loads' reservations, kept apart (_reserve_parked)
    sch._parked_reservations = {}
    sch._parked_reserved_blocks = 0
    evicted: list[int] = []
    kvm_evict = kvm.evict_blocks

    def evict_blocks(block_ids):
        evicted.extend(block_ids)
        kvm_evict(block_ids)

    kvm.evict_blocks = evict_blocks
    affected: set[str] = set()
    update_requests = sch._update_requests_with_invalid_blocks

    def update_requests_with_invalid_blocks(*args, **kwargs):
        res = update_requests(*args, **kwargs)
        affected.update(res[0])
        return res

    sch._update_requests_with_invalid_blocks = update_requests_with_invalid_blocks
    reqs: dict[str, Any] = {}
    load_reported: set[str] = set()  # loads reported finished (vLLM: finished_recving_kv_req_ids)
    finished_prev: set[str] = set()
    seen = []
    for step in script:
        for a in step["arrivals"]:
            reqs[a["id"]] = Request(
                a["id"],
                a["prompt"],
                SamplingParams(max_tokens=a["max_tokens"], ignore_eos=True),
                None,
                block_hasher=hasher,
            )
        new_reqs, cached_ids, cached_blocks, sched, lookups = [], [], [], {}, []
        victims, preempted = list(step["preempted"]), set()

        def preempt(victim):
            v = reqs[victim]
            kvm.free(v)
            v.status = RequestStatus.PREEMPTED
            v.num_computed_tokens = 0
            v.num_preemptions += 1
            sch._inflight_prefills.discard(v)
            preempted.add(victim)

        def admitted(r, num_computed, n):
            # as vLLM's waiting loop: a request whose prefill this step does not finish
            if num_computed + n < r.num_tokens:
                sch._inflight_prefills.add(r)

        for act, rid, n in step["actions"]:
            r = reqs[rid]
            if act == "run":
                blocks = kvm.allocate_slots(r, n)
                while blocks is None and victims:
                    preempt(victims.pop(0))  # as our running loop did
                    blocks = kvm.allocate_slots(r, n)
                assert blocks is not None, f"vLLM could not grow {rid}'s table"
                cached_ids.append(rid)
                ids = blocks.get_block_ids()
                cached_blocks.append(ids if any(ids) else None)
                sched[rid] = n
            elif act == "admit":
                hits, local, _ = kvm.get_computed_blocks(r)
                ext, load_async = mgr.get_num_new_matched_tokens(r, local)
                lookups.append([rid, local, ext])
                if load_async:
                    blocks = kvm.allocate_slots(
                        r,
                        0,
                        local,
                        hits,
                        num_external_computed_tokens=ext,
                        delay_cache_blocks=True,
                        full_sequence_must_fit=True,
                        reserved_blocks=sch._inflight_prefill_reserved_blocks()
                        + sch._spec_decode_step_blocks,
                    )
                else:
                    num_new = n or r.num_tokens - local
                    blocks = kvm.allocate_slots(
                        r, num_new, local, hits, full_sequence_must_fit=True
                    )
                if blocks is None:
                    assert n is None, f"vLLM refused {rid} where ours admitted it"
                    continue
                assert n is not None, f"vLLM admitted {rid} where ours refused it"
                mgr.update_state_after_alloc(r, kvm.get_blocks(rid), ext)
                if load_async:
                    load_reported.discard(rid)
                    r.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    r.num_computed_tokens = local + ext
                    sch._inflight_prefills.add(r)
                else:
                    admitted(r, local, n)
                    # new or resumed: its whole table, among the new requests (vLLM 0.34)
                    new_reqs.append(SimpleNamespace(req_id=rid, block_ids=kvm.get_block_ids(rid)))
                    r.status = RequestStatus.RUNNING
                    r.num_computed_tokens = local
                    sched[rid] = n
            else:  # "resume" (the load just finished) or "continue" (it finished earlier)
                if act == "resume" and rid in sch.failed_recving_kv_req_ids:
                    sch.finished_recving_kv_req_ids.add(rid)
                    sch._update_waiting_for_remote_kv(r)  # vLLM's: valid prefix or nothing
                    r.status = (
                        RequestStatus.PREEMPTED if r.num_preemptions else RequestStatus.WAITING
                    )
                    if r.num_computed_tokens == 0:
                        continue  # its blocks went back: a fresh lookup follows ("admit")
                elif act == "resume":
                    kvm.cache_blocks(r, r.num_computed_tokens)
                    if r.num_computed_tokens == r.num_tokens:
                        r.num_computed_tokens -= 1
                    r.status = (
                        RequestStatus.PREEMPTED if r.num_preemptions else RequestStatus.WAITING
                    )
                blocks = kvm.allocate_slots(
                    r, n or r.num_tokens - r.num_computed_tokens, full_sequence_must_fit=True
                )
                if blocks is None:
                    assert n is None, f"vLLM refused {rid} where ours admitted it"
                    continue
                assert n is not None, f"vLLM admitted {rid} where ours refused it"
                new_reqs.append(SimpleNamespace(req_id=rid, block_ids=kvm.get_block_ids(rid)))
                admitted(r, r.num_computed_tokens, n)
                r.status = RequestStatus.RUNNING
                sched[rid] = n
        for victim in victims:  # requests that preempted themselves: never scheduled
            preempt(victim)
        out = SimpleNamespace(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=SimpleNamespace(req_ids=cached_ids, new_block_ids=cached_blocks),
            num_scheduled_tokens=sched,
            preempted_req_ids=preempted,
            finished_req_ids=finished_prev,
            kv_connector_block_state=None,
        )
        md = mgr.build_connector_meta(out)
        for rid, n in sched.items():
            reqs[rid].num_computed_tokens += n
            if reqs[rid].num_computed_tokens >= reqs[rid].num_tokens:  # _update_after_schedule
                sch._inflight_prefills.discard(reqs[rid])
        # the fake worker: every copy of the step is done by its end
        # a list, not a set: vLLM walks it as given, and ours walks the loads in planned order
        recving = list(md.load_event_to_reqs.get(md.load_event, ())) if md.load_event >= 0 else None
        worker_meta = (
            SimpleCPUOffloadWorkerMetadata({md.store_event: 1}) if md.store_event >= 0 else None
        )
        evicted.clear()
        rolled_back = []
        failed: set[str] = set()
        if step.get("invalid_block_ids"):
            sch.running = [reqs[rid] for rid in step["running"]]
            sch.kv_holding_waiting = [reqs[rid] for rid in step["loading"]]
            affected.clear()
            failed = sch._handle_invalid_blocks(set(step["invalid_block_ids"]), sched)
            # Every request vLLM cut back, loading or running: "recompute" returns only the
            # running ones and marks the loading ones, which a loading request failed before
            # already is (so the marks alone would miss it being cut back again).
            rolled_back = sorted([rid, reqs[rid].num_computed_tokens] for rid in affected)
        for rid, toks in step["new_tokens"].items():
            if rid in failed:
                continue  # vLLM drops the output of a request whose KV failed to load
            reqs[rid].append_output_token_ids(toks)
        delayed = []
        for rid in step["finished"]:
            r = reqs[rid]
            r.status = RequestStatus.FINISHED_LENGTH_CAPPED
            sch._inflight_prefills.discard(r)  # Scheduler._free_request
            # as vLLM's Scheduler._connector_finished: the blocks of the computed tokens
            mgr.request_finished_all_groups(
                r, kvm.get_block_ids_for_computed_tokens(rid, r.num_computed_tokens)
            )
            if rid in failed and rid in step["loading"] and rid not in load_reported:
                # Scheduler.finish_requests: a load still writing its blocks frees them when
                # it reports the request finished receiving (_update_from_kv_xfer_finished)
                delayed.append(r)
            else:
                kvm.free(r)
        mgr.update_connector_output(
            KVConnectorOutput(
                finished_recving=recving or None, kv_connector_worker_meta=worker_meta
            )
        )
        load_reported.update(recving or ())
        arrival = list(reqs)  # ours walks the finished loads in arrival order (vLLM: set order)
        for r in sorted(delayed, key=lambda r: arrival.index(r.request_id)):
            assert r.request_id in (recving or ()), r.request_id
            kvm.free(r)
        finished_prev = set(step["finished"])
        seen.append(
            {
                "lookups": lookups,
                "store": [list(md.store_gpu_blocks), list(md.store_cpu_blocks)],
                "load": [list(md.load_cpu_blocks), list(md.load_gpu_blocks)],
                "tables": {
                    rid: list(kvm.get_block_ids(rid)[0])
                    for rid in sched
                    if rid not in step["finished"]
                },
                "gpu_free_queue": [
                    b.block_id for b in kvm.block_pool.free_block_queue.get_all_free_blocks()
                ],
                "cpu_free_queue": [
                    b.block_id for b in mgr.cpu_block_pool.free_block_queue.get_all_free_blocks()
                ],
                "rolled_back": rolled_back,
                "evict_blocks": sorted(evicted),
            }
        )
        for rid in step["finished"]:
            del reqs[rid]
    return seen


# -- both Schedulers themselves, step by step (issue 44) ------------------------------------------
# The replay above drives vLLM's parts with our admissions; this drives vLLM 0.34.0's own
# ``Scheduler.schedule()`` / ``update_from_output()`` (with its ``SimpleCPUOffloadConnector``,
# scheduler role) and kvcore's Engine side by side on the same trace, each deciding by itself.
# One fake worker for both: every copy of a step is done by its end, the first load job serving
# a request of ``fail_loads`` fails (its GPU blocks reported invalid, as kvcore's
# SimpleCPUOffloadWorker does), and the model samples NoModelRunner's token. The random
# synchronous failures of ``our_run`` are not injected here.
STALL_STEPS = 5  # this many steps with no progress at all: the run has stalled


def sampled_token(rid: str, num_computed: int) -> int:
    """NoModelRunner's token after ``num_computed`` tokens of ``rid`` (run/engine.py)."""
    import zlib

    return (zlib.crc32(rid.encode()) + 7919 * num_computed) % 1000


def scheduler_state(sched, out, gone: list[str]) -> dict[str, Any]:
    """What one step left, read the same way from vLLM's Scheduler and from kvcore's: the three
    waiting queues in order, the admissions (``scheduled_new_reqs``) and tokens scheduled, each
    request's status, computed tokens and block table, and the requests finished."""
    kvm = sched.kv_cache_manager
    return {
        "queues": {
            name: [r.request_id for r in getattr(sched, name)]
            for name in ("kv_holding_waiting", "waiting", "async_kv_waiting")
        },
        "running": [r.request_id for r in sched.running],
        "new": [r.req_id for r in out.scheduled_new_reqs],
        "scheduled": sorted([rid, n] for rid, n in out.num_scheduled_tokens.items()),
        "requests": {
            rid: [r.status.name, r.num_computed_tokens, list(kvm.get_block_ids(rid)[0])]
            for rid, r in sorted(sched.requests.items())
        },
        "finished": gone,
    }


class StallWatch:
    """Says when a run has made no progress for ``STALL_STEPS`` steps: nothing scheduled, no
    load, nobody finished, and the requests' queues, statuses and tables as the step before."""

    def __init__(self) -> None:
        self.prev: Any = None
        self.idle = 0

    def stalled(self, state: dict[str, Any], loaded: bool) -> bool:
        key = json.dumps([state["queues"], state["requests"]])
        quiet = not state["scheduled"] and not state["finished"] and not loaded
        self.idle = self.idle + 1 if quiet and key == self.prev else 0
        self.prev = key
        return self.idle >= STALL_STEPS


def stall_report(step: int, state: dict[str, Any]) -> dict[str, Any]:
    """The no-progress state, named by the requests in it."""
    return {
        "step": step,
        "queues": state["queues"],
        "waiting_for_remote_kvs": [
            rid for rid, (st, _, _) in state["requests"].items() if st == "WAITING_FOR_REMOTE_KVS"
        ],
    }


def vllm_scheduler_run(case: dict[str, Any], max_steps: int = 500) -> dict[str, Any]:
    """The trace on vLLM 0.34.0's own Scheduler (under vLLM's interpreter): per step, what
    ``scheduler_state`` reads; ``stalled`` names the no-progress state if the run stalled."""
    from types import SimpleNamespace

    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        KVCacheTensor,
    )
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata

    bs, n_gpu = case["block_size"], case["num_gpu_blocks"]
    max_model_len = 1 << 20  # kvcore's EngineSettings without a model
    sc = SchedulerConfig(
        max_num_seqs=case["max_num_seqs"],
        max_num_batched_tokens=256,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    cc = CacheConfig(block_size=bs, enable_prefix_caching=True)
    cc.num_gpu_blocks = n_gpu
    kt = KVTransferConfig(
        kv_connector="SimpleCPUOffloadConnector",
        kv_role="kv_both",
        kv_load_failure_policy=case.get("kv_load_failure_policy", "fail"),
        kv_connector_extra_config={
            "num_cpu_blocks": case["num_cpu_blocks"],
            "lazy_offload": case["lazy_offload"],
            "cpu_bytes_to_use": 1 << 30,
        },
    )
    cfg = VllmConfig(
        scheduler_config=sc,
        cache_config=cc,
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=kt,
    )
    cfg.model_config = SimpleNamespace(  # the few model fields the scheduler reads
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        uses_mrope=False,
        is_diffusion=False,
        return_sampling_mask=False,
        runner_type="generate",
        supports_multimodal_inputs=False,
        multimodal_config=None,
        get_multimodal_config=lambda: None,
    )
    spec = FullAttentionSpec(bs, num_kv_heads=1, head_size=8, dtype=torch.float32)
    page = spec.page_size_bytes
    kv = KVCacheConfig(
        num_blocks=n_gpu,
        kv_cache_tensors=[
            KVCacheTensor(size=page * n_gpu, layers=["l0"], layer_stride=0, block_stride=page)
        ],
        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)],
    )
    init_none_hash(sha256)
    sched = Scheduler(
        vllm_config=cfg,
        kv_cache_config=kv,
        structured_output_manager=SimpleNamespace(  # no grammar
            trim_spec_tokens=lambda request, tokens: tokens,
            accept_tokens=lambda request, tokens: True,
            grammar_bitmask=lambda *a, **kw: None,
        ),
        block_size=bs,
    )
    hasher = get_request_block_hasher(bs, sha256)
    pending = sorted(case["requests"], key=lambda r: r["arrival"])
    failing = set(case.get("fail_loads", ()))
    steps: list[dict] = []
    watch = StallWatch()

    def work_left() -> bool:
        """vLLM's ``has_requests`` less the step that only reports finished ids to the worker
        (it runs nothing; kvcore's runs end with their last request: docs/fidelity.md)."""
        num_running, num_waiting = sched.get_request_counts()
        return (
            sched.has_unfinished_requests()
            or len(sched.requests) > num_running + num_waiting
            or sched.connector.has_pending_push_work()
        )

    while (pending or work_left()) and len(steps) < max_steps:
        while pending and pending[0]["arrival"] <= len(steps):
            r = pending.pop(0)
            sp = SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=0.0)
            sched.add_request(Request(r["id"], list(r["prompt"]), sp, None, block_hasher=hasher))
        before = list(sched.requests)
        out = sched.schedule()
        md = out.kv_connector_metadata
        invalid: set[int] = set()
        recving: list[str] = []
        if md is not None and md.load_event >= 0:
            recving = list(md.load_event_to_reqs.get(md.load_event, ()))
            if failing.intersection(recving):
                failing -= set(recving)
                invalid = set(md.load_gpu_blocks)
        stored = md is not None and md.store_event >= 0
        ids, toks = [], []
        for rid in out.num_scheduled_tokens:
            r = sched.requests[rid]  # schedule() advanced its computed tokens already
            ids.append(rid)
            done = r.num_computed_tokens >= r.num_tokens
            toks.append([sampled_token(rid, r.num_computed_tokens)] if done else [])
        kv_out = KVConnectorOutput(
            # a list, not a set: vLLM walks it as given, kvcore in the load's planned order
            finished_recving=recving or None,
            invalid_block_ids=invalid,
            kv_connector_worker_meta=(
                SimpleCPUOffloadWorkerMetadata({md.store_event: 1}) if stored else None
            ),
        )
        sched.update_from_output(
            out, ModelRunnerOutput(req_ids=ids, sampled_token_ids=toks, kv_connector_output=kv_out)
        )
        state = scheduler_state(sched, out, [rid for rid in before if rid not in sched.requests])
        steps.append(state)
        if watch.stalled(state, bool(recving)):
            return {"steps": steps, "stalled": stall_report(len(steps), state)}
    return {"steps": steps, "stalled": None}


def our_scheduler_run(case: dict[str, Any], max_steps: int = 500) -> dict[str, Any]:
    """The same trace on kvcore, as the lab runs it (the Engine, its worker failing the listed
    loads), read as ``vllm_scheduler_run`` reads vLLM's."""
    from paged_kv_lab.run.engine import Engine, NoModelRunner

    eng = Engine(scenario(case), runner=NoModelRunner())
    sched = eng.scheduler
    # the Scheduler's decisions alone: not the lab's abort of a request no pool can ever hold
    # (vLLM leaves it waiting; docs/fidelity.md)
    eng.engine_core._abort_if_never_fits = lambda out: None
    outs = kept_scheduler_outputs(eng)
    steps: list[dict] = []
    watch = StallWatch()
    gone_before: set[str] = set()
    while eng.has_unfinished() and len(steps) < max_steps:
        rec = eng.step()
        gone = [rid for rid in eng.requests if rid not in sched.requests and rid not in gone_before]
        gone_before.update(gone)
        state = scheduler_state(sched, outs[-1], gone)
        steps.append(state)
        loaded = any(e.kind == "cpu_loaded" for e in rec.events) or any(
            e.kind == "kv_load_failed" for e in rec.events
        )
        if watch.stalled(state, loaded):
            return {"steps": steps, "stalled": stall_report(len(steps), state)}
    return {"steps": steps, "stalled": None}


def scheduler_worker_main() -> None:
    """Under vLLM's interpreter: cases in on stdin, vLLM's Scheduler's steps out."""
    import logging

    logging.disable(logging.WARNING)
    json.dump([vllm_scheduler_run(case) for case in json.load(sys.stdin)], sys.stdout)


def scheduler_differential(venv: str, seeds: list[int]) -> dict[str, Any]:
    """Both Schedulers on each trace: the first step where they differ (queues, admissions,
    tokens, statuses, tables, finished), and which traces stalled on each side."""
    cases = [random_case(seed) for seed in seeds]
    ours = [our_scheduler_run(case) for case in cases]
    theirs = run_vllm(venv, cases, flag="--scheduler-worker")
    traces, failures, steps = [], [], 0
    for seed, a, b in zip(seeds, ours, theirs):
        first = next(
            (
                f"step {i + 1} {k}: ours {x[k]} vLLM {y[k]}"
                for i, (x, y) in enumerate(zip(a["steps"], b["steps"]))
                for k in x
                if x[k] != y[k]
            ),
            None,
        )
        if first is None and len(a["steps"]) != len(b["steps"]):
            first = f"{len(a['steps'])} steps here, {len(b['steps'])} in vLLM"
        if first is None and a["stalled"] != b["stalled"]:
            first = f"stalled here {a['stalled']}, in vLLM {b['stalled']}"
        steps += len(a["steps"])
        traces.append({"seed": seed, "steps": len(a["steps"]), "stalled": b["stalled"]})
        if first is not None:
            failures.append({"seed": seed, "first": first})
    return {"traces": traces, "steps": steps, "failures": failures}


def worker_main() -> None:
    """Under vLLM's interpreter: cases and scripts in on stdin, vLLM's observations out."""
    import logging

    logging.disable(logging.WARNING)
    jobs = json.load(sys.stdin)
    results = []
    for job in jobs:
        try:
            results.append({"seen": vllm_replay(job["case"], job["script"])})
        except AssertionError as e:
            results.append({"error": str(e)})
    json.dump(results, sys.stdout)


# -- comparing -----------------------------------------------------------------------------------
def compare(ours: list[dict], theirs: dict) -> dict[str, Any]:
    """Per aspect, steps checked and steps that differ (with the first difference)."""
    report: dict[str, Any] = {a: {"steps": 0, "differ": 0} for a in ASPECTS}
    if "error" in theirs:
        report["error"] = theirs["error"]
        return report
    for i, (a, b) in enumerate(zip(ours, theirs["seen"])):
        for aspect in ASPECTS:
            report[aspect]["steps"] += 1
            if a[aspect] != b[aspect]:
                report[aspect]["differ"] += 1
                report.setdefault(
                    "first", f"step {i + 1} {aspect}: ours {a[aspect]} vLLM {b[aspect]}"
                )
    if len(ours) != len(theirs["seen"]):
        report["error"] = f"{len(ours)} steps here, {len(theirs['seen'])} in vLLM"
    return report


def run_vllm(venv: str, jobs: list[dict], flag: str = "--worker") -> list[dict]:
    proc = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-I", os.path.abspath(__file__), flag],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM's side failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def differential(venv: str, seeds: list[int]) -> dict[str, Any]:
    """Run the traces on both sides; totals per aspect, and what was exercised."""
    jobs, ours = [], []
    for seed in seeds:
        case = random_case(seed)
        script, seen = our_run(case)
        jobs.append({"case": case, "script": script})
        ours.append(seen)
    theirs = run_vllm(venv, jobs)
    totals: dict[str, Any] = {a: {"steps": 0, "differ": 0} for a in ASPECTS}
    failures = []
    exercised = dict.fromkeys(
        (
            "steps",
            "lookups",
            "stores",
            "blocks_stored",
            "loads",
            "blocks_loaded",
            "cpu_hit_tokens",
            "preemptions",
            "lazy_traces",
            "failed_load_steps",
            "requests_rolled_back",
            "evict_blocks_calls",
            "blocks_evicted_by_id",
            "requests_failed",
        ),
        0,
    )
    for seed, mine, job, other in zip(seeds, ours, jobs, theirs):
        exercised["lazy_traces"] += job["case"]["lazy_offload"]
        exercised["preemptions"] += sum(len(s["preempted"]) for s in job["script"])
        fail = job["case"].get("kv_load_failure_policy") == "fail"
        for s in job["script"]:
            exercised["failed_load_steps"] += bool(s.get("invalid_block_ids"))
        rep = compare(mine, other)
        for a in ASPECTS:
            totals[a]["steps"] += rep[a]["steps"]
            totals[a]["differ"] += rep[a]["differ"]
        if "error" in rep or "first" in rep:
            failures.append({"seed": seed, **{k: rep[k] for k in ("error", "first") if k in rep}})
        for s in mine:
            exercised["steps"] += 1
            exercised["stores"] += bool(s["store"][0])
            exercised["blocks_stored"] += len(s["store"][0])
            exercised["loads"] += bool(s["load"][0])
            exercised["blocks_loaded"] += len(s["load"][0])
            exercised["lookups"] += len(s["lookups"])
            exercised["cpu_hit_tokens"] += sum(x[2] for x in s["lookups"])
            exercised["requests_rolled_back"] += len(s["rolled_back"])
            exercised["requests_failed"] += len(s["rolled_back"]) if fail else 0
            exercised["evict_blocks_calls"] += bool(s["evict_blocks"])
            exercised["blocks_evicted_by_id"] += len(s["evict_blocks"])
    return {"traces": len(seeds), "aspects": totals, "exercised": exercised, "failures": failures}


def scheduler_main(venv: str, seeds: list[int], json_path: Optional[str]) -> int:
    res = scheduler_differential(venv, seeds)
    stalled = [t for t in res["traces"] if t["stalled"]]
    print(
        f"{len(seeds)} random traces, kvcore's Scheduler vs vLLM {VLLM_VERSION}'s own "
        f"Scheduler.schedule(): {res['steps']} steps, "
        f"{len(seeds) - len(res['failures'])} traces equal at every step"
    )
    for t in stalled:
        s = t["stalled"]
        print(
            f"  trace {t['seed']}: vLLM {VLLM_VERSION} stalls here too, from step "
            f"{s['step'] - STALL_STEPS} (queues {s['queues']}, "
            f"loads landed but never looked at: {s['waiting_for_remote_kvs']})"
        )
    for f in res["failures"][:10]:
        print(f"  differs: {f}")
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=1)
    return 1 if res["failures"] else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="the first trace's seed")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument(
        "--scheduler",
        action="store_true",
        help="run vLLM's own Scheduler and kvcore's side by side instead of the replay",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scheduler-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main()
        return 0
    if args.scheduler_worker:
        scheduler_worker_main()
        return 0
    venv = os.environ.get("VLLM_VENV")
    if not venv or not os.path.exists(os.path.join(venv, "bin", "python")):
        print(
            f"skipped: no vLLM {VLLM_VERSION} environment (VLLM_VENV={venv or 'unset'}).\n"
            "make one with:  bash scripts/vllm_env.sh   then  VLLM_VENV=/tmp/vllm034-venv ..."
        )
        return 0
    seeds = list(range(args.seed, args.seed + args.traces))
    if args.scheduler:
        return scheduler_main(venv, seeds, args.json)
    res = differential(venv, seeds)
    print(f"{res['traces']} random traces, ours vs vLLM {VLLM_VERSION}'s SimpleCPUOffloadScheduler")
    for a, t in res["aspects"].items():
        print(f"  {a:16s} {t['steps'] - t['differ']:6d} / {t['steps']:6d} steps equal")
    ex = res["exercised"]
    print(
        f"  exercised: {ex['steps']} steps, {ex['lookups']} lookups, {ex['stores']} store jobs "
        f"({ex['blocks_stored']} blocks), {ex['loads']} load jobs ({ex['blocks_loaded']} blocks), "
        f"{ex['cpu_hit_tokens']} tokens hit on the CPU, {ex['preemptions']} preemptions; "
        f"{ex['lazy_traces']} traces in lazy mode"
    )
    print(
        f"  failed loads: {ex['failed_load_steps']} steps with invalid_block_ids, "
        f"{ex['requests_rolled_back']} requests cut back ({ex['requests_failed']} of them failed "
        f"under kv_load_failure_policy fail), {ex['evict_blocks_calls']} evict_blocks calls "
        f"({ex['blocks_evicted_by_id']} blocks)"
    )
    for f in res["failures"][:10]:
        print(f"  differs: {f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
