"""The code behind each decision: every event kind -> the vLLM 0.34.0 function that makes it
and the kvcore function that makes it here.

A vLLM link is a permalink into the ``v0.34.0`` tag: file path and line range, read from the
0.34.0 wheel (its ``vllm/...py`` files are the tag's files) with ``ast``: the range runs from the
function's first decorator (else its ``def``) to its last line. ``VLLM_FILE_LINES`` records each
linked file's line count at that tag, so tests check every range without the network; where the
0.34.0 wheel is installed, tests/lab/test_source_links.py derives each range again and compares.
A kvcore link names ``module:Qualified.name``; ``OurLink.source()`` reads the function's source
from the installed package at run time, so it is always the code that ran.

Moving the links from v0.33.0 to v0.34.0: each function was looked up by its qualified name.
The linked functions of the scheduler, the KV cache managers and coordinators, the block pool,
block hashing, the CPU offload connector and the NIXL connector kept their files and names; only
their line numbers changed. 0.34.0 deleted the files in which the worker sampled and
drafted (``v1/sample/sampler.py``, ``v1/sample/rejection_sampler.py`` and the proposers of
``v1/spec_decode/``): its GPU model runner (``v1/worker/gpu/``) does that work, so these links go
to its code, read to be the same step:

- ``sample``: ``Sampler.forward`` -> ``Sampler.__call__`` (``v1/worker/gpu/sample/sampler.py``),
  the sampler's entry point, which turns the step's logits into the sampled tokens;
- ``propose``: ``NgramProposer.propose`` -> ``NgramGPUSpeculator.propose``, the class that
  ``method="ngram"`` (and ``"ngram_gpu"``) selects in 0.34.0. It differs from 0.33.0's in what
  it proposes: of the earlier occurrences of the longest matching suffix it takes the last one,
  not the first; and it fills all ``num_speculative_tokens`` places of a request that sampled,
  the places past the tokens it found (every place, when nothing matches) with the last sampled
  token. kvcore's ``NgramGPUSpeculator`` follows 0.34.0's rule;
- ``propose_draft_model``: ``SpecDecodeBaseProposer.propose`` -> ``StandaloneARSpeculator.propose``
  (``method="draft_model"``);
- ``propose_eagle``: ``SpecDecodeBaseProposer.propose`` -> ``TargetDependentARSpeculator.propose``,
  the propose that ``EagleSpeculator`` (``method="eagle"``) inherits;
- ``rejection_sample``: the function of that name, now in
  ``v1/worker/gpu/spec_decode/rejection_sampler_utils.py``. With ``rejection_sample_method``
  "standard" (the default) or "block", it keeps a greedy request's drafts up to the first one
  that differs from the target's argmax, as 0.33.0's did ("synthetic" and "fly" accept by other
  rules).

``event_calls`` gives, per event, the call chain (outermost first) down to the function that
made the decision; ``call_order`` turns a step's events into the functions that ran, in order.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from paged_kv_lab.recording import events as E

VLLM_TAG = "v0.34.0"
VLLM_REPO = "https://github.com/vllm-project/vllm"

# Line counts of the linked files at the v0.34.0 tag (from the vllm-0.34.0 wheel).
VLLM_FILE_LINES: dict[str, int] = {
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py": 296,
    "vllm/v1/core/block_pool.py": 936,
    "vllm/v1/core/kv_cache_coordinator.py": 1052,
    "vllm/config/cache.py": 535,
    "vllm/config/vllm.py": 3797,
    "vllm/v1/core/kv_cache_manager.py": 947,
    "vllm/v1/core/kv_cache_planning.py": 1906,
    "vllm/v1/core/kv_cache_utils.py": 1284,
    "vllm/v1/core/sched/scheduler.py": 3934,
    "vllm/v1/core/single_type_kv_cache_manager.py": 2756,
    "vllm/v1/simple_kv_offload/manager.py": 1535,
    "vllm/v1/worker/gpu_worker.py": 1868,
    "vllm/v1/worker/gpu/sample/sampler.py": 357,
    "vllm/v1/worker/gpu/spec_decode/ngram/speculator.py": 276,
    "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py": 1465,
    "vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py": 584,
    "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py": 724,
}


@dataclass(frozen=True)
class VllmLink:
    """A function in vLLM at ``VLLM_TAG``: ``start <= end <= VLLM_FILE_LINES[path]``."""

    path: str
    start: int
    end: int
    qualname: str

    @property
    def url(self) -> str:
        return f"{VLLM_REPO}/blob/{VLLM_TAG}/{self.path}#L{self.start}-L{self.end}"


@dataclass(frozen=True)
class OurLink:
    """A function in kvcore, as ``module:Qualified.name``."""

    target: str

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.target.split(":", 1)[1]

    def resolve(self) -> Callable:
        obj = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def source(self) -> str:
        return inspect.getsource(self.resolve())

    @property
    def path(self) -> str:
        return self.module.replace(".", "/") + ".py"


@dataclass(frozen=True)
class CodeLink:
    """One decision point: the same function in vLLM and in kvcore."""

    name: str  # the function's short name, as a learner reads it in a call chain
    vllm: VllmLink
    ours: OurLink


def _link(name: str, path: str, start: int, end: int, vllm_qualname: str, ours: str) -> CodeLink:
    return CodeLink(name, VllmLink(path, start, end, vllm_qualname), OurLink(ours))


_SCHED = "vllm/v1/core/sched/scheduler.py"
_KVM = "vllm/v1/core/kv_cache_manager.py"
_COORD = "vllm/v1/core/kv_cache_coordinator.py"
_SINGLE = "vllm/v1/core/single_type_kv_cache_manager.py"
_POOL = "vllm/v1/core/block_pool.py"
_UTILS = "vllm/v1/core/kv_cache_utils.py"
_PLANNING = "vllm/v1/core/kv_cache_planning.py"
_OFFLOAD = "vllm/v1/simple_kv_offload/manager.py"
_OURS_OFFLOAD = "kvcore.simple_kv_offload.manager:SimpleCPUOffloadScheduler."

FUNCTIONS: dict[str, CodeLink] = {
    c.name: c
    for c in (
        _link(
            "add_request",
            _SCHED,
            3065,
            3098,
            "Scheduler.add_request",
            "kvcore.core.sched.scheduler:Scheduler.add_request",
        ),
        _link(
            "schedule",
            _SCHED,
            716,
            1838,
            "Scheduler.schedule",
            "kvcore.core.sched.scheduler:Scheduler.schedule",
        ),
        _link(
            "_preempt_request",
            _SCHED,
            1853,
            1897,
            "Scheduler._preempt_request",
            "kvcore.core.sched.scheduler:Scheduler._preempt_request",
        ),
        _link(
            "_reorder_waiting_by_cached_prefix",
            _SCHED,
            2790,
            2828,
            "Scheduler._reorder_waiting_by_cached_prefix",
            "kvcore.core.sched.scheduler:Scheduler._reorder_waiting_by_cached_prefix",
        ),
        _link(
            "update_from_output",
            _SCHED,
            2301,
            2743,
            "Scheduler.update_from_output",
            "kvcore.core.sched.scheduler:Scheduler.update_from_output",
        ),
        _link(
            "finish_requests",
            _SCHED,
            3100,
            3168,
            "Scheduler.finish_requests",
            "kvcore.core.sched.scheduler:Scheduler.finish_requests",
        ),
        _link(
            "_free_request",
            _SCHED,
            3170,
            3202,
            "Scheduler._free_request",
            "kvcore.core.sched.scheduler:Scheduler._free_request",
        ),
        _link(
            "get_computed_blocks",
            _KVM,
            288,
            350,
            "KVCacheManager.get_computed_blocks",
            "kvcore.core.kv_cache_manager:KVCacheManager.get_computed_blocks",
        ),
        _link(
            "prefix_cache_lookup_enabled",
            _KVM,
            251,
            253,
            "KVCacheManager.prefix_cache_lookup_enabled",
            "kvcore.core.kv_cache_manager:KVCacheManager.prefix_cache_lookup_enabled",
        ),
        _link(
            "allocate_slots",
            _KVM,
            401,
            648,
            "KVCacheManager.allocate_slots",
            "kvcore.core.kv_cache_manager:KVCacheManager.allocate_slots",
        ),
        _link(
            "find_longest_cache_hit",
            _SINGLE,
            747,
            843,
            "FullAttentionManager.find_longest_cache_hit",
            "kvcore.core.single_type_kv_cache_manager:FullAttentionManager.find_longest_cache_hit",
        ),
        _link(
            "hybrid_find_longest_cache_hit",
            _COORD,
            806,
            941,
            "HybridKVCacheCoordinator.find_longest_cache_hit",
            "kvcore.core.kv_cache_coordinator:HybridKVCacheCoordinator.find_longest_cache_hit",
        ),
        _link(
            "sliding_find_longest_cache_hit",
            _SINGLE,
            973,
            1069,
            "SlidingWindowManager.find_longest_cache_hit",
            "kvcore.core.single_type_kv_cache_manager:SlidingWindowManager.find_longest_cache_hit",
        ),
        _link(
            "allocate_new_computed_blocks",
            _COORD,
            265,
            313,
            "KVCacheCoordinator.allocate_new_computed_blocks",
            "kvcore.core.kv_cache_coordinator:KVCacheCoordinator.allocate_new_computed_blocks",
        ),
        _link(
            "allocate_new_blocks",
            _SINGLE,
            375,
            415,
            "SingleTypeKVCacheManager.allocate_new_blocks",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.allocate_new_blocks",
        ),
        _link(
            "remove_skipped_blocks",
            _SINGLE,
            687,
            725,
            "SingleTypeKVCacheManager.remove_skipped_blocks",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.remove_skipped_blocks",
        ),
        _link(
            "cache_blocks",
            _SINGLE,
            482,
            547,
            "SingleTypeKVCacheManager.cache_blocks",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.cache_blocks",
        ),
        _link(
            "free",
            _SINGLE,
            596,
            604,
            "SingleTypeKVCacheManager.free",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.free",
        ),
        _link(
            "touch", _POOL, 774, 792, "BlockPool.touch", "kvcore.core.block_pool:BlockPool.touch"
        ),
        _link(
            "get_new_blocks",
            _POOL,
            681,
            722,
            "BlockPool.get_new_blocks",
            "kvcore.core.block_pool:BlockPool.get_new_blocks",
        ),
        _link(
            "_maybe_evict_cached_block",
            _POOL,
            751,
            772,
            "BlockPool._maybe_evict_cached_block",
            "kvcore.core.block_pool:BlockPool._maybe_evict_cached_block",
        ),
        _link(
            "evict_blocks",
            _POOL,
            841,
            859,
            "BlockPool.evict_blocks",
            "kvcore.core.block_pool:BlockPool.evict_blocks",
        ),
        _link(
            "cache_full_blocks",
            _POOL,
            203,
            329,
            "BlockPool.cache_full_blocks",
            "kvcore.core.block_pool:BlockPool.cache_full_blocks",
        ),
        _link(
            "free_blocks",
            _POOL,
            798,
            839,
            "BlockPool.free_blocks",
            "kvcore.core.block_pool:BlockPool.free_blocks",
        ),
        _link(
            "reset_prefix_cache",
            _POOL,
            861,
            901,
            "BlockPool.reset_prefix_cache",
            "kvcore.core.block_pool:BlockPool.reset_prefix_cache",
        ),
        _link(
            "cache_partial_block",
            _POOL,
            459,
            578,
            "BlockPool.cache_partial_block",
            "kvcore.core.block_pool:BlockPool.cache_partial_block",
        ),
        _link(
            "_cache_partial_tail_block",
            _SINGLE,
            864,
            902,
            "FullAttentionManager._cache_partial_tail_block",
            "kvcore.core.single_type_kv_cache_manager:FullAttentionManager._cache_partial_tail_block",
        ),
        _link(
            "_apply_cow",
            _SINGLE,
            460,
            480,
            "SingleTypeKVCacheManager._apply_cow",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager._apply_cow",
        ),
        _link(
            "mamba_allocate_new_blocks",
            _SINGLE,
            1802,
            1928,
            "MambaManager.allocate_new_blocks",
            "kvcore.core.single_type_kv_cache_manager:MambaManager.allocate_new_blocks",
        ),
        _link(
            "take_kv_cache_block_copies",
            _KVM,
            879,
            894,
            "KVCacheManager.take_kv_cache_block_copies",
            "kvcore.core.kv_cache_manager:KVCacheManager.take_kv_cache_block_copies",
        ),
        _link(
            "hash_block_tokens",
            _UTILS,
            703,
            733,
            "hash_block_tokens",
            "kvcore.core.kv_cache_utils:hash_block_tokens",
        ),
        _link(
            "sample",
            "vllm/v1/worker/gpu/sample/sampler.py",
            131,
            221,
            "Sampler.__call__",
            "paged_kv_lab.run.engine:Engine.step",
        ),
        _link(
            "propose",
            "vllm/v1/worker/gpu/spec_decode/ngram/speculator.py",
            212,
            276,
            "NgramGPUSpeculator.propose",
            "kvcore.worker.gpu.spec_decode.ngram.speculator:NgramGPUSpeculator.propose",
        ),
        _link(
            "propose_draft_model",
            "vllm/v1/worker/gpu/spec_decode/standalone_ar/speculator.py",
            301,
            453,
            "StandaloneARSpeculator.propose",
            "kvcore.worker.gpu.spec_decode.standalone_ar.speculator:StandaloneARSpeculator.propose",
        ),
        _link(  # vLLM's EagleSpeculator drafts through its base class's propose
            "propose_eagle",
            "vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py",
            102,
            270,
            "TargetDependentARSpeculator.propose",
            "kvcore.worker.gpu.spec_decode.eagle.speculator:EagleSpeculator.propose",
        ),
        _link(
            "update_draft_token_ids",
            _SCHED,
            2995,
            3014,
            "Scheduler.update_draft_token_ids",
            "kvcore.core.sched.scheduler:Scheduler.update_draft_token_ids",
        ),
        _link(
            "rejection_sample",
            "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
            1125,
            1465,
            "rejection_sample",
            "kvcore.worker.gpu.spec_decode.rejection_sampler_utils:rejection_sample",
        ),
        # -- the CPU tier (SimpleCPUOffloadConnector) --
        _link(
            "_update_waiting_for_remote_kv",
            _SCHED,
            3616,
            3666,
            "Scheduler._update_waiting_for_remote_kv",
            "kvcore.core.sched.scheduler:Scheduler._update_waiting_for_remote_kv",
        ),
        _link(
            "_handle_invalid_blocks",
            _SCHED,
            3854,
            3934,
            "Scheduler._handle_invalid_blocks",
            "kvcore.core.sched.scheduler:Scheduler._handle_invalid_blocks",
        ),
        _link(
            "_update_requests_with_invalid_blocks",
            _SCHED,
            3735,
            3837,
            "Scheduler._update_requests_with_invalid_blocks",
            "kvcore.core.sched.scheduler:Scheduler._update_requests_with_invalid_blocks",
        ),
        _link(
            "_update_from_kv_xfer_finished",
            _SCHED,
            3706,
            3733,
            "Scheduler._update_from_kv_xfer_finished",
            "kvcore.core.sched.scheduler:Scheduler._update_from_kv_xfer_finished",
        ),
        # -- a P/D pair's prefill side (NIXL pull mode) --
        _link(
            "request_finished",
            "vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py",
            194,
            296,
            "NixlPullConnectorScheduler.request_finished",
            "kvcore.distributed.kv_transfer.kv_connector.v1.nixl.pull_scheduler:"
            "NixlPullConnectorScheduler.request_finished",
        ),
        *(
            _link(
                name,
                _OFFLOAD,
                start,
                end,
                f"SimpleCPUOffloadScheduler.{name}",
                _OURS_OFFLOAD + name,
            )
            for name, start, end in (
                ("get_num_new_matched_tokens", 371, 439),
                ("update_state_after_alloc", 443, 564),
                ("build_connector_meta", 566, 628),
                ("update_connector_output", 1077, 1101),
                ("_process_store_completion", 1137, 1243),
            )
        ),
        # the extensible KV cache's sizing (the "How many blocks?" panel, the profile command)
        _link(
            "finalize_extensible_kv_cache",
            _PLANNING,
            1864,
            1906,
            "finalize_extensible_kv_cache",
            "kvcore.core.kv_cache_planning:finalize_extensible_kv_cache",
        ),
        _link(
            "shrink_kv_cache_configs",
            _PLANNING,
            1827,
            1861,
            "shrink_kv_cache_configs",
            "kvcore.core.kv_cache_planning:shrink_kv_cache_configs",
        ),
    )
}

_FREED_BY = {
    "finished": ("update_from_output", "_free_request", "free", "free_blocks"),
    "aborted": ("finish_requests", "_free_request", "free", "free_blocks"),
    "load failed": ("schedule", "_update_waiting_for_remote_kv", "free", "free_blocks"),
    "preempted": ("schedule", "_preempt_request", "free", "free_blocks"),
    "window": ("schedule", "allocate_slots", "remove_skipped_blocks", "free_blocks"),
    "copied": ("schedule", "take_kv_cache_block_copies", "free_blocks"),
    "offload": (
        "update_from_output",
        "_update_from_kv_xfer_finished",
        "update_connector_output",
        "free_blocks",
    ),
}


def event_calls(ev: E.Event, num_groups: int = 1) -> tuple[str, ...]:
    """The call chain (outermost first, names of FUNCTIONS) ending in the function that made
    ``ev``."""
    k = ev.kind
    if k == E.ARRIVED:
        return ("add_request",)
    if k in (E.SCHEDULED, E.ADMITTED, E.RESUMED, E.BLOCKED):
        return ("schedule",)
    if k in (E.CACHE_HIT, E.CACHE_MISS):
        finder = "hybrid_find_longest_cache_hit" if num_groups > 1 else "find_longest_cache_hit"
        return ("schedule", "get_computed_blocks", finder)
    if k == E.TOUCHED:
        return ("schedule", "allocate_slots", "allocate_new_computed_blocks", "touch")
    if k == E.ALLOCATED:
        return ("schedule", "allocate_slots", "allocate_new_blocks", "get_new_blocks")
    if k == E.EVICTED:
        if ev.reason == "rekeyed":
            return ("schedule", "allocate_slots", "cache_blocks", "cache_full_blocks")
        if ev.reason == "evict_blocks":
            return ("evict_blocks", "_maybe_evict_cached_block")
        return (
            "schedule",
            "allocate_slots",
            "allocate_new_blocks",
            "get_new_blocks",
            "_maybe_evict_cached_block",
        )
    if k == E.CACHED:
        return ("schedule", "allocate_slots", "cache_blocks", "cache_full_blocks")
    if k == E.CACHED_PARTIAL:
        return (
            "schedule",
            "allocate_slots",
            "cache_blocks",
            "_cache_partial_tail_block",
            "cache_partial_block",
        )
    if k == E.COPIED:
        if ev.reason == "keep_cached":
            return ("schedule", "allocate_slots", "mamba_allocate_new_blocks")
        return ("schedule", "allocate_slots", "allocate_new_blocks", "_apply_cow")
    if k == E.FREED:
        return _FREED_BY.get(ev.reason, ("free", "free_blocks"))
    if k == E.WINDOW_SKIPPED:
        return ("schedule", "allocate_slots", "remove_skipped_blocks")
    if k == E.PREEMPTED:
        return ("schedule", "_preempt_request")
    if k == E.CACHE_AWARE_REORDER:
        return ("schedule", "_reorder_waiting_by_cached_prefix")
    if k == E.FINISHED:
        if ev.reason == "error":
            return ("update_from_output", "finish_requests")
        return ("finish_requests",) if ev.reason == "aborted" else ("update_from_output",)
    if k == E.RESET:
        return ("reset_prefix_cache",)
    if k == E.SAMPLED:
        return ("sample",)
    if k == E.DRAFT_PROPOSED:
        if ev.uses_target_hidden_states:
            return ("propose_eagle",)
        return ("propose_draft_model",) if ev.num_lookahead_tokens else ("propose",)
    if k == E.DRAFT_ACCEPTED:
        return ("rejection_sample",)
    if k == E.DRAFT_REJECTED:
        return ("update_from_output",)
    if k == E.CPU_HIT:
        return ("schedule", "get_num_new_matched_tokens")
    if k == E.CPU_LOAD:
        return ("schedule", "update_state_after_alloc")
    if k == E.CPU_LOADED:
        return ("schedule", "_update_waiting_for_remote_kv")
    if k == E.CPU_STORED:
        return _FREED_BY["offload"][:-1] + ("_process_store_completion",)
    if k == E.CPU_EVICTED:
        return ("schedule", "build_connector_meta", "get_new_blocks", "_maybe_evict_cached_block")
    if k == E.KV_LOAD_FAILED:
        return (
            "update_from_output",
            "_handle_invalid_blocks",
            "_update_requests_with_invalid_blocks",
        )
    raise ValueError(f"no code link for event kind {k!r}")


def decision_link(ev: E.Event, num_groups: int = 1) -> CodeLink:
    """The function that made the decision ``ev`` records (the innermost of its call chain)."""
    return FUNCTIONS[event_calls(ev, num_groups)[-1]]


@dataclass(frozen=True)
class Call:
    """One function that ran, at ``depth`` below the step's outermost calls."""

    depth: int
    link: CodeLink


