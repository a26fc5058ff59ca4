"""The KV connector interface the scheduler and the worker talk to (vLLM:
distributed/kv_transfer/kv_connector/v1/base.py).

A connector has two halves built from the same class: the scheduler's
(``KVConnectorRole.SCHEDULER``) plans which KV moves where, and the worker's
(``KVConnectorRole.WORKER``) moves it. The only thing that passes from the first to the second is
the step's ``KVConnectorMetadata``; what comes back is a ``KVConnectorOutput``
(kvcore/outputs.py). Only the calls kvcore's scheduler and engine make are declared here, each
with vLLM's name and arguments.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterable, Optional


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


@dataclass
class KVConnectorMetadata:
    """What the scheduler's half hands the worker's half for one step (a connector subclasses
    it)."""


@dataclass
class KVConnectorWorkerMetadata:
    """What the worker's half reports back to the scheduler's half (a connector subclasses it);
    ``aggregate`` merges the reports of several workers."""

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        raise NotImplementedError


class KVConnectorBase_V1(ABC):
    """A connector, one role per instance. Invariant: the metadata bound on the worker side is
    the one ``build_connector_meta`` returned for the same step, and is cleared after it."""

    def __init__(self, role: KVConnectorRole) -> None:
        self._role = role
        self._connector_metadata: Optional[KVConnectorMetadata] = None

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # -- worker side ----------------------------------------------------------------------
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def register_kv_caches(self, kv_caches: Any) -> None:
        """The worker's KV cache tensors, once, before the first step."""

    @abstractmethod
    def start_load_kv(self, forward_context: Any = None, **kwargs: Any) -> None: ...

    @abstractmethod
    def wait_for_save(self) -> None: ...

    def get_finished(
        self, finished_req_ids: set[str]
    ) -> tuple[Optional[set[str]], Optional[set[str]]]:
        """(finished_sending, finished_recving): the requests whose transfers are done."""
        return None, None

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        return None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """The GPU blocks whose K/V failed to load since the last call (empty: none). An
        asynchronous load reports them no later than the step that reports the request
        finished receiving (which it still does, failed or not)."""
        return set()

    # -- scheduler side -------------------------------------------------------------------
    @abstractmethod
    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[Optional[int], bool]:
        """(tokens the connector can supply past ``num_computed_tokens``, whether they load
        asynchronously)."""

    @abstractmethod
    def update_state_after_alloc(
        self, request: Any, blocks: Any, num_external_tokens: int
    ) -> None: ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata: ...

    def update_connector_output(self, connector_output: Any) -> None:
        """The worker's report for the step (kvcore.outputs.KVConnectorOutput)."""

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, Optional[dict[str, Any]]]:
        """(whether the scheduler must wait before freeing the blocks, transfer params)."""
        return False, None

    def take_events(self) -> Iterable[Any]:
        """KV cache events of the connector's own storage, since the last call."""
        return ()


class SupportsHMA(ABC):
    """A connector that takes every KV cache group's block table when a request finishes
    (vLLM's hybrid memory allocator support)."""

    @abstractmethod
    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, Optional[dict[str, Any]]]: ...
