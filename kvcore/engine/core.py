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

from dataclasses import dataclass, field
from typing import Any, Optional

from kvcore.core.sched.output import SchedulerOutput
from kvcore.core.sched.scheduler import Scheduler
from kvcore.outputs import ModelRunnerOutput
from kvcore.sample.rejection_sampler import rejection_sample
from kvcore.spec_decode.metrics import SpecDecodingStats
from kvcore.spec_decode.ngram_proposer import NgramProposer
from kvcore.utils.math_utils import cdiv
from kvcore.worker.gpu_input_batch import SeqBatchItem


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
        drafter: Optional[NgramProposer] = None,
        max_model_len: int = 1 << 30,
    ) -> None:
        self.scheduler = scheduler
        self.model_runner = model_runner
        self.drafter = drafter
        self.max_model_len = max_model_len
        self.spec_decoding_stats = SpecDecodingStats()

    def add_request(self, request) -> None:
        self.scheduler.add_request(request)

    def _observe(self, kind: str, request_id: Optional[str], **fields) -> None:
        observer = self.scheduler.observer
        if observer is not None:
            observer.on_decision(kind, request_id, **fields)

    def step(self) -> EngineCoreStep:
        scheduler = self.scheduler
        out = scheduler.schedule()
        result = EngineCoreStep(out)
        if out.num_scheduled_tokens:
            items = []
            computed_before = out.num_computed_tokens_before()
            drafts = out.scheduled_spec_decode_tokens
            kvm = scheduler.kv_cache_manager
            for rid, n in out.num_scheduled_tokens.items():
                req = scheduler.requests[rid]
                before = computed_before[rid]
                d = drafts.get(rid, [])
                items.append(
                    SeqBatchItem(
                        request_id=rid,
                        token_ids=(req.all_token_ids + d)[before : before + n],
                        start_pos=before,
                        block_tables=kvm.get_block_ids(rid),
                        sample=before + n >= req.num_tokens,
                        num_draft_tokens=len(d),
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
            scheduler.update_from_output(
                out, ModelRunnerOutput.from_token_lists(list(out.num_scheduled_tokens), new_tokens)
            )
            if self.drafter is not None:
                self.propose_draft_token_ids(new_tokens)
        elif not scheduler.running and scheduler.waiting and not self._retry_after_drafts(out):
            # Nothing runs and the head of the queue was refused by an empty pool: it never fits.
            head = scheduler.waiting.peek_request()
            scheduler.abort_request(head.request_id)
            self._observe(
                "blocked",
                head.request_id,
                reason="never_fits",
                num_tokens=head.num_tokens,
                usable_blocks=scheduler.kv_cache_manager.block_pool.num_gpu_blocks - 1,
            )
        return result

    def _full_groups(self) -> int:
        return sum(
            1 for g in self.scheduler.kv_cache_manager.coordinator.groups if g.kind == "full"
        )

    def _retry_after_drafts(self, out: SchedulerOutput) -> bool:
        """A lone request whose drafts needed more slots than the pool has preempted itself;
        without drafts its real tokens still fit, so it goes back through the queue (as in
        vLLM) instead of being aborted as one that never fits."""
        if self.drafter is None or not out.preempted_req_ids:
            return False
        head = self.scheduler.waiting.peek_request()
        kvm = self.scheduler.kv_cache_manager
        need = cdiv(head.num_tokens + 1, kvm.block_size) * self._full_groups()
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
            gained[rid] = rejection_sample(d, target)
            if d:
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
