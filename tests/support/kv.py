"""Small builders shared by the kvcore tests (no torch: NoModelRunner stands in for the model)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
from pathlib import Path
from typing import Any, Optional, Sequence

from kvcore.core.block_pool import BlockPool, BlockRemoved, BlockStored
from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.kv_cache_utils import get_request_block_hasher, maybe_convert_block_hash
from kvcore.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from kvcore.request import Request, RequestStatus
from kvcore.utils.hashing import get_hash_fn_by_name
from paged_kv_lab.recording import snapshot
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.run.engine import Engine, NoModelRunner
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario
from support.paths import REFERENCE

# the vLLM scratch environments of the lab's reference checks (tests/support/reference/); they
# skip without them. The hash keys' and the hybrid block size's are 0.34.0's (/tmp/vllm034-venv,
# ``bash scripts/vllm_env.sh``; ``VLLM_VENV``). 0.33.0's (/tmp/vllm-venv, ``VLLM_VENV_033``) is
# there for a comparison with the release before the move; no check asks it by default.
VLLM_VENV = os.environ.get("VLLM_VENV_033", "/tmp/vllm-venv")
VLLM_VENV_034 = os.environ.get("VLLM_VENV", "/tmp/vllm034-venv")


def ask_vllm(script: str, spec: Any, *, hash_seed: bool = True, venv: str = VLLM_VENV_034) -> Any:
    """The JSON that tests/support/reference/``script`` writes for ``spec`` (JSON on its stdin),
    run by the Python of the vLLM environment at ``venv``. ``hash_seed=False`` leaves
    PYTHONHASHSEED out of its environment (vLLM's rule for NONE_HASH then applies)."""
    env = {k: v for k, v in os.environ.items() if hash_seed or k != "PYTHONHASHSEED"}
    done = subprocess.run(
        [str(Path(venv) / "bin" / "python"), str(REFERENCE / script)],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


# Group kinds, turned into vLLM-shaped KVCacheGroupSpecs once the block size is known.
FULL = ("full",)


def sliding(window: int):
    return (("sliding", window),)


def hybrid(window: int):
    return ("full", ("sliding", window))


def group_specs(groups, block_size: int) -> tuple[KVCacheGroupSpec, ...]:
    out = []
    for i, g in enumerate(groups):
        if isinstance(g, KVCacheGroupSpec):
            out.append(g)
        elif g == "full":
            out.append(KVCacheGroupSpec((f"full.{i}",), FullAttentionSpec(block_size)))
        else:
            out.append(KVCacheGroupSpec((f"sliding.{i}",), SlidingWindowSpec(block_size, g[1])))
    return tuple(out)


# -- vLLM's formula, computed independently of kvcore -----------------------------------
def vllm_sha256(obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


VLLM_NONE_HASH_SHA256 = vllm_sha256("vllm-none-hash")


def vllm_chain(tokens: Sequence[int], block_size: int, salt: Optional[str] = None) -> list[bytes]:
    out, parent = [], VLLM_NONE_HASH_SHA256
    for i in range(len(tokens) // block_size):
        extra = (("cache_salt", salt),) if (i == 0 and salt) else None
        parent = vllm_sha256((parent, tuple(tokens[i * block_size : (i + 1) * block_size]), extra))
        out.append(parent)
    return out


# -- builders ---------------------------------------------------------------------------
def make_request(
    rid: str,
    tokens: Sequence[int],
    block_size: int,
    *,
    salt: Optional[str] = None,
    max_tokens: int = 16,
    priority: int = 0,
    arrival: int = 0,
    hash_algo: str = "sha256",
    caching: bool = True,
) -> Request:
    hasher = (
        get_request_block_hasher(block_size, get_hash_fn_by_name(hash_algo)) if caching else None
    )
    return Request(
        rid,
        list(tokens),
        max_tokens,
        arrival_time=arrival,
        priority=priority,
        cache_salt=salt,
        block_hasher=hasher,
    )


def make_manager(
    num_blocks: int,
    block_size: int,
    groups=FULL,
    *,
    caching: bool = True,
    free_order: str = "v0.33",
    retention_interval: Optional[int] = 0,
    recorder: Optional[Recorder] = None,
    max_model_len: int = 1 << 30,
    max_num_batched_tokens: Optional[int] = None,
    watermark: float = 0.0,
    use_eagle: bool = False,
) -> KVCacheManager:
    config = KVCacheConfig(num_blocks, group_specs(groups, block_size), retention_interval)
    kvm = KVCacheManager(
        config,
        max_model_len,
        caching,
        max_num_batched_tokens,
        watermark,
        free_order,
        enable_kv_cache_events=True,
        use_eagle=use_eagle,
    )
    if recorder is not None:
        recorder.attach(kvm)
    return kvm


def queue_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def admit(kvm: KVCacheManager, req: Request, num_new: Optional[int] = None):
    """What the scheduler does for a waiting request: look up hits, then allocate."""
    hits, num_hit, req.shared_prefix_boundary = kvm.get_computed_blocks(req)
    n = (req.num_tokens - num_hit) if num_new is None else num_new
    new = kvm.allocate_slots(req, n, num_hit, hits)
    if new is not None:
        kvm.record_prefix_cache_stats(req, num_hit)
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_hit + n
    return new, hits, num_hit


def settings(**kw) -> EngineSettings:
    base = dict(
        block_size=4,
        num_gpu_blocks=16,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        hash_algo="sha256",
    )
    base.update(kw)
    return EngineSettings(**base)


def spec(rid: str, tokens: Sequence[int], **kw) -> RequestSpec:
    kw.setdefault("ignore_eos", True)
    return RequestSpec(rid, prompt_token_ids=tuple(tokens), **kw)


def make_engine(requests=(), runner=None, debug: bool = True, **kw) -> Engine:
    scen = Scenario(name="test", engine=settings(**kw), requests=tuple(requests))
    return Engine(scen, runner=runner or NoModelRunner(), debug=debug)


def events_of(records, kind: str, request_id: Optional[str] = None) -> list:
    if isinstance(records, snapshot.StepRecord):
        records = [records]
    return [
        e
        for r in records
        for e in r.events
        if e.kind == kind and (request_id is None or e.request_id == request_id)
    ]


def table(engine: Engine, rid: str, group: int = 0) -> list[int]:
    return engine.kv_cache_manager.get_block_ids(rid)[group]


def ext(h):
    return maybe_convert_block_hash(h)  # a hash as the KV events carry it (uint64)


def stored(hashes, parent, token_ids, block_size, group=0, kind=None):
    """BlockStored as vLLM fills it: medium GPU, one extra-keys entry per hash; ``kind`` is
    stamped by the KVCacheManager, not the pool."""
    return BlockStored(
        block_hashes=[ext(h) for h in hashes],
        parent_block_hash=None if parent is None else ext(parent),
        token_ids=token_ids,
        block_size=block_size,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[None] * len(hashes) or None,
        group_idx=group,
        kv_cache_spec_kind=kind,
    )


def removed(h, group=0):
    return BlockRemoved(block_hashes=[ext(h)], medium="GPU", group_idx=group)


def cpu_tier_holding_run():
    """A CPU-tier run in which a request waits in ``kv_holding_waiting`` while its K/V loads:
    A's blocks are stored on the CPU and evicted by B's; C shares A's prefix, finds it on the CPU
    and is loaded. (engine, the state before step 1, the records)."""
    from paged_kv_lab.run.scenario import CPUOffloadConfig

    p = [17, 254, 1033, 88, 4012, 7, 391, 2290, 56, 1777, 640, 12, 9001, 345, 78, 2048, 31, 4444]
    eng = make_engine(
        [
            spec("A", p[:17], max_tokens=4),
            spec("B", p[::-1][:17], max_tokens=4, arrival_step=6),
            spec("C", p[:16] + [5, 6], max_tokens=4, arrival_step=12),
        ],
        block_size=4,
        num_gpu_blocks=9,
        cpu_offload=CPUOffloadConfig(num_cpu_blocks=12),
    )
    initial = eng.snapshot()
    return eng, initial, eng.run()


def pd_async_waiting_run():
    """The decode replica of P/D trace 0 of bench/pd_vs_vllm.py (``max_num_inflight_kv_loads``
    3): requests wait in ``async_kv_waiting`` for a pull to start, and in ``kv_holding_waiting``
    while it is in flight. (the decode engine, its state before step 1, its records)."""
    import sys

    from paged_kv_lab.disagg.pd import DECODE
    from support.paths import ROOT

    sys.path.insert(0, str(ROOT / "bench"))
    import pd_vs_vllm

    pd = pd_vs_vllm.pd_engine(pd_vs_vllm.random_case(0))
    eng = pd.engines[DECODE]
    initial = eng.snapshot()
    while pd.has_unfinished() and pd.tick < 1000:
        pd.step()
    assert not pd.has_unfinished()
    return eng, initial, list(eng.history)
