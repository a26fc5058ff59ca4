"""The adapter that swaps kvcore in for vLLM 0.34.0's block layer under vLLM's own tests.

scripts/vllm_core_tests.py copies this file as the root conftest.py of a scratch directory that
holds vLLM's tests/ from its sdist, unchanged, and runs pytest there under the Python of the vLLM
scratch environment. With YARDSTICK_SWAP=1 it rebinds, in vLLM's modules and in every module that
imported them by name, the pieces kvcore re-implements with vLLM's names and signatures:

- ``vllm.v1.core.kv_cache_utils``: ``KVCacheBlock``, ``FreeKVCacheBlockQueue``;
- ``vllm.v1.core.block_pool``: ``BlockHashToBlockMap``, ``BlockPool``;

and in kvcore's modules, kvcore's KV event structs (vLLM's fields, vLLM's wire bytes) by vLLM's
classes, which vLLM's code and tests check events against.

vLLM's KVCacheManager, coordinators, single-type managers and Scheduler then run on kvcore's pool,
blocks and free queue, so every test that allocates, caches, touches, frees or evicts a block runs
kvcore's code. A configuration kvcore does not model raises ``Unmodelled`` naming the feature; the
harness classifies by it. Without YARDSTICK_SWAP it swaps nothing: the baseline run, which tells
which tests run on this machine at all.

Per test it records whether any of kvcore's code ran (a profile hook on calls) in the file named
by YARDSTICK_TOUCHED. This file runs under vLLM's interpreter only.
"""

from __future__ import annotations

import json
import os
import sys
import weakref

REPO = os.environ["KVCORE_REPO"]
KVCORE_DIR = os.path.join(os.path.realpath(REPO), "kvcore") + os.sep
SWAP = os.environ.get("YARDSTICK_SWAP") == "1"


class Unmodelled(NotImplementedError):
    """A configuration vLLM supports and kvcore does not model; ``feature`` names it."""

    def __init__(self, feature: str) -> None:
        super().__init__(f"unmodelled: {feature}")
        self.feature = feature


def _swap() -> None:
    sys.path.insert(0, REPO)
    import vllm.v1.core.block_pool as vb
    import vllm.v1.core.kv_cache_coordinator  # noqa: F401  (load before rebinding)
    import vllm.v1.core.kv_cache_manager  # noqa: F401
    import vllm.v1.core.kv_cache_utils as vu
    import vllm.v1.core.sched.scheduler  # noqa: F401
    import vllm.v1.core.single_type_kv_cache_manager  # noqa: F401

    import kvcore.core.block_pool as kb
    import kvcore.core.kv_cache_utils as ku

    class MetricsBridge:
        """kvcore's pool tells its metrics collector per call; vLLM's collector hears per
        block."""

        def __init__(self, collector) -> None:
            self.collector = collector

        def on_blocks_allocated(self, blocks) -> None:
            for b in blocks:
                self.collector.on_block_allocated(b)

        def on_blocks_touched(self, blocks) -> None:
            for b in blocks:
                self.collector.on_block_accessed(b)

        def on_block_evicted(self, block) -> None:
            self.collector.on_block_evicted(block)

        def on_prefix_cache_reset(self, ok: bool, blocks_in_use: int) -> None:
            if ok:
                self.collector.reset()

    class BlockPool(kb.BlockPool):
        """kvcore's BlockPool built from vLLM's constructor arguments."""

        def __init__(
            self,
            num_gpu_blocks: int,
            enable_caching: bool,
            hash_block_size: int,
            enable_kv_cache_events: bool = False,
            metrics_collector=None,
            num_hash_lookahead_tokens: int = 0,
            medium: str = kb.MEDIUM_GPU,
        ) -> None:
            if num_hash_lookahead_tokens:
                raise Unmodelled("hash lookahead tokens (num_hash_lookahead_tokens)")
            if num_gpu_blocks < 2:
                raise Unmodelled("a pool of fewer than 2 blocks")
            super().__init__(
                num_gpu_blocks,
                enable_caching,
                hash_block_size,
                enable_kv_cache_events,
                medium,
                metrics_collector=MetricsBridge(metrics_collector) if metrics_collector else None,
            )
            self.num_hash_lookahead_tokens = 0

    # API shims, not behaviour: kvcore's pool asks the request for a block's extra keys (kvcore
    # models the cache salt only: multimodal, LoRA and prompt-embedding keys are not modelled),
    # and kvcore's block takes its hash by assignment where vLLM's has a setter.
    from vllm.v1.request import Request

    Request.extra_keys_for_block = lambda self, i: ku.cache_salt_extra_keys(self.cache_salt, i)

    def set_block_hash(self, block_hash, num_tokens=None):
        assert self.block_hash is None and self.block_hash_num_tokens is None
        self.block_hash, self.block_hash_num_tokens = block_hash, num_tokens

    ku.KVCacheBlock.set_block_hash = set_block_hash
    block_init = ku.KVCacheBlock.__init__

    def init_block(self, *args, pool=None, **kwargs):
        # vLLM 0.34's blocks hold their pool by weak reference
        if isinstance(pool, weakref.ref):
            pool = pool()
        if pool is not None and not isinstance(pool, kb.BlockPool):
            # vLLM's own pool subclasses (HiSparse host pages, shared event queues) build their
            # blocks with their pool; kvcore has no such pools
            raise Unmodelled("vLLM's BlockPool subclasses (HiSparse, shared KV event queues)")
        block_init(self, *args, **kwargs)

    ku.KVCacheBlock.__init__ = init_block

    # kvcore's KV events are its own structs with vLLM's fields and wire bytes; vLLM's code and
    # tests test them by class (isinstance), so kvcore's modules build vLLM's structs here.
    import vllm.distributed.kv_events as ve

    import kvcore.distributed.kv_events as ke

    event_types = {
        getattr(ke, name): getattr(ve, name)
        for name in ("KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared")
    }
    for name, mod in list(sys.modules.items()):
        if name.startswith("kvcore.") and mod is not None and mod is not ke:
            for attr, value in list(vars(mod).items()):
                if isinstance(value, type) and value in event_types:
                    setattr(mod, attr, event_types[value])

    swaps = {
        vu.KVCacheBlock: ku.KVCacheBlock,
        vu.FreeKVCacheBlockQueue: ku.FreeKVCacheBlockQueue,
        vb.BlockHashToBlockMap: kb.BlockHashToBlockMap,
        vb.BlockPool: BlockPool,
    }
    for name, mod in list(sys.modules.items()):
        if not name.startswith("vllm") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if not (isinstance(value, type) and value in swaps):
                continue
            if name == vb.__name__ and value is vu.KVCacheBlock:
                # vLLM's own pool subclasses (HiSparse, shared event queues) keep building
                # vLLM's blocks; kvcore's BlockPool builds its own.
                continue
            setattr(mod, attr, swaps[value])