def call_order(evs: Iterable[E.Event], num_groups: int = 1) -> tuple[Call, ...]:
    """The functions a step's events went through, in call order: each event's chain, printed
    from where it leaves the previous event's chain; consecutive events of one chain show once."""
    out: list[Call] = []
    prev: Sequence[str] = ()
    for ev in evs:
        chain = event_calls(ev, num_groups)
        same = 0
        while same < min(len(chain), len(prev)) and chain[same] == prev[same]:
            same += 1
        if same == len(chain):
            if len(chain) == len(prev):
                continue
            same -= 1  # a caller of the previous chain decided: show it again
        out.extend(Call(d, FUNCTIONS[name]) for d, name in enumerate(chain) if d >= same)
        prev = chain
    return tuple(out)


# The code behind the sizing sentences that no kvcore function of the same name makes (the lab's
# arithmetic in kvcore/model/memory.py stands for them): where vLLM settles the extensible KV
# cache and the utilization, and where its estimate is made.
SIZING_LINKS: dict[str, VllmLink] = {
    "resolve_extensible_kv_cache": VllmLink(
        "vllm/config/vllm.py", 3180, 3269, "VllmConfig._resolve_extensible_kv_cache"
    ),
    "resolved_gpu_memory_utilization": VllmLink(
        "vllm/config/cache.py", 494, 501, "CacheConfig.resolved_gpu_memory_utilization"
    ),
    "determine_available_memory": VllmLink(
        "vllm/v1/worker/gpu_worker.py", 672, 841, "Worker.determine_available_memory"
    ),
}
