"""The code behind each decision: every event kind -> the vLLM 0.33.0 function that makes it
and the kvcore function that makes it here.

A vLLM link is a permalink into the ``v0.33.0`` tag: file path and line range, read from the
0.33.0 wheel (its ``vllm/...py`` files are the tag's files). ``VLLM_FILE_LINES`` records each
linked file's line count at that tag, so tests check every range without the network. A kvcore
link names ``module:Qualified.name``; ``OurLink.source()`` reads the function's source from the
installed package at run time, so it is always the code that ran.

``EVENT_CALLS`` gives, per event, the call chain (outermost first) down to the function that
made the decision; ``call_order`` turns a step's events into the functions that ran, in order.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from paged_kv_lab.recording import events as E

VLLM_TAG = "v0.33.0"
VLLM_REPO = "https://github.com/vllm-project/vllm"

# Line counts of the linked files at the v0.33.0 tag (from the vllm-0.33.0 wheel).
VLLM_FILE_LINES: dict[str, int] = {
    "vllm/v1/core/sched/scheduler.py": 3783,
    "vllm/v1/core/kv_cache_manager.py": 931,
    "vllm/v1/core/kv_cache_coordinator.py": 1052,
    "vllm/v1/core/single_type_kv_cache_manager.py": 2730,
    "vllm/v1/core/block_pool.py": 945,
    "vllm/v1/core/kv_cache_utils.py": 1263,
    "vllm/v1/sample/sampler.py": 501,
    "vllm/v1/spec_decode/ngram_proposer.py": 295,
    "vllm/v1/spec_decode/llm_base_proposer.py": 1862,
    "vllm/v1/sample/rejection_sampler.py": 1197,
    "vllm/v1/simple_kv_offload/manager.py": 1481,
    "vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py": 293,
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
_OFFLOAD = "vllm/v1/simple_kv_offload/manager.py"
_OURS_OFFLOAD = "kvcore.simple_kv_offload.manager:SimpleCPUOffloadScheduler."

FUNCTIONS: dict[str, CodeLink] = {
    c.name: c
    for c in (
        _link(
            "add_request",
            _SCHED,
            2931,
            2962,
            "Scheduler.add_request",
            "kvcore.core.sched.scheduler:Scheduler.add_request",
        ),
        _link(
            "schedule",
            _SCHED,
            699,
            1784,
            "Scheduler.schedule",
            "kvcore.core.sched.scheduler:Scheduler.schedule",
        ),
        _link(
            "_preempt_request",
            _SCHED,
            1799,
            1843,
            "Scheduler._preempt_request",
            "kvcore.core.sched.scheduler:Scheduler._preempt_request",
        ),
        _link(
            "update_from_output",
            _SCHED,
            2259,
            2676,
            "Scheduler.update_from_output",
            "kvcore.core.sched.scheduler:Scheduler.update_from_output",
        ),
        _link(
            "finish_requests",
            _SCHED,
            2964,
            3029,
            "Scheduler.finish_requests",
            "kvcore.core.sched.scheduler:Scheduler.finish_requests",
        ),
        _link(
            "_free_request",
            _SCHED,
            3031,
            3062,
            "Scheduler._free_request",
            "kvcore.core.sched.scheduler:Scheduler._free_request",
        ),
        _link(
            "get_computed_blocks",
            _KVM,
            266,
            328,
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
            380,
            627,
            "KVCacheManager.allocate_slots",
            "kvcore.core.kv_cache_manager:KVCacheManager.allocate_slots",
        ),
        _link(
            "find_longest_cache_hit",
            _SINGLE,
            742,
            838,
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
            968,
            1064,
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
            370,
            410,
            "SingleTypeKVCacheManager.allocate_new_blocks",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.allocate_new_blocks",
        ),
        _link(
            "remove_skipped_blocks",
            _SINGLE,
            682,
            720,
            "SingleTypeKVCacheManager.remove_skipped_blocks",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.remove_skipped_blocks",
        ),
        _link(
            "cache_blocks",
            _SINGLE,
            477,
            542,
            "SingleTypeKVCacheManager.cache_blocks",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.cache_blocks",
        ),
        _link(
            "free",
            _SINGLE,
            591,
            599,
            "SingleTypeKVCacheManager.free",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager.free",
        ),
        _link(
            "touch", _POOL, 792, 810, "BlockPool.touch", "kvcore.core.block_pool:BlockPool.touch"
        ),
        _link(
            "get_new_blocks",
            _POOL,
            706,
            740,
            "BlockPool.get_new_blocks",
            "kvcore.core.block_pool:BlockPool.get_new_blocks",
        ),
        _link(
            "_maybe_evict_cached_block",
            _POOL,
            769,
            790,
            "BlockPool._maybe_evict_cached_block",
            "kvcore.core.block_pool:BlockPool._maybe_evict_cached_block",
        ),
        _link(
            "evict_blocks",
            _POOL,
            851,
            869,
            "BlockPool.evict_blocks",
            "kvcore.core.block_pool:BlockPool.evict_blocks",
        ),
        _link(
            "cache_full_blocks",
            _POOL,
            230,
            356,
            "BlockPool.cache_full_blocks",
            "kvcore.core.block_pool:BlockPool.cache_full_blocks",
        ),
        _link(
            "free_blocks",
            _POOL,
            816,
            849,
            "BlockPool.free_blocks",
            "kvcore.core.block_pool:BlockPool.free_blocks",
        ),
        _link(
            "reset_prefix_cache",
            _POOL,
            871,
            910,
            "BlockPool.reset_prefix_cache",
            "kvcore.core.block_pool:BlockPool.reset_prefix_cache",
        ),
        _link(
            "cache_partial_block",
            _POOL,
            486,
            603,
            "BlockPool.cache_partial_block",
            "kvcore.core.block_pool:BlockPool.cache_partial_block",
        ),
        _link(
            "_cache_partial_tail_block",
            _SINGLE,
            859,
            897,
            "FullAttentionManager._cache_partial_tail_block",
            "kvcore.core.single_type_kv_cache_manager:FullAttentionManager._cache_partial_tail_block",
        ),
        _link(
            "_apply_cow",
            _SINGLE,
            455,
            475,
            "SingleTypeKVCacheManager._apply_cow",
            "kvcore.core.single_type_kv_cache_manager:SingleTypeKVCacheManager._apply_cow",
        ),
        _link(
            "mamba_allocate_new_blocks",
            _SINGLE,
            1797,
            1923,
            "MambaManager.allocate_new_blocks",
            "kvcore.core.single_type_kv_cache_manager:MambaManager.allocate_new_blocks",
        ),
        _link(
            "take_kv_cache_block_copies",
            _KVM,
            863,
            878,
            "KVCacheManager.take_kv_cache_block_copies",
            "kvcore.core.kv_cache_manager:KVCacheManager.take_kv_cache_block_copies",
        ),
        _link(
            "hash_block_tokens",
            _UTILS,
            707,
            737,
            "hash_block_tokens",
            "kvcore.core.kv_cache_utils:hash_block_tokens",
        ),
        _link(
            "sample",
            "vllm/v1/sample/sampler.py",
            129,
            211,
            "Sampler.forward",
            "paged_kv_lab.run.engine:Engine.step",
        ),
        _link(
            "propose",
            "vllm/v1/spec_decode/ngram_proposer.py",
            138,
            173,
            "NgramProposer.propose",
            "kvcore.spec_decode.ngram_proposer:NgramProposer.propose",
        ),
        _link(
            "propose_draft_model",
            "vllm/v1/spec_decode/llm_base_proposer.py",
            511,
            773,
            "SpecDecodeBaseProposer.propose",
            "kvcore.spec_decode.draft_model:DraftModelProposer.propose",
        ),
        _link(  # vLLM's EagleProposer drafts through its base class's propose
            "propose_eagle",
            "vllm/v1/spec_decode/llm_base_proposer.py",
            511,
            773,
            "SpecDecodeBaseProposer.propose",
            "kvcore.spec_decode.eagle:EagleProposer.propose",
        ),
        _link(
            "update_draft_token_ids",
            _SCHED,
            2862,
            2881,
            "Scheduler.update_draft_token_ids",
            "kvcore.core.sched.scheduler:Scheduler.update_draft_token_ids",
        ),
        _link(
            "rejection_sample",
            "vllm/v1/sample/rejection_sampler.py",
            432,
            586,
            "rejection_sample",
            "kvcore.sample.rejection_sampler:rejection_sample",
        ),
        # -- the CPU tier (SimpleCPUOffloadConnector) --
        _link(
            "_update_waiting_for_remote_kv",
            _SCHED,
            3467,
            3517,
            "Scheduler._update_waiting_for_remote_kv",
            "kvcore.core.sched.scheduler:Scheduler._update_waiting_for_remote_kv",
        ),
        _link(
            "_handle_invalid_blocks",
            _SCHED,
            3703,
            3783,
            "Scheduler._handle_invalid_blocks",
            "kvcore.core.sched.scheduler:Scheduler._handle_invalid_blocks",
        ),
        _link(
            "_update_requests_with_invalid_blocks",
            _SCHED,
            3584,
            3686,
            "Scheduler._update_requests_with_invalid_blocks",
            "kvcore.core.sched.scheduler:Scheduler._update_requests_with_invalid_blocks",
        ),
        _link(
            "_update_from_kv_xfer_finished",
            _SCHED,
            3556,
            3582,
            "Scheduler._update_from_kv_xfer_finished",
            "kvcore.core.sched.scheduler:Scheduler._update_from_kv_xfer_finished",
        ),
        # -- a P/D pair's prefill side (NIXL pull mode) --
        _link(
            "request_finished",
            "vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py",
            191,
            293,
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
                ("get_num_new_matched_tokens", 361, 423),
                ("update_state_after_alloc", 427, 538),
                ("build_connector_meta", 540, 602),
                ("update_connector_output", 1040, 1064),
                ("_process_store_completion", 1100, 1197),
            )
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