def _allow_cpu_without_triton() -> None:
    """vLLM 0.34's CPU platform refuses an x86 machine without triton-cpu when it checks a
    config (its model runner's kernels need it). The core tests build configs, managers and
    schedulers, never a kernel, so the check is told Triton is there; both runs (vLLM alone
    and with kvcore) get this, so it moves no test from one row of the table to another."""
    import vllm.triton_utils as vt
    from vllm.platforms.cpu import CpuPlatform

    check = CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        has_triton, vt.HAS_TRITON = vt.HAS_TRITON, True
        try:
            check(cls, vllm_config)
        finally:
            vt.HAS_TRITON = has_triton

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


_allow_cpu_without_triton()
if SWAP:
    _swap()
if os.environ.get("YARDSTICK_SCHEDULER") == "1":
    # the second mode: kvcore's own Scheduler under vLLM's scheduler tests (kvcore_scheduler.py)
    sys.path.insert(0, os.path.join(REPO, "scripts", "vllm_core_tests"))
    import kvcore_scheduler

    _patch_test_module = kvcore_scheduler.install(Unmodelled)

    def pytest_collection_modifyitems(session, config, items):
        for module in {getattr(item, "module", None) for item in items} - {None}:
            _patch_test_module(module)


SCHEDULER_FILE = os.path.join(os.path.realpath(REPO), "kvcore", "core", "sched", "scheduler.py")
_touched: dict[str, bool] = {}
_scheduler_ran: dict[str, bool] = {}
_current = {"hit": False, "scheduler": False}


def _profile(frame, event, arg):
    if event == "call" and frame.f_code.co_filename.startswith(KVCORE_DIR):
        _current["hit"] = True
        if frame.f_code.co_filename == SCHEDULER_FILE:
            _current["scheduler"] = True


def pytest_runtest_setup(item):
    _current["hit"] = _current["scheduler"] = False
    sys.setprofile(_profile)


def pytest_runtest_teardown(item):
    sys.setprofile(None)
    _touched[item.nodeid] = _current["hit"]
    _scheduler_ran[item.nodeid] = _current["scheduler"]


def pytest_runtest_makereport(item, call):
    if call.when == "call" and call.excinfo is not None:
        exc = call.excinfo.value
        feature = getattr(exc, "feature", None)
        if isinstance(exc, AttributeError) and getattr(exc, "obj", None) is not None:
            owner = type(exc.obj)
            where = f"{owner.__module__}.{owner.__qualname__}.{exc.name}"
        else:
            where = None
        _errors[item.nodeid] = {
            "type": type(exc).__name__,
            "message": str(exc).splitlines()[0][:300] if str(exc) else "",
            "feature": feature,
            "missing_attribute": where,
        }


_errors: dict[str, dict] = {}


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("YARDSTICK_TOUCHED")
    if path:
        with open(path, "w") as fh:
            json.dump({"touched": _touched, "scheduler": _scheduler_ran, "errors": _errors}, fh)
