"""EngineCore: one step is schedule -> run the model -> update the requests (vLLM:
v1/engine/core.py).

As in vLLM, ``step`` asks the scheduler for a batch, hands it to the model runner, and gives
the sampled tokens back to the scheduler (``update_from_output``), which appends them, stops
finished requests and frees their blocks. With speculative decoding the runner verifies the
drafts in the same forward, and the proposer drafts the next ones after sampling
(``propose_draft_token_ids`` / ``Scheduler.update_draft_token_ids``).

What vLLM spreads over processes (the engine client, the executor, the workers) runs here in
one call, in the same order. Decisions go to the pool's observer, as everywhere in kvcore.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

from kvcore.core.kv_cache_utils import (
    DEFAULT_NONE_HASH_SEED,
    RequestBlockHasher,
    frontend_block_hashes,
    get_request_block_hasher,
    init_none_hash,
)
from kvcore.core.sched.output import SchedulerOutput
from kvcore.core.sched.scheduler import Scheduler
from kvcore.engine import EngineCoreRequest, PrefixHashConfig
from kvcore.outputs import KVConnectorOutput, ModelRunnerOutput
from kvcore.request import Request, RequestStatus
from kvcore.spec_decode.metrics import SpecDecodingStats
from kvcore.structured_output.utils import strip_speculative_padding
from kvcore.utils.hashing import get_hash_fn_by_name
from kvcore.utils.math_utils import cdiv
from kvcore.worker.gpu.input_batch import SeqBatchItem, rows_fed
from kvcore.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator
from kvcore.worker.gpu.spec_decode.rejection_sampler_utils import rejection_sample
from kvcore.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator


@dataclass
class EngineCoreStep:
    """What one step did: the scheduler's output, the tokens each request gained (accepted
    drafts included), and the inputs the forward pass was given (None without a forward)."""

    scheduler_output: SchedulerOutput
    new_tokens: dict[str, list[int]] = field(default_factory=dict)
    model_inputs: Any = None


class EngineCore:
    """The scheduler, the model runner and (optionally) a draft proposer, stepped together.

    Invariant: after ``step`` every request the batch sampled has its token appended or has
    finished; drafts are proposed only for requests still running.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        model_runner,
        drafter: Optional[NgramGPUSpeculator | StandaloneARSpeculator] = None,
        max_model_len: int = 1 << 30,
        *,
        enable_prefix_caching: Optional[bool] = None,
        prefix_caching_hash_algo: str = "sha256",
        hash_block_size: Optional[int] = None,
        none_hash_seed: str = DEFAULT_NONE_HASH_SEED,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        """The keywords are vLLM's CacheConfig settings the block hasher is built from;
        ``enable_prefix_caching`` None reads the KV cache manager's, ``hash_block_size`` None
        the manager's hash block size, ``none_hash_seed`` is the seed already resolved
        (``kv_cache_utils.resolve_none_hash_seed``)."""
        self.scheduler = scheduler
        self.model_runner = model_runner
        self.drafter = drafter
        scheduler.use_eagle = bool(getattr(drafter, "uses_target_hidden_states", False))
        self.max_model_len = max_model_len
        self.spec_decoding_stats = SpecDecodingStats()
        kv_cache_manager = scheduler.kv_cache_manager
        if enable_prefix_caching is None:
            enable_prefix_caching = kv_cache_manager.enable_caching
        if hash_block_size is None:
            hash_block_size = kv_cache_manager.hash_block_size
        # As vLLM 0.34 builds them: a hasher, and the config a frontend needs to hash prompts
        # itself, whenever the engine hashes blocks (prefix caching on, or a KV connector, which
        # names blocks by their hashes too); both None otherwise.
        self.request_block_hasher: Optional[RequestBlockHasher] = None
        self.prefix_hash_config: Optional[PrefixHashConfig] = None
        if enable_prefix_caching or scheduler.connector is not None:
            caching_hash_fn = get_hash_fn_by_name(prefix_caching_hash_algo)
            none_hash = init_none_hash(caching_hash_fn, none_hash_seed)
            self.request_block_hasher = get_request_block_hasher(
                hash_block_size,
                caching_hash_fn,
                num_hash_lookahead_tokens,
                none_hash_seed=none_hash_seed,
            )
            self.prefix_hash_config = PrefixHashConfig(
                hash_algo=prefix_caching_hash_algo,
                hash_block_size=hash_block_size,
                none_hash=none_hash,
                num_lookahead_tokens=num_hash_lookahead_tokens,
            )
        # The KV connector's worker half (the CPU tier's copies), set by whoever builds the
        # engine with one; it runs around the forward as vLLM's model runner runs it.
        self.kv_connector = None

    def add_request(self, request) -> None:
        self.scheduler.add_request(request)

    def preprocess_add_request(self, request: EngineCoreRequest) -> Request:
        """The Request for what a frontend sent, as vLLM 0.34 makes it: the frontend's prompt
        block hashes when ``frontend_block_hashes`` takes them (the engine hashes blocks and
        their count fits the prompt), the engine's own hasher for the rest (the blocks past them
        and every block the request's outputs complete). Hashes not taken are dropped: an
        engine that hashes blocks then hashes the whole prompt itself, one that does not (no
        prefix caching, no KV connector) leaves the request without hashes. vLLM also returns
        the request's wave (data parallel); kvcore has none."""
        frontend_hashes = frontend_block_hashes(request, self.prefix_hash_config)
        return Request.from_engine_core_request(request, self.request_block_hasher, frontend_hashes)

    def _observe(self, kind: str, request_id: Optional[str], **fields) -> None:
        observer = self.scheduler.observer
        if observer is not None:
            observer.on_decision(kind, request_id, **fields)

    def step(self) -> EngineCoreStep:
        scheduler = self.scheduler
        out = scheduler.schedule()
        result = EngineCoreStep(out)
        if self.kv_connector is not None and out.kv_connector_metadata is not None:
            self.kv_connector.bind_connector_metadata(out.kv_connector_metadata)
            self.kv_connector.start_load_kv()
        if out.kv_cache_block_copies:
            # the worker copies partially hit tail blocks before the forward reads them
            self.model_runner.copy_blocks(out.kv_cache_block_copies)
        if out.num_scheduled_tokens:
            items = []
            computed_before = out.num_computed_tokens_before()
            drafts = out.scheduled_spec_decode_tokens
            kvm = scheduler.kv_cache_manager
            for rid, n in out.num_scheduled_tokens.items():
                req = scheduler.requests[rid]
                before = computed_before[rid]
                d = strip_speculative_padding(drafts.get(rid, []))
                # A padded admission's placeholder rows are left out of the forward: vLLM pads
                # them only so its CUDA graphs see uniform batches (kvcore has none), a
                # placeholder has no token to embed, and the step's rollback discards whatever
                # they would write. Their K/V slots are allocated all the same, as in vLLM.
                n -= len(drafts.get(rid, [])) - len(d)
                items.append(
                    SeqBatchItem(
                        request_id=rid,
                        token_ids=(req.all_token_ids + d)[before : before + n],
                        start_pos=before,
                        block_tables=kvm.get_block_ids(rid),
                        sample=before + n >= req.num_tokens,
                        num_draft_tokens=len(d),
                        lora_request=req.lora_request,
                        embeds=rows_fed(req, before, before + n),
                    )
                )
            if self.drafter is None:
                sampled = self.model_runner.execute(items)
                new_tokens = {rid: [t] for rid, t in sampled.items()}
            else:
                new_tokens = self._verify(items, drafts)
                sampled = {rid: toks[-1] for rid, toks in new_tokens.items()}
            result.new_tokens = new_tokens
            result.model_inputs = getattr(self.model_runner, "last_inputs", None)
            if sampled:
                self._observe("sampled", None, tokens=dict(sampled))
            runner_output = ModelRunnerOutput.from_token_lists(
                list(out.num_scheduled_tokens), new_tokens
            )
            if self.kv_connector is not None:
                runner_output = replace(runner_output, kv_connector_output=self._kv_finish(out))
            scheduler.update_from_output(out, runner_output)
            if isinstance(self.drafter, StandaloneARSpeculator):
                self._propose_with_draft_model(out, computed_before, new_tokens)
            elif getattr(self.drafter, "uses_target_hidden_states", False):
                self._propose_with_hidden_states(new_tokens)
            elif self.drafter is not None:
                self.propose_draft_token_ids(new_tokens)
        elif self.kv_connector is not None and self._kv_jobs(out):
            # Only copies this step (a load, or a store that pinned blocks): nothing is stuck,
            # unless they are stores alone behind a head no pool could hold (a lazy CPU tier
            # stores free blocks at almost every step, which would hide it for ever).
            scheduler.update_from_output(out, ModelRunnerOutput([], {}, [], self._kv_finish(out)))
            if self._only_stores(out) and self._head_exceeds_pool():
                self._abort_if_never_fits(out)
        else:
            self._abort_if_never_fits(out)
        return result

    def _only_stores(self, out: SchedulerOutput) -> bool:
        """The step's connector work is stores alone: no load, no request waiting for its K/V,
        no finished request whose blocks the connector holds."""
        scheduler = self.scheduler
        return (
            getattr(out.kv_connector_metadata, "load_event", -1) < 0
            and not scheduler.has_finished_requests()
            and not any(
                r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                for r in scheduler.kv_holding_waiting.ordered()
            )
        )

    def _head_exceeds_pool(self) -> bool:
        """Whether the head of the queue needs more blocks for its tokens than the whole pool
        has, full-attention groups only (a sliding window caps its group's blocks): under either
        admission rule it can then never compute them all, so never finish."""
        scheduler = self.scheduler
        queue = scheduler.kv_holding_waiting or scheduler.waiting or scheduler.async_kv_waiting
        kvm = scheduler.kv_cache_manager
        groups = len(kvm.coordinator.groups)
        if not queue or scheduler.running or self._full_groups() != groups:
            return False
        need = self._full_group_blocks(queue.peek_request().num_tokens)
        return need > kvm.block_pool.num_gpu_blocks - 1

    def _abort_if_never_fits(self, out: SchedulerOutput) -> None:
        scheduler = self.scheduler
        if (
            not scheduler.running
            and (scheduler.kv_holding_waiting or scheduler.waiting or scheduler.async_kv_waiting)
            and not self._retry_after_drafts(out)
        ):
            # Nothing runs and the head of the queue was refused by an empty pool: it never fits.
            # If its tokens alone fit, what never fits is the 1 + num_spec_tokens rows vLLM pads
            # its one-token admission to (vLLM would keep it waiting, every step refused).
            # (Or the padded rows exceed max_num_batched_tokens: vLLM's budget break, every step.)
            head = (
                scheduler.kv_holding_waiting or scheduler.waiting or scheduler.async_kv_waiting
            ).peek_request()
            reason, budget = "never_fits", {}
            if self._fits_without_drafts(head):
                cfg = scheduler.config
                reason = "never_fits_padded"
                if 1 + cfg.num_spec_tokens > cfg.max_num_batched_tokens:
                    reason, budget = (
                        "never_fits_padded_budget",
                        {"token_budget": cfg.max_num_batched_tokens},
                    )
            scheduler.abort_request(head.request_id)
            self._observe(
                "blocked",
                head.request_id,
                reason=reason,
                num_tokens=head.num_tokens,
                usable_blocks=scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
                **budget,
            )

    def _kv_jobs(self, out: SchedulerOutput) -> bool:
        """Whether the connector's worker has something to do or report though no token runs:
        copies ordered (the CPU tier's jobs), a request waiting for its K/V, or a finished
        request whose blocks the connector still holds (a P/D prefill replica's, until the
        decode replica has pulled them)."""
        md = out.kv_connector_metadata
        if md is None:
            return False
        if getattr(md, "load_event", -1) >= 0 or getattr(md, "store_event", -1) >= 0:
            return True
        scheduler = self.scheduler
        return scheduler.has_finished_requests() or any(
            r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            for r in scheduler.kv_holding_waiting.ordered()
        )

    def _kv_finish(self, out: SchedulerOutput) -> KVConnectorOutput:
        """After the forward: the step's stores, then what the worker finished."""
        conn = self.kv_connector
        conn.wait_for_save()
        results = conn.get_transfer_results(out.finished_req_ids)
        kv_out = KVConnectorOutput(
            finished_sending=results.finished_sending or None,
            finished_recving=results.finished_recving or None,
            kv_connector_worker_meta=conn.build_connector_worker_meta(),
            invalid_block_ids=conn.get_block_ids_with_load_errors(),
            failed_recving=results.failed_recving,
        )
        conn.clear_connector_metadata()
        return kv_out

    def _full_group_blocks(self, num_tokens: int) -> int:
        """Blocks the full-attention groups need for ``num_tokens`` tokens, each group at its
        own block size."""
        coordinator = self.scheduler.kv_cache_manager.coordinator
        return sum(
            cdiv(num_tokens, bs)
            for g, bs in zip(coordinator.groups, coordinator.group_block_sizes)
            if g.kind == "full"
        )

    def _full_groups(self) -> int:
        return sum(
            1 for g in self.scheduler.kv_cache_manager.coordinator.groups if g.kind == "full"
        )

    def _retry_after_drafts(self, out: SchedulerOutput) -> bool:
        """A lone request whose drafts needed more slots than the pool has preempted itself;
        without drafts its real tokens still fit, so it goes back through the queue (as in
        vLLM) instead of being aborted as one that never fits."""
        if not out.preempted_req_ids:
            return False
        return self._fits_without_drafts(self.scheduler.waiting.peek_request())

    def _fits_without_drafts(self, head) -> bool:
        """With drafts on, whether ``head``'s tokens (and one step's lookahead slots, or one
        more slot) fit in the empty pool."""
        if self.drafter is None:
            return False
        kvm = self.scheduler.kv_cache_manager
        # admitted again it needs its tokens and the lookahead slots (a draft model's), or one more
        lookahead = max(1, self.scheduler.config.num_lookahead_tokens)
        need = self._full_group_blocks(head.num_tokens + lookahead)
        return need <= kvm.block_pool.num_gpu_blocks - 1

    def _verify(
        self, items: list[SeqBatchItem], drafts: dict[str, list[int]]
    ) -> dict[str, list[int]]:
        """One forward over tokens and drafts; per sampling request the tokens it gains
        (vLLM: the rejection sampler's greedy path)."""
        targets = self.model_runner.execute_verify(items)
        gained = {}
        for rid, target in targets.items():
            d = drafts.get(rid, [])
            gained[rid] = rejection_sample(strip_speculative_padding(d), target)
            if d:
                # as vLLM's update_from_output: a placeholder counts as a draft, rejected
                self.spec_decoding_stats = self.spec_decoding_stats.observe(
                    len(d), len(gained[rid]) - 1
                )
        return gained

    def propose_draft_token_ids(self, new_tokens: dict[str, list[int]]) -> None:
        """Drafts for every request that sampled and still runs, handed to the scheduler
        (vLLM: ``propose_draft_token_ids``, then ``Scheduler.update_draft_token_ids``)."""
        proposals: dict[str, list[int]] = {}
        for rid in new_tokens:
            req = self.scheduler.requests.get(rid)  # gone once finished
            if req is None or req.num_tokens >= self.max_model_len:
                continue
            proposals[rid] = self.drafter.propose(req.all_token_ids)
        self.scheduler.update_draft_token_ids(proposals)

    def _propose_with_hidden_states(self, new_tokens: dict[str, list[int]]) -> None:
        """An EAGLE drafter after the verify step: each request still running drafts from the
        hidden state its last token came from (the runner kept them)."""
        requests = self.scheduler.requests
        gained = {rid: t for rid, t in new_tokens.items() if rid in requests}
        num_tokens = {rid: requests[rid].num_tokens for rid in gained}
        self.scheduler.update_draft_token_ids(self.drafter.propose(gained, num_tokens))

    def _propose_with_draft_model(
        self,
        out: SchedulerOutput,
        computed_before: dict[str, int],
        new_tokens: dict[str, list[int]],
    ) -> None:
        """The draft model's passes after this step's forward (vLLM: the runner's
        ``propose_draft_token_ids`` for a draft model): every request still running that ran
        this step feeds the draft the tokens the target verified, plus its new token if it
        sampled; rejected drafts are left out, their slots are written again later."""
        scheduler = self.scheduler
        kvm = scheduler.kv_cache_manager
        first_pass = []
        num_tokens = {}
        for rid in out.num_scheduled_tokens:
            req = scheduler.requests.get(rid)  # gone once finished
            if req is None:
                continue
            sampled = bool(new_tokens.get(rid))
            start = computed_before[rid]
            end = req.num_tokens if sampled else req.num_computed_tokens
            if end <= start:
                continue
            first_pass.append(
                SeqBatchItem(
                    request_id=rid,
                    token_ids=req.all_token_ids[start:end],
                    start_pos=start,
                    block_tables=kvm.get_block_ids(rid),
                    sample=sampled,
                    lora_request=req.lora_request,
                )
            )
            num_tokens[rid] = req.num_tokens
        proposals = self.drafter.propose(first_pass, num_tokens)
        scheduler.update_draft_token_ids(proposals)
