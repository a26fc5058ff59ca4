"""What the scheduler hands the model runner, and what comes back (vLLM: v1/core/sched/output.py);
what comes back is :class:`kvcore.outputs.ModelRunnerOutput`.

A request's data goes to the runner once, in ``NewRequestData``; afterwards only
what changed travels, in ``CachedRequestData``. Token counts are those before
this step's tokens, so ``num_computed_tokens + num_scheduled_tokens[id]`` is where
the request will be after the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NewRequestData:
    """A request the runner has not seen: scheduled for the first time."""

    req_id: str
    prompt_token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    # the request's multimodal items (vLLM's field: a KV connector keys stored K/V by their
    # identifiers, e.g. vLLM's ExampleConnector)
    mm_features: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class CachedRequestData:
    """The requests the runner already knows, as parallel lists in batch order.

    ``new_block_ids`` holds the blocks added this step (None if none); a resumed request
    (in ``resumed_req_ids``) lost its blocks to preemption, so its entry is its whole new
    table. ``all_token_ids`` carries the tokens of every request that was not in the
    previous step's batch. ``new_token_ids`` is only filled under pipeline parallelism.
    """

    req_ids: list[str] = field(default_factory=list)
    resumed_req_ids: set[str] = field(default_factory=set)
    new_token_ids: list[list[int]] = field(default_factory=list)
    all_token_ids: dict[str, list[int]] = field(default_factory=dict)
    new_block_ids: list[tuple[list[int], ...] | None] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's batch. ``num_scheduled_tokens`` is in batch order: running requests
    first, then the ones admitted from the waiting queue."""

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
