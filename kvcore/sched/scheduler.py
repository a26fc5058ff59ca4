"""Scheduler: decides each step's batch under a token budget (vLLM v1: sched/scheduler)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kvcore import events
from kvcore.kv.kv_cache_manager import KVCacheManager
from kvcore.sched.request import Request, RequestStatus
from kvcore.sched.request_queue import PRIORITY, create_request_queue

ADMIT_FULL_SEQUENCE = "full_sequence"  # v0.33: a waiting request is admitted only if all of it fits
ADMIT_FIRST_CHUNK = "first_chunk"      # older releases: only this step's chunk must fit
ADMISSIONS = (ADMIT_FULL_SEQUENCE, ADMIT_FIRST_CHUNK)


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 256
    policy: str = "fcfs"
    max_model_len: int = 8192
    admission: str = ADMIT_FULL_SEQUENCE
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True


@dataclass
class SchedulerOutput:
    """One step's batch. ``num_scheduled_tokens`` preserves batch order."""

    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    scheduled_new_reqs: list[str] = field(default_factory=list)
    scheduled_resumed_reqs: list[str] = field(default_factory=list)
    scheduled_running_reqs: list[str] = field(default_factory=list)
    preempted_reqs: list[str] = field(default_factory=list)
    # Tokens already in the pool for each scheduled request before this step.
    num_computed_before: dict[str, int] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())


