"""Scheduler: decides each step's batch under a token budget (vLLM: v1/core/sched/scheduler.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Optional, Union

from kvcore.config.lora import LoRAConfig
from kvcore.config.scheduler import ADMISSIONS, ADMIT_FULL_SEQUENCE, SchedulerConfig
from kvcore.config.speculative import SpeculativeConfig
from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.kv_cache_observer import FREE_COPIED, KVCacheObserver, call_for_request
from kvcore.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from kvcore.core.sched.request_queue import FCFS, PRIORITY, create_request_queue
from kvcore.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
from kvcore.kv_cache_interface import MambaSpec
from kvcore.metrics.stats import (
    KV_FETCH_COMPLETED_WAITING,
    KV_FETCH_IN_PROGRESS,
    KV_FETCH_STAGES,
    KV_FETCH_WAITING_TO_START,
    PrefixCacheStats,
)
from kvcore.outputs import ModelRunnerOutput
from kvcore.request import Request, RequestStatus
from kvcore.structured_output.utils import PADDING_SPEC_TOKEN_ID, strip_speculative_padding
from kvcore.utils.math_utils import cdiv

KV_LOAD_RECOMPUTE, KV_LOAD_FAIL = "recompute", "fail"
KV_LOAD_FAILURE_POLICIES = (KV_LOAD_RECOMPUTE, KV_LOAD_FAIL)


def use_eagle_block_drop(
    speculative_config: Optional[SpeculativeConfig], num_hash_lookahead_tokens: int
) -> bool:
    """What vLLM's Scheduler passes as ``KVCacheManager(use_eagle=...)``: the drop, unless
    lookahead hashes already prove the token after each block (vLLM 0.34.0's
    ``Scheduler.__init__`` sets ``self.use_eagle_block_drop`` so; kvcore's engine decides it
    before building the scheduler, from the same two settings)."""
    if speculative_config is None or num_hash_lookahead_tokens:
        return False
    return speculative_config.use_eagle_block_drop()


def mamba_block_aligned_split(
    request: Request,
    num_new_tokens: int,
    num_new_local_computed_tokens: int = 0,
    num_external_computed_tokens: int = 0,
    *,
    block_size: int,
    max_prefill_tokens: int,
    hash_block_size: Optional[int] = None,
    partial_cache_hit: bool = False,
) -> int:
    """A prefill chunk cut so it ends where a Mamba state is kept (align mode; vLLM 0.34's
    ``Scheduler._mamba_block_aligned_split`` without partial hash hits, prefill-checkpoint
    blocks or EAGLE). The state is written where a chunk ends, so a chunk that does not finish
    the prefill ends on a block boundary; it also stops at the last boundary a later request
    can hit (``num_tokens - 1`` rounded down) and at a shared-prefix junction (floored to a
    boundary). A block wider than ``max_prefill_tokens`` is crossed in sub-block chunks. With
    hits inside a block (``partial_cache_hit``) it also stops at the prompt's last
    ``hash_block_size`` boundary, whose state the manager keys there."""
    start = request.num_computed_tokens + num_new_local_computed_tokens
    start += num_external_computed_tokens
    prefill_end = max(request.num_prompt_tokens, request.num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    last_cache_position = max((request.num_tokens - 1) // block_size * block_size, 0)
    end = start + num_new_tokens
    if end < prefill_end:
        aligned_end = end // block_size * block_size
        if aligned_end > start or block_size <= max_prefill_tokens:
            end = aligned_end
    tail_boundary = 0
    if partial_cache_hit:
        hbs = hash_block_size or block_size
        tail_boundary = max((request.num_prompt_tokens - 1) // hbs * hbs, 0)
    junction = request.shared_prefix_boundary
    stops = (
        (start // block_size + 1) * block_size if start % block_size else 0,
        last_cache_position,
        tail_boundary if last_cache_position < tail_boundary < request.num_prompt_tokens else 0,
        start + (junction - start) // block_size * block_size if start < junction < end else 0,
    )
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


class Scheduler:
    """Waiting and running queues over one KVCacheManager.

    Invariants: a request is in exactly one of the waiting queues (``kv_holding_waiting``,
    ``waiting``, ``async_kv_waiting``) / running / finished; every
    running request holds blocks for all its computed tokens; at most
    ``max_num_seqs`` run and at most ``max_num_batched_tokens`` are computed per step;
    ``finished_req_ids`` holds only the requests finished since the last ``schedule``.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        connector: Optional[KVConnectorBase_V1] = None,
        kv_load_failure_policy: str = "fail",
        lora_config: Optional[LoRAConfig] = None,
    ) -> None:
        if config.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if config.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if kv_load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(
                f"kv_load_failure_policy must be one of {KV_LOAD_FAILURE_POLICIES}; "
                f"got {kv_load_failure_policy!r}"
            )
        if config.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}; got {config.admission!r}")
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        # LoRA served (vLLM's lora_config): at most max_loras adapters among the running requests
        self.lora_config = lora_config
        self.policy = config.policy
        self.waiting = create_request_queue(config.policy)
        # vLLM 0.34: waiting requests that hold KV blocks (an asynchronous load in flight or
        # landed) wait here and are drained before ``waiting``, so a request whose allocation
        # fails (which ends the scan) never stands in front of one that would give blocks back.
        self.kv_holding_waiting = create_request_queue(config.policy)
        self.running: list[Request] = []
        # The unfinished requests, by id: as in vLLM a request leaves when it finishes (its id
        # can then be used again); whoever needs finished ones' outputs keeps them itself.
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        # The KV connector's scheduler half, if any: any object with vLLM's KVConnectorBase_V1
        # scheduler-side methods (the CPU tier: SimpleCPUOffloadConnector).
        self.connector = connector
        self.connector_prefix_cache_stats: Optional[PrefixCacheStats] = None
        self.finished_recving_kv_req_ids: set[str] = set()
        # Requests whose asynchronous load reported invalid blocks: rolled back, they resume
        # from their valid prefix once the load is reported finished.
        self.failed_recving_kv_req_ids: set[str] = set()
        # vLLM's KVTransferConfig.kv_load_failure_policy (default "fail"): on a failed load,
        # recompute the lost tokens, or end the request with an error.
        self.recompute_kv_load_failures = (
            connector is None or kv_load_failure_policy == KV_LOAD_RECOMPUTE
        )
        if connector is not None:
            connector.bind_kv_cache_manager(kv_cache_manager)
            self.connector_prefix_cache_stats = PrefixCacheStats()
        # vLLM's in-flight prefills: requests admitted that have not yet computed their whole
        # prompt (a chunked prefill, an asynchronous load in progress). The blocks they still
        # need are kept free from the next asynchronous load, which holds its blocks without
        # running and cannot be preempted: two loads each holding part of what the other
        # needs would wait on each other for ever.
        self._inflight_prefills: set[Request] = set()
        # vLLM 0.34: a parked asynchronous load's reservation is computed when it parks and
        # when it is promoted (the only times its blocks change), and kept until it is scheduled.
        self._parked_reservations: dict[Request, int] = {}
        self._parked_reserved_blocks = 0
        # vLLM 0.34's --max-num-inflight-kv-loads: with it set, requests the connector may load
        # asynchronously wait in a queue of their own, so that their loads can start while the
        # running batch is full; empty otherwise.
        self.async_kv_waiting = create_request_queue(config.policy)
        # Requests with an asynchronous load, by stage (KV_FETCH_STAGES), and the counts; only
        # kept with a connector and a cap (vLLM also keeps them for its stats logging).
        self._kv_fetch_stages: Optional[dict[Request, str]] = (
            {} if connector is not None and config.max_num_inflight_kv_loads else None
        )
        self._kv_fetch_counts: dict[str, int] = dict.fromkeys(KV_FETCH_STAGES, 0)
        # aborted while loading: their blocks stay taken until the load reports them
        self._aborted_kv_loads: set[str] = set()
        num_spec_decode_tokens = (
            1 + config.num_spec_tokens + config.num_lookahead_tokens
            if config.num_spec_tokens
            else 0
        )
        # Mamba groups count their speculative state blocks themselves.
        self._spec_decode_step_blocks = sum(
            cdiv(num_spec_decode_tokens, m.block_size)
            for m in kv_cache_manager.coordinator.single_type_managers
            if not isinstance(m.kv_cache_spec, MambaSpec)
        )
        self.need_mamba_block_aligned_split = any(
            getattr(g.kv_cache_spec, "mamba_cache_mode", None) == "align"
            for g in kv_cache_manager.kv_cache_config.kv_cache_groups
        )
        # vLLM's num_sampled_tokens_per_step: the tokens a step appends after its last scheduled
        # one (0 only for pooling and diffusion models, which kvcore does not run). A request
        # keeps that many positions free below max_model_len, and a one-token admission is
        # padded to 1 + num_spec_tokens rows only while it is not 0.
        self.num_sampled_tokens_per_step = 1
        # vLLM's use_eagle: the drafter reads the target's hidden states (an EAGLE or MTP head;
        # set by EngineCore from its drafter). Only the draft_proposed decision reports it.
        self.use_eagle = False
        # vLLM 0.34's cache-aware admission: it needs a prefix cache to consult, and it reorders
        # by position, which only the FCFS queue has; otherwise the window is 0 (off).
        self.cache_aware_window = (
            config.cache_aware_admission_window
            if self.policy == FCFS and kv_cache_manager.enable_caching
            else 0
        )
        self.cache_aware_threshold = config.cache_aware_admission_threshold

    def _mamba_block_aligned_split(
        self, request: Request, num_new_tokens: int, num_new_local_computed_tokens: int = 0
    ) -> int:
        cfg = self.config
        max_prefill = cfg.max_num_batched_tokens
        if cfg.long_prefill_token_threshold > 0:
            max_prefill = min(max_prefill, cfg.long_prefill_token_threshold)
        return mamba_block_aligned_split(
            request,
            num_new_tokens,
            num_new_local_computed_tokens,
            block_size=self.kv_cache_manager.block_size,
            max_prefill_tokens=max_prefill,
            hash_block_size=self.kv_cache_manager.hash_block_size,
            partial_cache_hit=getattr(
                self.kv_cache_manager.coordinator, "enable_partial_hash_hits", False
            ),
        )

    @property
    def observer(self) -> Optional[KVCacheObserver]:
        """Who is told each decision (the pool's observer; None: nobody records)."""
        return self.kv_cache_manager.block_pool.observer

    def _emit(self, kind: str, request: Request, **fields) -> None:
        """Tell the observer, if any, a decision about ``request``: ``kind`` names it."""
        observer = self.kv_cache_manager.block_pool.observer
        if observer is not None:
            observer.on_decision(kind, request.request_id, **fields)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        if self.connector is not None:
            # vLLM 0.34: before it is queued, as may_load_async may read what this records
            self.connector.on_new_request(request)
        self._enqueue_waiting_request(request)
        if self.connector is not None:
            params = request.kv_transfer_params
            if params and params.get("do_remote_prefill"):
                self._set_kv_fetch_stage(request, KV_FETCH_WAITING_TO_START)
        self._emit(
            "arrived",
            request,
            num_prompt_tokens=request.num_prompt_tokens,
            priority=request.priority,
        )

    def _enqueue_waiting_request(self, request: Request) -> None:
        """Into ``kv_holding_waiting`` if it holds blocks; else, with
        ``max_num_inflight_kv_loads`` set and a request the connector may load asynchronously,
        into ``async_kv_waiting``; else into ``waiting`` (vLLM 0.34's three queues)."""
        if self._holds_kv_blocks(request):
            self.kv_holding_waiting.add_request(request)
        elif (
            self.connector is not None
            and self.config.max_num_inflight_kv_loads
            and self.connector.may_load_async(request)
        ):
            self.async_kv_waiting.add_request(request)
        else:
            self.waiting.add_request(request)

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), (
            len(self.waiting) + len(self.kv_holding_waiting) + len(self.async_kv_waiting)
        )

    def has_unfinished_requests(self) -> bool:
        return any(self.get_request_counts())

    def has_finished_requests(self) -> bool:
        """Finished requests not yet reported to the worker, or whose blocks the connector
        still holds (they stay in ``requests`` until it reports them done)."""
        if self.finished_req_ids:
            return True
        if self.connector is None:
            return False
        num_running, num_waiting = self.get_request_counts()
        return len(self.requests) > num_running + num_waiting

    def has_requests(self) -> bool:
        """Work left: unfinished requests, finished ones whose blocks the connector still holds,
        or copies the connector still has to make (a finished request's last blocks are stored
        in the step after it finished). Unlike vLLM, finished ids not yet reported to the worker
        are no work: vLLM's step that only reports them runs no request, and the lab's runs
        end with their last request."""
        num_running, num_waiting = self.get_request_counts()
        return (
            self.has_unfinished_requests()
            or (self.connector is not None and len(self.requests) > num_running + num_waiting)
            or (self.connector is not None and self.connector.has_pending_push_work())
        )

    # -- scheduling ---------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        token_budget = cfg.max_num_batched_tokens
        num_scheduled_tokens: dict[str, int] = {}
        num_computed_before: dict[str, int] = {}
        req_to_new_blocks: dict[str, tuple[list[int], ...]] = {}
        scheduled_running: list[Request] = []
        # every admission in order, new and resumed alike (vLLM 0.34: scheduled_new_reqs)
        scheduled_new: list[Request] = []
        scheduled_resumed: list[Request] = []  # those of them resumed after preemption
        preempted: list[Request] = []
        scheduled_spec_decode_tokens: dict[str, list[int]] = {}
        # The threshold keeps one long prefill from starving the others; a lone
        # request starves nobody, so it gets the whole budget.
        num_running, num_waiting = self.get_request_counts()
        # vLLM 0.34: and only with chunked prefill (without it a prompt is never cut)
        long_prefill_token_threshold = (
            cfg.long_prefill_token_threshold
            if cfg.enable_chunked_prefill and num_running + num_waiting > 1
            else 0
        )

        self.kv_cache_manager.new_step_starts()

        # 1) Running requests first, in running order.
        # vLLM's prefill_scheduled: a running request scheduled this step was still in its
        # prompt (a batch with a prefill chunk is mixed anyway: no padding for uniform shapes)
        prefill_scheduled = False
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new = request.num_tokens_with_spec - request.num_computed_tokens
            if 0 < long_prefill_token_threshold < num_new:
                num_new = long_prefill_token_threshold
            num_new = min(
                num_new,
                token_budget,
                cfg.max_model_len - request.num_computed_tokens - self.num_sampled_tokens_per_step,
            )
            if self.need_mamba_block_aligned_split:
                num_new = self._mamba_block_aligned_split(request, num_new)
            if num_new <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(
                    request, num_new, num_lookahead_tokens=cfg.num_lookahead_tokens
                )
                if new_blocks is not None:
                    break
                if self.policy == PRIORITY:
                    victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
                    victim_index = self.running.index(victim)
                    del self.running[victim_index]
                    if victim_index < req_index:
                        req_index -= 1
                    if victim in scheduled_running:
                        # Its tokens were already in this batch: take them back out.
                        scheduled_running.remove(victim)
                        token_budget += num_scheduled_tokens.pop(victim.request_id)
                        num_computed_before.pop(victim.request_id, None)
                        req_to_new_blocks.pop(victim.request_id, None)
                        scheduled_spec_decode_tokens.pop(victim.request_id, None)
                else:
                    victim = self.running.pop()
                self._preempt_request(victim, needed_by=request.request_id)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                if self.policy == PRIORITY and request.status == RequestStatus.PREEMPTED:
                    # It was the lowest priority and preempted itself; the requests after
                    # it rank higher and may still fit in the blocks it just freed.
                    # req_index already points at the next one.
                    continue
                break
            scheduled_running.append(request)
            prefill_scheduled |= request.is_prefill_chunk
            req_to_new_blocks[request.request_id] = new_blocks.get_block_ids()
            num_scheduled_tokens[request.request_id] = num_new
            num_computed_before[request.request_id] = request.num_computed_tokens
            token_budget -= num_new
            req_index += 1
            if request.spec_token_ids:
                # The budget or max_model_len may have cut the drafts short.
                num_spec = num_new + request.num_computed_tokens - request.num_tokens
                if num_spec > 0:
                    scheduled_spec_decode_tokens[request.request_id] = request.spec_token_ids[
                        :num_spec
                    ]
                request.spec_token_ids = []  # the next ones come from update_draft_token_ids

        # 2) Waiting requests, unless someone was preempted in this step.
        if preempted:
            if self.waiting and self.observer is not None:
                self._emit("blocked", self.waiting.peek_request(), reason="preempted_this_step")
        else:
            # the adapters of every running request (scheduled this step or not): a waiting
            # request with another adapter is skipped once max_loras of them are running
            scheduled_loras = {
                r.lora_request.lora_int_id
                for r in self.running
                if self.lora_config is not None and r.lora_request is not None
            }
            # A request whose asynchronous load failed with no valid block gave its blocks back
            # (_update_waiting_for_remote_kv) and stays where it is, in kv_holding_waiting, as in
            # vLLM 0.34.0: refused there, it ends the scan before the holders behind it
            # (docs/fidelity.md, bench/offload_vs_vllm.py --scheduler: trace 19 stalls on both).
            # vLLM 0.34 reorders ``waiting`` (never ``kv_holding_waiting``) before admitting.
            if self.cache_aware_window:
                self._reorder_waiting_by_cached_prefix()
            # Skipped requests go back to the front of their queues, in the order they were
            # skipped (vLLM's step_skipped_kv_holding / _waiting / _async_kv); a request that
            # began holding blocks this step (a load started) joins kv_holding_waiting's back,
            # as it is newer than every holder there (vLLM's step_started_kv_loads).
            skipped_kv_holding: list[Request] = []
            skipped_waiting: list[Request] = []
            skipped_async: list[Request] = []
            started_loads: list[Request] = []

            def skip(queue) -> None:
                request = queue.pop_request()
                holds_blocks = self._holds_kv_blocks(request)
                if holds_blocks and queue is not self.kv_holding_waiting:
                    started_loads.append(request)
                elif holds_blocks:
                    skipped_kv_holding.append(request)
                elif queue is self.async_kv_waiting:
                    skipped_async.append(request)
                else:
                    skipped_waiting.append(request)

            # cleared once async_kv_waiting's head cannot start a load (vLLM 0.34)
            take_async_kv = True
            while True:
                # No running slot or token left: only asynchronous loads may start (they take
                # neither until their K/V has arrived); without a cap that queue is empty.
                loads_only = len(self.running) >= cfg.max_num_seqs or token_budget <= 0
                if not loads_only:
                    # block-holders are always drained first
                    queue = self.kv_holding_waiting or self._next_waiting_queue(take_async_kv)
                elif take_async_kv:
                    queue = self.async_kv_waiting
                else:
                    queue = None
                if not queue:
                    if token_budget > 0 and len(self.running) >= cfg.max_num_seqs:
                        head = self.kv_holding_waiting or self.waiting or self.async_kv_waiting
                        if head:
                            self._emit(
                                "blocked",
                                head.peek_request(),
                                reason="max_num_seqs",
                                max_num_seqs=cfg.max_num_seqs,
                            )
                    break
                request = queue.peek_request()
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    if request.request_id not in self.finished_recving_kv_req_ids:
                        skip(queue)
                        continue
                    self._update_waiting_for_remote_kv(request)
                    self._reserve_parked(request)
                    resumed = request.num_preemptions > 0
                    request.status = RequestStatus.PREEMPTED if resumed else RequestStatus.WAITING
                if (
                    self.lora_config is not None
                    and request.lora_request is not None
                    and len(scheduled_loras) == self.lora_config.max_loras
                    and request.lora_request.lora_int_id not in scheduled_loras
                ):
                    self._emit("blocked", request, reason="max_loras")
                    skip(queue)
                    continue
                num_external, load_kv_async = 0, False
                if request.num_computed_tokens == 0:
                    max_hit = request.num_tokens - 1
                    if cfg.max_cache_hit_length is not None:
                        max_hit = min(max_hit, cfg.max_cache_hit_length)
                    hits, num_hit, request.shared_prefix_boundary = (
                        self.kv_cache_manager.get_computed_blocks(request, max_hit)
                    )
                    if self.connector is not None:
                        # The GPU hit is whole blocks, so the connector's hit continues it.
                        num_external, load_kv_async = self.connector.get_num_new_matched_tokens(
                            request, num_hit
                        )
                        if request.skip_reading_prefix_cache:  # nor a connector's hit
                            num_external, load_kv_async = 0, False
                        if num_external is None:
                            skip(queue)
                            continue
                    num_computed = num_hit + num_external
                else:
                    # Back from an asynchronous load: its tokens are computed already.
                    hits, num_hit, num_computed = None, 0, request.num_computed_tokens
                if (load_kv_async and not self._admits_inflight_kv_load()) or (
                    loads_only and not load_kv_async
                ):
                    # vLLM 0.34: past max_num_inflight_kv_loads, or it needs a running slot
                    # while none is free. It waits at the head of its queue; another queue may
                    # still admit.
                    if queue is not self.async_kv_waiting:
                        break
                    take_async_kv = False
                    continue
                pad_spec_decode = False
                if load_kv_async:
                    num_new = 0  # this step only loads
                else:
                    num_new = request.num_tokens - num_computed
                    if (
                        cfg.num_spec_tokens > 0
                        and self.num_sampled_tokens_per_step > 0
                        and num_new == 1
                        and not prefill_scheduled
                        and (scheduled_running or num_computed > 0)
                    ):
                        # vLLM pads a one-token admission to the 1 + num_spec_tokens rows of a
                        # speculative decode (uniform batches for its CUDA graphs), with
                        # placeholder drafts that are all rejected after the step.
                        num_padded = 1 + cfg.num_spec_tokens
                        if (
                            num_computed + num_padded + self.num_sampled_tokens_per_step
                            <= cfg.max_model_len
                        ):
                            if num_padded > token_budget:
                                # vLLM rather schedules it next step than unpadded now
                                self._emit(
                                    "blocked",
                                    request,
                                    reason="spec_decode_padding",
                                    token_budget=token_budget,
                                )
                                break
                            num_new = num_padded
                            pad_spec_decode = True
                    if 0 < long_prefill_token_threshold < num_new:
                        num_new = long_prefill_token_threshold
                    if not cfg.enable_chunked_prefill and num_new > token_budget:
                        self._emit(
                            "blocked", request, reason="token_budget", token_budget=token_budget
                        )
                        break
                    num_new = min(num_new, token_budget)
                    if self.need_mamba_block_aligned_split:
                        num_new = self._mamba_block_aligned_split(request, num_new, num_hit)
                        if num_new == 0:
                            break
                        if pad_spec_decode and num_new != 1 + cfg.num_spec_tokens:
                            # A split that clips the padded rows drops the padding: a padded
                            # request has all 1 + num_spec_tokens rows or none.
                            num_new, pad_spec_decode = 1, False
                # vLLM: an asynchronous load is admitted only if the in-flight prefills' blocks
                # (and its own next step's draft blocks) stay free after it.
                reserved_blocks = (
                    self._inflight_prefill_reserved_blocks() + self._spec_decode_step_blocks
                    if load_kv_async
                    else 0
                )
                new_blocks = self.kv_cache_manager.allocate_slots(
                    request,
                    num_new,
                    num_hit,
                    hits,
                    # vLLM's effective_lookahead_tokens: no forward runs for an asynchronous
                    # load, so its lookahead slots come when it is scheduled to run.
                    num_lookahead_tokens=0 if load_kv_async else cfg.num_lookahead_tokens,
                    num_external_computed_tokens=num_external,
                    delay_cache_blocks=load_kv_async,
                    full_sequence_must_fit=cfg.admission == ADMIT_FULL_SEQUENCE,
                    reserved_blocks=reserved_blocks,
                    has_scheduled_reqs=bool(self.running),
                )
                if new_blocks is None:
                    self._emit(
                        "blocked",
                        request,
                        reason="reserved_blocks" if reserved_blocks else "no_free_blocks",
                        num_free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
                        num_tokens=request.num_tokens,
                        num_reserved_blocks=reserved_blocks or None,
                    )
                    break
                if self.connector is not None:
                    self.connector.update_state_after_alloc(
                        request, self.kv_cache_manager.get_blocks(request.request_id), num_external
                    )
                    if hits is not None:  # vLLM's connector PrefixCacheStats
                        self.connector_prefix_cache_stats.record(
                            request.num_tokens - num_hit, num_external, request.num_preemptions > 0
                        )
                if hits is not None:
                    self.kv_cache_manager.record_prefix_cache_stats(request, num_hit)
                if load_kv_async:
                    # Blocks are allocated; the KV arrives during this step and the request
                    # runs from the end of the hit in a later one.
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    request.num_computed_tokens = num_computed
                    self._reserve_parked(request)
                    self._set_kv_fetch_stage(request, KV_FETCH_IN_PROGRESS)
                    skip(queue)
                    continue
                queue.pop_request()
                self.running.append(request)
                if self.lora_config is not None and request.lora_request is not None:
                    scheduled_loras.add(request.lora_request.lora_int_id)
                req_to_new_blocks[request.request_id] = self.kv_cache_manager.get_block_ids(
                    request.request_id
                )
                resumed = request.status == RequestStatus.PREEMPTED
                scheduled_new.append(request)
                if resumed:
                    scheduled_resumed.append(request)
                num_scheduled_tokens[request.request_id] = num_new
                num_computed_before[request.request_id] = num_computed
                token_budget -= num_new
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed
                request.num_cached_tokens = num_computed
                if pad_spec_decode:
                    scheduled_spec_decode_tokens[request.request_id] = [
                        PADDING_SPEC_TOKEN_ID
                    ] * cfg.num_spec_tokens
                self._set_kv_fetch_stage(request, None)
                # still prefilling after this chunk; a promoted load stays tracked until the
                # end of the step drops it
                if (
                    num_computed + num_new < request.num_tokens
                    or request in self._parked_reservations
                ):
                    self._inflight_prefills.add(request)
                self._unreserve_parked(request)
                self._emit(
                    "resumed" if resumed else "admitted",
                    request,
                    num_cached_tokens=num_computed,
                    num_preemptions=request.num_preemptions,
                )
            if self.waiting and token_budget <= 0 and self.observer is not None:
                self._emit(
                    "blocked", self.waiting.peek_request(), reason="token_budget", token_budget=0
                )
            for request in reversed(skipped_kv_holding):
                self.kv_holding_waiting.prepend_request(request)
            for request in started_loads:
                self.kv_holding_waiting.add_request(request)
            for request in reversed(skipped_waiting):
                self.waiting.prepend_request(request)
            for request in reversed(skipped_async):
                self.async_kv_waiting.prepend_request(request)

        if self.observer is not None:  # the phases only serve the record: nothing to do else
            running_ids = {r.request_id for r in scheduled_running}
            resumed_ids = {r.request_id for r in scheduled_resumed}
            for rid, n in num_scheduled_tokens.items():
                req = self.requests[rid]
                before = num_computed_before[rid]
                if rid in resumed_ids:
                    kind = "recompute"
                elif before >= req.num_prompt_tokens:
                    kind = "decode"
                elif before + n < req.num_tokens or rid in running_ids:
                    kind = "chunk"
                else:
                    kind = "prefill"
                drafts = scheduled_spec_decode_tokens.get(rid, [])
                self._emit(
                    "scheduled",
                    req,
                    num_tokens=n,
                    phase=kind,
                    start=before,
                    num_placeholder_tokens=len(drafts) - len(strip_speculative_padding(drafts)),
                )
        out = self._make_output(
            num_scheduled_tokens,
            num_computed_before,
            req_to_new_blocks,
            scheduled_new,
            scheduled_running,
            preempted,
            scheduled_spec_decode_tokens,
        )
        copies, retained = self.kv_cache_manager.take_kv_cache_block_copies()
        if copies:
            # Synchronous steps: the copies run with this step, so their blocks go back now.
            pool = self.kv_cache_manager.block_pool
            call_for_request(pool.observer, None, None, FREE_COPIED, pool.free_blocks, retained)
            out = replace(out, kv_cache_block_copies=copies)
        if self.connector is not None:
            # Before num_computed_tokens advances: the connector stores only blocks whose
            # tokens were computed in earlier steps.
            out = replace(out, kv_connector_metadata=self.connector.build_connector_meta(out))
        # vLLM advances num_computed_tokens when it schedules, before the model runs.
        for rid, n in num_scheduled_tokens.items():
            req = self.requests[rid]
            req.num_computed_tokens += n
            # vLLM's flag: a step that ends inside the known tokens samples nothing, so drafts
            # proposed for it are dropped (update_draft_token_ids)
            req.is_prefill_chunk = req.num_computed_tokens < req.num_tokens
            if not req.is_prefill_chunk:
                self._inflight_prefills.discard(req)
        return out

    def _reorder_waiting_by_cached_prefix(self) -> None:
        """vLLM 0.34's cache-aware admission: among the first ``cache_aware_window`` waiting
        requests, those with the longest cached prefix move to the front, arrival order breaking
        ties, so a cold request does not evict the blocks a warm one is about to hit.

        Only the slots of requests that are plainly waiting (status WAITING, nothing computed)
        take part: a preempted or partially computed request keeps its exact slot, while the
        plainly waiting ones trade theirs, so one may go from behind it to before it (vLLM's
        docstring says nothing is moved past it; its code, like this one, permutes the slots
        around it). The queue beyond the window is untouched. Nothing happens below
        ``cache_aware_threshold`` usage (there is room for both prompts, so reordering would
        cost fairness and save no eviction), nor with fewer than two such requests. Each
        request in the window costs one ``KVCacheManager.get_num_cached_tokens`` probe, which
        takes no reference and records nothing.

        The observer, if any, is told ``"cache_aware_reorder"`` exactly when the order
        changes (never when every request keeps its place): the window's order before and
        after, which request moved ahead of which, each probed request's cached prefix, the
        window, the threshold and the usage that let it happen."""
        if len(self.waiting) < 2:
            return
        usage = self.kv_cache_manager.usage
        if usage < self.cache_aware_threshold:
            return
        head = self.waiting.ordered()[: self.cache_aware_window]
        slots = [
            i
            for i, request in enumerate(head)
            if request.status == RequestStatus.WAITING and not request.num_computed_tokens
        ]
        if len(slots) < 2:
            return
        probe = self.kv_cache_manager.get_num_cached_tokens
        cached = {i: probe(head[i]) for i in slots}
        order = sorted(slots, key=lambda i: (-cached[i], i))
        if order == slots:
            return
        reordered = list(head)
        for slot, source in zip(slots, order):
            reordered[slot] = head[source]
        self.waiting.remove_requests(head)
        for request in reversed(reordered):
            self.waiting.prepend_request(request)
        if self.observer is not None:
            self._tell_reorder(head, reordered, slots, cached, usage)

    def _tell_reorder(self, head, reordered, slots, cached, usage) -> None:
        """The observer's ``"cache_aware_reorder"``: built only for an observer (the decision is
        already made; this reads it). A plainly waiting request went ahead of every request of
        the window that stood before it and now stands after it, one that keeps its slot
        included; a request that keeps its slot goes ahead of no one."""
        new_place = {id(r): k for k, r in enumerate(reordered)}
        moved_ahead = {}
        for i in slots:
            me = new_place[id(head[i])]
            passed = tuple(r.request_id for r in head[:i] if new_place[id(r)] > me)
            if passed:
                moved_ahead[head[i].request_id] = passed
        self.observer.on_decision(
            "cache_aware_reorder",
            None,
            order_before=tuple(r.request_id for r in head),
            order_after=tuple(r.request_id for r in reordered),
            moved_ahead=moved_ahead,
            num_cached_tokens={head[i].request_id: cached[i] for i in slots},
            window=self.cache_aware_window,
            threshold=self.cache_aware_threshold,
            usage=usage,
        )

    def _make_output(
        self,
        num_scheduled_tokens,
        num_computed_before,
        req_to_new_blocks,
        scheduled_new,
        scheduled_running,
        preempted,
        scheduled_spec_decode_tokens=None,
    ) -> SchedulerOutput:
        """As vLLM 0.34: an admitted request, new or resumed after preemption, goes out in full
        (its whole table and every token to prefill); a running one with only the blocks added
        this step (None if none). ``new_token_ids`` stays empty: vLLM fills it only under
        pipeline parallelism. The prompt goes by reference, as in vLLM (a request never changes
        it): ``prefill_token_ids`` is the prompt list itself while the request has no output
        (vLLM's ``Request.prefill_token_ids``), else a copy of every token taken now (vLLM hands
        its live buffer; the copy holds what it held at this step)."""
        new_reqs = [
            NewRequestData(
                req_id=r.request_id,
                prompt_token_ids=r.prompt_token_ids,
                mm_features=list(r.mm_features),
                block_ids=req_to_new_blocks[r.request_id],
                num_computed_tokens=num_computed_before[r.request_id],
                prefill_token_ids=r.prompt_token_ids
                if len(r.prompt_token_ids) == len(r.all_token_ids)
                else list(r.all_token_ids),
            )
            for r in scheduled_new
        ]
        cached = CachedRequestData.make_empty()
        for r in scheduled_running:
            rid = r.request_id
            cached.req_ids.append(rid)
            block_ids = req_to_new_blocks[rid]
            cached.new_block_ids.append(block_ids if any(block_ids) else None)
            cached.num_computed_tokens.append(num_computed_before[rid])
            cached.num_output_tokens.append(r.num_output_tokens)
        finished, self.finished_req_ids = self.finished_req_ids, set()
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=dict(num_scheduled_tokens),
            total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
            finished_req_ids=finished,
            preempted_req_ids={r.request_id for r in preempted},
            scheduled_spec_decode_tokens=dict(scheduled_spec_decode_tokens or {}),
        )

    def _request_remaining_blocks(self, request: Request) -> int:
        """Blocks ``request`` still needs to hold its whole sequence (and, with drafts, one
        step's draft slots) beyond those it holds."""
        cfg = self.config
        full_num_tokens = min(request.num_tokens, cfg.max_model_len)
        num_tokens = full_num_tokens
        if cfg.num_spec_tokens:
            num_tokens += 1 + cfg.num_spec_tokens + cfg.num_lookahead_tokens
        kvm = self.kv_cache_manager
        return kvm.coordinator.get_num_blocks_to_allocate(
            request.request_id,
            num_tokens,
            kvm.empty_kv_cache_blocks.blocks,
            request.num_computed_tokens,
            apply_admission_cap=True,
            num_tokens_main_model=full_num_tokens,
        )

    def _inflight_prefill_reserved_blocks(self) -> int:
        """The blocks the in-flight prefills still need: what an asynchronous load must leave
        free (the parked loads' reservations, kept, and the prefill chunks', summed now)."""
        return self._parked_reserved_blocks + sum(
            self._request_remaining_blocks(r) for r in self._inflight_prefills
        )

    def _reserve_parked(self, request: Request) -> None:
        """Keep a parked asynchronous load's reservation (vLLM 0.34): set when it parks and
        refreshed when it is promoted, the only points where the blocks it holds change."""
        blocks = self._request_remaining_blocks(request)
        self._parked_reserved_blocks += blocks - self._parked_reservations.get(request, 0)
        self._parked_reservations[request] = blocks

    def _unreserve_parked(self, request: Request) -> None:
        self._parked_reserved_blocks -= self._parked_reservations.pop(request, 0)

    def _set_kv_fetch_stage(self, request: Request, stage: Optional[str]) -> None:
        """Move ``request`` to ``stage`` of its asynchronous load (None: it has none now)."""
        stages = self._kv_fetch_stages
        if stages is None:
            return
        previous = stages.pop(request, None)
        if previous is not None:
            self._kv_fetch_counts[previous] -= 1
        if stage is not None:
            stages[request] = stage
            self._kv_fetch_counts[stage] += 1

    def _next_waiting_queue(self, take_async_kv: bool):
        """``waiting`` or ``async_kv_waiting``, whichever head goes first (vLLM 0.34): by
        arrival under FCFS, by the queue's own order under the priority policy."""
        async_kv = self.async_kv_waiting
        if not take_async_kv or not async_kv:
            return self.waiting
        if not self.waiting:
            return async_kv
        async_head, head = async_kv.peek_request(), self.waiting.peek_request()
        if self.policy == PRIORITY:
            return async_kv if async_head < head else self.waiting
        return async_kv if async_head.arrival_time < head.arrival_time else self.waiting

    def _admits_inflight_kv_load(self) -> bool:
        """Whether one more asynchronous load stays within ``max_num_inflight_kv_loads``:
        loads in progress, loads landed and waiting for a slot, and aborted loads still
        writing their blocks all count."""
        limit = self.config.max_num_inflight_kv_loads
        return limit is None or (
            self._kv_fetch_counts[KV_FETCH_IN_PROGRESS]
            + self._kv_fetch_counts[KV_FETCH_COMPLETED_WAITING]
            + len(self._aborted_kv_loads)
            < limit
        )

    @staticmethod
    def _holds_kv_blocks(request: Request) -> bool:
        """A waiting request that holds blocks: its K/V is loading (or landed) from a
        connector, or it kept computed tokens (vLLM: ``Scheduler._holds_kv_blocks``)."""
        return (
            request.num_computed_tokens > 0
            or request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        )

    def _preempt_request(self, request: Request, needed_by: str) -> None:
        self._emit(
            "preempted",
            request,
            policy=self.policy,
            needed_by=needed_by,
            victim_priority=request.priority,
            num_computed_tokens=request.num_computed_tokens,
        )
        self.kv_cache_manager.free(request)
        self._inflight_prefills.discard(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.waiting.prepend_request(request)

    # -- after the model ran ------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[str]:
        """Append sampled tokens, stop finished requests and free their blocks; return their ids.

        A request still in the middle of its prompt (chunked prefill) gets no token.
        A request's last sampled token never gets a KV slot: it stops first.
        With drafts, ``generated`` is the accepted drafts plus one token; the rejected drafts
        are taken back from ``num_computed_tokens`` and tokens past a stop are dropped.
        Blocks the KV connector failed to load roll their requests back first; those requests'
        tokens of this step are dropped (``_handle_invalid_blocks``).
        """
        finished = []
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        kv_connector_output = model_runner_output.kv_connector_output
        failed_kv_load_req_ids: set[str] = set()
        if kv_connector_output is not None and kv_connector_output.failed_recving:
            failed_kv_load_req_ids |= self._handle_failed_recving(
                kv_connector_output.failed_recving
            )
        if kv_connector_output is not None and kv_connector_output.invalid_block_ids:
            failed_kv_load_req_ids |= self._handle_invalid_blocks(
                kv_connector_output.invalid_block_ids, scheduler_output.num_scheduled_tokens
            )
        for rid in scheduler_output.num_scheduled_tokens:
            if rid in failed_kv_load_req_ids:  # rolled back (or failing): its output is stale
                continue
            req = self.requests.get(rid)
            if req is None or req.is_finished():  # finished while the step ran
                continue
            index = model_runner_output.req_id_to_index.get(rid)
            generated = model_runner_output.sampled_token_ids[index] if index is not None else []
            if not generated:
                continue
            drafts = spec_tokens.get(rid)
            if drafts:
                self._settle_drafts(req, drafts, generated)
            status = None
            for num_new, token in enumerate(generated, 1):
                req.append_output_token_ids([token])
                # vLLM 0.34's check_stop: EOS, then stop tokens, then the length cap.
                if not req.ignore_eos and token in req.eos_token_ids:
                    status, reason = RequestStatus.FINISHED_STOPPED, "eos"
                elif token in req.stop_token_ids:
                    status, reason = RequestStatus.FINISHED_STOPPED, "stop"
                    req.stop_reason = token
                elif (
                    req.num_output_tokens >= req.max_tokens
                    or req.num_tokens >= self.config.max_model_len
                ):
                    status, reason = RequestStatus.FINISHED_LENGTH_CAPPED, "length"
                if status is not None:
                    req.num_computed_tokens -= len(generated) - num_new
                    break
            if self.config.num_spec_tokens > 0:
                # As vLLM: accepted drafts may have filled blocks; cache them up to the real
                # tokens now, before a stop below frees them.
                self.kv_cache_manager.cache_blocks(req, req.num_computed_tokens)
            if status is not None:
                self.running.remove(req)
                req.status = status
                self._emit("finished", req, reason=reason, num_output_tokens=req.num_output_tokens)
                self._free_request(req)
                finished.append(rid)
        if failed_kv_load_req_ids and not self.recompute_kv_load_failures:
            errored = self.finish_requests(
                sorted(failed_kv_load_req_ids), RequestStatus.FINISHED_ERROR
            )
            finished.extend(r.request_id for r in errored)
        if kv_connector_output is not None:
            self._update_from_kv_xfer_finished(kv_connector_output)
        return finished

    def _settle_drafts(self, req: Request, drafts: list[int], generated: list[int]) -> None:
        """Greedy verification kept ``len(generated) - 1`` drafts: record it and move
        ``num_computed_tokens`` back over the rest (their slots are simply written again later)."""
        num_accepted = len(generated) - 1
        num_rejected = len(drafts) - num_accepted
        if req.num_computed_tokens > 0:
            req.num_computed_tokens -= num_rejected
        if num_accepted:
            self._emit(
                "draft_accepted",
                req,
                accepted_token_ids=tuple(generated[:-1]),
                num_draft_tokens=len(drafts),
                next_token_id=generated[-1],
            )
        if num_rejected:
            first = req.num_computed_tokens
            self._emit(
                "draft_rejected",
                req,
                rejected_token_ids=tuple(drafts[num_accepted:]),
                target_token_id=generated[-1],
                num_computed_tokens=req.num_computed_tokens,
                positions=tuple(range(first, first + num_rejected)),
            )

    def _update_from_kv_xfer_finished(self, kv_connector_output) -> None:
        """The connector's report: its own bookkeeping first, then the requests whose KV has
        arrived may run from the next step on; a request that finished while its KV moved
        gives its blocks back now. vLLM walks the two sets in their iteration order, which
        varies with PYTHONHASHSEED; we walk them sorted, so a run frees its blocks in the same
        order every time (one of the orders vLLM can take)."""
        if self.connector is not None:
            self.connector.update_connector_output(kv_connector_output)
        for req_id in sorted(kv_connector_output.finished_recving or ()):
            req = self.requests[req_id]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(req_id)
                self._set_kv_fetch_stage(req, KV_FETCH_COMPLETED_WAITING)
            else:
                assert req.is_finished(), req
                self._aborted_kv_loads.discard(req_id)
                self._free_blocks(req)
        for req_id in sorted(kv_connector_output.finished_sending or ()):
            self._free_blocks(self.requests[req_id])

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        """The loaded blocks are whole now: cache them in the GPU pool. A hit as long as the
        request (never, as hits stop one token short) would still recompute the last token.
        After a failed load ``num_computed_tokens`` is already cut to the valid prefix: only
        that prefix is cached, and with none left the blocks go back (a retry may hit)."""
        load_failed = request.request_id in self.failed_recving_kv_req_ids
        if load_failed:
            if request.num_computed_tokens:
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            else:
                self.kv_cache_manager.free(request)
            self.failed_recving_kv_req_ids.remove(request.request_id)
        else:
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(request.request_id)
        self._emit(
            "cpu_loaded",
            request,
            num_computed_tokens=request.num_computed_tokens,
            load_failed=load_failed,
            block_ids=tuple(self.kv_cache_manager.get_block_ids(request.request_id)[0]),
        )

    def _update_requests_with_invalid_blocks(
        self,
        requests: Iterable[Request],
        invalid_block_ids: set[int],
        num_scheduled_tokens: dict[str, int],
        evict_blocks: bool = True,
    ) -> tuple[set[str], int, set[int]]:
        """Cut each request that holds an invalid block among its computed blocks back to the
        block before the first one. Returns (the affected requests, the tokens to recompute,
        the blocks to evict: from each first invalid block to the end of that table, as the
        later blocks' hashes chain on it; none when ``evict_blocks`` is False, for loads whose
        blocks were never cached). A block two requests share is recomputed by the first only;
        the second keeps it counted as computed and goes back to its tokens before this step.
        """
        affected_req_ids: set[str] = set()
        total_affected_tokens = 0
        blocks_to_evict: set[int] = set()
        marked_invalid_block_ids: set[int] = set()
        block_size = self.kv_cache_manager.block_size
        for request in requests:
            req_id = request.request_id
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(req_id)
            # only blocks computed before this step can hold tokens from the connector
            req_num_computed_tokens = request.num_computed_tokens - num_scheduled_tokens.get(
                req_id, 0
            )
            num_computed_blocks = -(-req_num_computed_tokens // block_size)
            is_affected = marked_invalid_block = False
            for idx, block_id in enumerate(req_block_ids[:num_computed_blocks]):
                if block_id not in invalid_block_ids:
                    continue
                is_affected = True
                if block_id in marked_invalid_block_ids:
                    continue  # an earlier request recomputes it
                marked_invalid_block_ids.add(block_id)
                if marked_invalid_block:
                    continue  # already cut back at an earlier block
                marked_invalid_block = True
                request.num_computed_tokens = idx * block_size
                total_affected_tokens += req_num_computed_tokens - request.num_computed_tokens
                if evict_blocks:
                    blocks_to_evict.update(req_block_ids[idx:])
            if is_affected:
                if not marked_invalid_block:
                    total_affected_tokens += request.num_computed_tokens - req_num_computed_tokens
                    request.num_computed_tokens = req_num_computed_tokens
                affected_req_ids.add(req_id)
                self._emit(
                    "kv_load_failed",
                    request,
                    block_ids=tuple(b for b in req_block_ids if b in invalid_block_ids),
                    num_computed_tokens=request.num_computed_tokens,
                    num_lost_tokens=req_num_computed_tokens - request.num_computed_tokens,
                    asynchronous=not evict_blocks,
                    policy=KV_LOAD_RECOMPUTE if self.recompute_kv_load_failures else KV_LOAD_FAIL,
                )
        return affected_req_ids, total_affected_tokens, blocks_to_evict

    def _handle_failed_recving(self, failed_req_ids: set[str]) -> set[str]:
        """Loads the connector reports failed by request (its block ids may not name blocks
        uniquely): under "recompute" each such request still waiting for its KV starts again
        from no computed tokens once the load is reported finished; under "fail" they fail.
        Returns the requests that fail."""
        affected: set[str] = set()
        for req_id in failed_req_ids:
            request = self.requests.get(req_id)
            if request is not None and request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                affected.add(req_id)
                if self.recompute_kv_load_failures:
                    lost, request.num_computed_tokens = request.num_computed_tokens, 0
                    self.failed_recving_kv_req_ids.add(req_id)
                    # Under "fail" the request ends below, and _handle_invalid_blocks names the
                    # blocks when the connector reports them: one event either way.
                    self._emit(
                        "kv_load_failed",
                        request,
                        block_ids=tuple(self.kv_cache_manager.get_block_ids(req_id)[0]),
                        num_computed_tokens=0,
                        num_lost_tokens=lost,
                        asynchronous=True,
                        policy=KV_LOAD_RECOMPUTE,
                    )
        return set() if self.recompute_kv_load_failures else affected

    def _handle_invalid_blocks(
        self, invalid_block_ids: set[int], num_scheduled_tokens: dict[str, int]
    ) -> set[str]:
        """The worker could not load ``invalid_block_ids``. Requests still waiting for an
        asynchronous load are cut back (their blocks are not cached yet: nothing to evict) and
        resume from the valid prefix when the load is reported finished; running requests that
        loaded synchronously are cut back too, and under the "fail" policy the invalid blocks
        and every block after them in those tables leave the prefix cache (``evict_blocks``),
        so no later request hits them. Returns the requests whose output this step is dropped
        (and which fail, under "fail")."""
        if self.kv_cache_manager.num_kv_cache_groups > 1:
            # a block id names a block only within its group
            raise RuntimeError(
                "invalid_block_ids cannot be mapped back to requests with several KV cache groups"
            )
        async_load_reqs = [
            r
            for r in self.kv_holding_waiting.ordered()
            if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        ]
        async_failed, _, _ = self._update_requests_with_invalid_blocks(
            async_load_reqs, invalid_block_ids, num_scheduled_tokens, evict_blocks=False
        )
        sync_failed, _, sync_blocks_to_evict = self._update_requests_with_invalid_blocks(
            self.running, invalid_block_ids, num_scheduled_tokens, evict_blocks=True
        )
        if not async_failed and not sync_failed:
            return set()
        # Under "recompute" the blocks stay cached: the request rewrites them in place.
        if sync_blocks_to_evict and not self.recompute_kv_load_failures:
            self.kv_cache_manager.evict_blocks(sync_blocks_to_evict)
        if not self.recompute_kv_load_failures:
            return async_failed | sync_failed
        self.failed_recving_kv_req_ids |= async_failed
        return sync_failed

    def update_draft_token_ids(self, draft_token_ids: dict[str, list[int]]) -> None:
        """Keep each request's drafts for the next step; a request still in its prompt, or
        finished, keeps none (vLLM: ``Scheduler.update_draft_token_ids``)."""
        for rid, drafts in draft_token_ids.items():
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            if req.is_prefill_chunk:  # its last step sampled nothing: no drafts
                req.spec_token_ids = []
                continue
            req.spec_token_ids = list(drafts)
            if drafts:
                self._emit(
                    "draft_proposed",
                    req,
                    draft_token_ids=tuple(drafts),
                    num_tokens=req.num_tokens,
                    num_lookahead_tokens=self.config.num_lookahead_tokens,
                    uses_target_hidden_states=self.use_eagle,
                )

    def finish_requests(
        self, request_ids: Union[str, Iterable[str], None], finished_status: RequestStatus
    ) -> list[Request]:
        """Finish requests from outside (a client went away): None = every request.
        Unknown and already finished ids are skipped; returns the requests finished."""
        if not finished_status.finished:
            raise ValueError(f"{finished_status!r} is not a finished status")
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        elif request_ids is None:
            request_ids = list(self.requests)
        done = []
        for rid in dict.fromkeys(request_ids):
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            running = req.status == RequestStatus.RUNNING
            if running:
                self.running.remove(req)
            else:
                for queue in (self.kv_holding_waiting, self.waiting, self.async_kv_waiting):
                    if req in queue:
                        queue.remove_request(req)
                        break
            delay_free_blocks = False
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                # Its load is still running (it will report the request finished receiving):
                # the blocks it writes go back then.
                delay_free_blocks = rid not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(rid)
                self.failed_recving_kv_req_ids.discard(rid)
            req.status = finished_status
            reason = "error" if finished_status == RequestStatus.FINISHED_ERROR else "aborted"
            self._emit("finished", req, reason=reason)
            self._free_request(req, delay_free_blocks=delay_free_blocks)
            if delay_free_blocks:
                self._aborted_kv_loads.add(rid)
            done.append(req)
        return done

    def abort_request(self, request_id: str) -> None:
        self.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)

    def _free_request(
        self, request: Request, delay_free_blocks: bool = False
    ) -> Optional[dict[str, Any]]:
        """A finished request gives back its blocks (none if it never ran) and leaves, unless
        its blocks must wait: for a load still writing them, or for a connector that takes
        over freeing them (it reports the request in ``finished_sending`` or
        ``finished_recving``: ``_update_from_kv_xfer_finished``). A connector sees the block
        table first (the CPU tier pins blocks it still has to store). Returns the connector's
        transfer params for the request's output."""
        assert request.is_finished()
        self._inflight_prefills.discard(request)
        self._unreserve_parked(request)
        self._set_kv_fetch_stage(request, None)
        connector_delay_free_blocks, kv_xfer_params = self._connector_finished(request)
        self.finished_req_ids.add(request.request_id)
        if not (delay_free_blocks or connector_delay_free_blocks):
            self._free_blocks(request)
        return kv_xfer_params

    def _free_blocks(self, request: Request) -> None:
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]

    def _connector_finished(self, request: Request) -> tuple[bool, Optional[dict[str, Any]]]:
        """Tell the connector, if any, that ``request`` finished, with the blocks of its computed
        tokens: every group's (``request_finished_all_groups``) when it supports several,
        else the one group's (``request_finished``). Returns (whether it frees the blocks
        itself, its transfer params)."""
        if self.connector is None:
            return False, None
        block_ids = self.kv_cache_manager.get_block_ids_for_computed_tokens(
            request.request_id, request.num_computed_tokens
        )
        finished_all_groups = getattr(self.connector, "request_finished_all_groups", None)
        if finished_all_groups is None:  # vLLM's connectors without SupportsHMA
            assert self.kv_cache_manager.num_kv_cache_groups == 1
            return self.connector.request_finished(request, block_ids[0])
        return finished_all_groups(request, block_ids)
