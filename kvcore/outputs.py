"""What the model runner returns to the scheduler each step (vLLM: v1/outputs.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVConnectorOutput:
    """What a KV connector's worker half reports after a step: the requests whose KV finished
    going out (``finished_sending``) or coming in (``finished_recving``), and the connector's
    own report (``kv_connector_worker_meta``). ``invalid_block_ids``: GPU blocks whose K/V
    failed to load from the connector; the requests holding them are rolled back to recompute
    them (or fail, by ``kv_load_failure_policy``: ``Scheduler._handle_invalid_blocks``);
    ``failed_recving``: the same, named by request (``Scheduler._handle_failed_recving``)."""

    finished_sending: Optional[set[str]] = None
    finished_recving: Optional[set[str]] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    invalid_block_ids: set[int] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self) -> bool:
        return (
            not self.finished_sending
            and not self.finished_recving
            and not self.kv_connector_stats
            and not self.kv_cache_events
            and not self.invalid_block_ids
            and not self.failed_recving
            and not self.kv_connector_worker_meta
        )


@dataclass(frozen=True)
class ModelRunnerOutput:
    """Sampled tokens per request, in ``req_ids`` order; an empty list for a request still
    in the middle of its prompt (nothing sampled). ``kv_connector_output``: the KV
    connector's report of the step (None without a connector)."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]]
    kv_connector_output: Optional[KVConnectorOutput] = None

    @classmethod
    def from_token_lists(
        cls, req_ids: list[str], sampled: dict[str, list[int]]
    ) -> "ModelRunnerOutput":
        """Several tokens per request (speculative decoding: accepted drafts + one more)."""
        return cls(
            list(req_ids),
            {r: i for i, r in enumerate(req_ids)},
            [list(sampled.get(r, ())) for r in req_ids],
        )

    @classmethod
    def from_sampled(cls, req_ids: list[str], sampled: dict[str, int]) -> "ModelRunnerOutput":
        return cls(
            list(req_ids),
            {r: i for i, r in enumerate(req_ids)},
            [[sampled[r]] if r in sampled else [] for r in req_ids],
        )
