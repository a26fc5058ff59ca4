"""What the scheduler hands the model runner, and what comes back (vLLM: v1/core/sched/output.py);
what comes back is :class:`kvcore.outputs.ModelRunnerOutput`.

A request's data goes to the runner in full, in ``NewRequestData``, when it is admitted: the
first time, and again each time it is resumed after preemption (its blocks were freed and the
runner dropped its state; vLLM 0.34.0's shape, 0.33.0 sent a resumed request among the cached
ones). Afterwards only what changed travels, in ``CachedRequestData``. Token counts are those
before this step's tokens, so ``num_computed_tokens + num_scheduled_tokens[id]`` is where the
request will be after the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner does not hold: admitted for the first time, or resumed after
    preemption. ``block_ids`` is its whole table; ``prefill_token_ids`` every token to prefill
    (the prompt, then the outputs of a resumed request: vLLM's ``Request.prefill_token_ids``).
    vLLM's sampling, pooling, LoRA and prompt-embedding fields are left out (nothing in kvcore
    reads them from here)."""

    req_id: str
    prompt_token_ids: list[int]
    # the request's multimodal items (vLLM's field: a KV connector keys stored K/V by their
    # identifiers, e.g. vLLM's ExampleConnector)
    mm_features: list[Any]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    prefill_token_ids: list[int]


@dataclass(frozen=True)
class CachedRequestData:
    """The running requests the runner already holds, as parallel lists in batch order.

    ``new_block_ids`` holds the blocks added this step (None if none), to append to the
    request's table. ``new_token_ids`` is only filled under pipeline parallelism (vLLM), so
    never in kvcore. (0.33.0 also had ``resumed_req_ids`` and ``all_token_ids`` here, for a
    resumed request; 0.34.0 sends that one in ``NewRequestData``.)
    """

    req_ids: list[str]
    new_token_ids: list[list[int]]
    new_block_ids: list[tuple[list[int], ...] | None]
    num_computed_tokens: list[int]
    num_output_tokens: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make_empty(cls) -> "CachedRequestData":
        return cls(
            req_ids=[],
            new_token_ids=[],
            new_block_ids=[],
            num_computed_tokens=[],
            num_output_tokens=[],
        )


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's batch. ``num_scheduled_tokens`` is in batch order: running requests
    first, then the ones admitted from the waiting queue (new and resumed alike, in the order
    they were admitted, as ``scheduled_new_reqs``)."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None = None
    # request id -> the draft tokens scheduled after its last token (speculative decoding)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # the KV connector's plan for the step (its KVConnectorMetadata); None without a connector
    kv_connector_metadata: Any = None
    # (source, destination) block ids the worker copies before the forward pass: a partial
    # prefix hit's tail block (copy-on-write); None when there is nothing to copy
    kv_cache_block_copies: list[tuple[int, int]] | None = None

    def num_computed_tokens_before(self) -> dict[str, int]:
        """Request id -> tokens already computed before this step, for every scheduled request."""
        out = {d.req_id: d.num_computed_tokens for d in self.scheduled_new_reqs}
        c = self.scheduled_cached_reqs
        out.update(zip(c.req_ids, c.num_computed_tokens))
        return out