class Scheduler:
    """Waiting and running queues over one KVCacheManager.

    Invariants: a request is in exactly one of waiting / running / finished; every
    running request holds blocks for all its computed tokens; at most
    ``max_num_seqs`` run and at most ``max_num_batched_tokens`` are computed per step.
    """

    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager,
                 recorder: Optional[events.Recorder] = None) -> None:
        if config.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if config.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if config.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}; got {config.admission!r}")
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.recorder = recorder
        self.policy = config.policy
        self.waiting = create_request_queue(config.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: list[str] = []

    def _emit(self, event_kind: str, request: Request, **data) -> None:
        if self.recorder is not None:
            self.recorder.at(request.request_id).emit(event_kind, **data)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.requests[request.request_id] = request
        self.waiting.add_request(request)
        self._emit(events.ARRIVED, request, num_prompt_tokens=request.num_prompt_tokens,
                   priority=request.priority)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    # -- scheduling ---------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        out = SchedulerOutput()
        token_budget = cfg.max_num_batched_tokens
        scheduled_running: list[Request] = []
        preempted: list[Request] = []

        # 1) Running requests first, in running order.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new = request.num_tokens - request.num_computed_tokens
            if 0 < cfg.long_prefill_token_threshold < num_new:
                num_new = cfg.long_prefill_token_threshold
            num_new = min(num_new, token_budget, cfg.max_model_len - 1 - request.num_computed_tokens)
            if num_new <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(request, num_new)
                if new_blocks is not None:
                    break
                victim = self._pick_victim()
                self.running.remove(victim)
                if victim in scheduled_running:
                    # Its tokens were already in this batch: take them back out.
                    scheduled_running.remove(victim)
                    token_budget += out.num_scheduled_tokens.pop(victim.request_id)
                    out.num_computed_before.pop(victim.request_id, None)
                    req_index -= 1
                self._preempt_request(victim, reason=f"{request.request_id} needed blocks")
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                break
            scheduled_running.append(request)
            out.num_scheduled_tokens[request.request_id] = num_new
            out.num_computed_before[request.request_id] = request.num_computed_tokens
            token_budget -= num_new
            req_index += 1

        # 2) Waiting requests, unless someone was preempted in this step.
        if preempted:
            if self.waiting and self.recorder is not None:
                self._emit(events.BLOCKED, self.waiting.peek_request(), reason="preempted_this_step")
        else:
            while self.waiting and token_budget > 0:
                request = self.waiting.peek_request()
                if len(self.running) >= cfg.max_num_seqs:
                    self._emit(events.BLOCKED, request, reason="max_num_seqs", max_num_seqs=cfg.max_num_seqs)
                    break
                hits, num_hit = self.kv_cache_manager.get_computed_blocks(request)
                num_new = request.num_tokens - num_hit
                if 0 < cfg.long_prefill_token_threshold < num_new:
                    num_new = cfg.long_prefill_token_threshold
                if not cfg.enable_chunked_prefill and num_new > token_budget:
                    self._emit(events.BLOCKED, request, reason="token_budget", token_budget=token_budget)
                    break
                num_new = min(num_new, token_budget)
                new_blocks = self.kv_cache_manager.allocate_slots(
                    request, num_new, num_hit, hits,
                    full_sequence_must_fit=cfg.admission == ADMIT_FULL_SEQUENCE)
                if new_blocks is None:
                    self._emit(events.BLOCKED, request, reason="no_free_blocks",
                               num_free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
                               num_tokens=request.num_tokens)
                    break
                self.waiting.pop_request()
                self.running.append(request)
                resumed = request.status == RequestStatus.PREEMPTED
                (out.scheduled_resumed_reqs if resumed else out.scheduled_new_reqs).append(request.request_id)
                out.num_scheduled_tokens[request.request_id] = num_new
                out.num_computed_before[request.request_id] = num_hit
                token_budget -= num_new
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_hit
                request.num_cached_tokens = num_hit
                self._emit(events.RESUMED if resumed else events.ADMITTED, request,
                           num_cached_tokens=num_hit, num_preemptions=request.num_preemptions)
            if self.waiting and token_budget <= 0 and self.recorder is not None:
                self._emit(events.BLOCKED, self.waiting.peek_request(), reason="token_budget", token_budget=0)

        out.scheduled_running_reqs = [r.request_id for r in scheduled_running]
        out.preempted_reqs = [r.request_id for r in preempted]
        for rid, n in out.num_scheduled_tokens.items():
            req = self.requests[rid]
            before = out.num_computed_before[rid]
            if rid in out.scheduled_resumed_reqs:
                kind = "recompute"
            elif before >= req.num_prompt_tokens:
                kind = "decode"
            elif before + n < req.num_tokens or rid in out.scheduled_running_reqs:
                kind = "chunk"
            else:
                kind = "prefill"
            self._emit(events.SCHEDULED, req, num_tokens=n, kind=kind, start=before)
            # vLLM advances num_computed_tokens when it schedules, before the model runs.
            req.num_computed_tokens += n
        return out

    def _pick_victim(self) -> Request:
        if self.policy == PRIORITY:
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt_request(self, request: Request, reason: str) -> None:
        self._emit(events.PREEMPTED, request, policy=self.policy, reason=reason,
                   victim_priority=request.priority, num_computed_tokens=request.num_computed_tokens)
        self.kv_cache_manager.free(request, reason="preempted")
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.waiting.prepend_request(request)

    # -- after the model ran ------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[str]:
        """Append sampled tokens, stop finished requests and free their blocks.

        A request still in the middle of its prompt (chunked prefill) gets no token.
        A request's last sampled token never gets a KV slot: it stops first.
        """
        finished = []
        for rid in out.num_scheduled_tokens:
            req = self.requests[rid]
            if req.num_computed_tokens < req.num_tokens:
                continue
            token = sampled[rid]
            req.append_output_token_ids([token])
            reason = None
            # vLLM checks the length cap before EOS.
            if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.config.max_model_len:
                req.status, reason = RequestStatus.FINISHED_LENGTH_CAPPED, "length"
            elif not req.ignore_eos and token in req.eos_token_ids:
                req.status, reason = RequestStatus.FINISHED_STOPPED, "eos"
            if reason is not None:
                self.running.remove(req)
                self._emit(events.FINISHED, req, reason=reason, num_output_tokens=req.num_output_tokens)
                self.kv_cache_manager.free(req, reason="finished")
                finished.append(rid)
        self.finished_req_ids.extend(finished)
        return finished

    def abort_request(self, request_id: str) -> None:
        req = self.requests[request_id]
        if req.is_finished():
            return
        if req in self.running:
            self.running.remove(req)
            self.kv_cache_manager.free(req, reason="aborted")
        else:
            self.waiting.remove_request(req)
        req.status = RequestStatus.FINISHED_ABORTED
        self._emit(events.FINISHED, req, reason="aborted")
