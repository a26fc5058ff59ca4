"""The KV connector interface the scheduler and the worker talk to (vLLM:
distributed/kv_transfer/kv_connector/v1/base.py).

A connector has two halves built from the same class: the scheduler's
(``KVConnectorRole.SCHEDULER``) plans which KV moves where, and the worker's
(``KVConnectorRole.WORKER``) moves it. The only thing that passes from the first to the second is
the step's ``KVConnectorMetadata``; what comes back is a ``KVConnectorOutput``
(kvcore/outputs.py). Only the calls kvcore's scheduler and engine make are declared here, each
with vLLM's name and arguments; the scheduler needs no more than these, so any object with
vLLM's scheduler-side methods (a vLLM connector included) can stand in.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
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


@dataclass
class KVConnectorTransferResults:
    """A worker's finished transfers since the last call; a failed receive is also in
    ``finished_recving``, so the scheduler can let its request out of the wait."""

    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)


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

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """``get_finished``'s two sets with the failed receives (none unless a connector says)."""
        finished_sending, finished_recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(
            finished_sending=set(finished_sending or ()),
            finished_recving=set(finished_recving or ()),
        )

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        return None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """The GPU blocks whose K/V failed to load since the last call (empty: none). An
        asynchronous load reports them no later than the step that reports the request
        finished receiving (which it still does, failed or not)."""
        return set()

    def get_kv_connector_stats(self) -> Any:
        """The connector's transfer statistics since the last call (None: it keeps none)."""
        return None

    # -- scheduler side -------------------------------------------------------------------
    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        """The scheduler's KVCacheManager, once it is built (binds its block pool too)."""
        self._kv_cache_manager = kv_cache_manager
        self.bind_gpu_block_pool(kv_cache_manager.block_pool)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        """The GPU block pool, for a connector that tracks GPU blocks (pins, prefix hits)."""

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

    def on_new_request(self, request: Any) -> None:
        """A request was added to the scheduler (vLLM 0.34: before it is queued, so that
        ``may_load_async`` can read what this records)."""

    def may_load_async(self, request: Any) -> bool:
        """Whether ``get_num_new_matched_tokens`` may answer ``load_kv_async=True`` for
        ``request`` (vLLM 0.34). With ``max_num_inflight_kv_loads`` set, the scheduler queues
        such requests apart (``Scheduler.async_kv_waiting``) so that their loads can start while
        the running batch is full. Asked each time the request is queued. vLLM's default: the
        P/D flag ``do_remote_prefill`` of its ``kv_transfer_params``."""
        params = request.kv_transfer_params
        return bool(params and params.get("do_remote_prefill"))

    def update_connector_output(self, connector_output: Any) -> None:
        """The worker's report for the step (kvcore.outputs.KVConnectorOutput)."""

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, Optional[dict[str, Any]]]:
        """Called once, when the request finishes and before its blocks are freed: (whether
        the connector frees them itself later, reporting the request in ``finished_sending`` or
        ``finished_recving``; transfer params for the request's output)."""
        return False, None

    def take_events(self) -> Iterable[Any]:
        """KV cache events of the connector's own storage, since the last call."""
        return ()

    def has_pending_block_frees(self) -> bool:
        """Whether transfers in flight will give blocks back (instead of a preemption)."""
        return False

    def has_pending_push_work(self) -> bool:
        """Whether the engine must keep stepping for the connector's sake after the last
        request finished (copies still to make)."""
        return False

    def get_finished_count(self) -> Optional[int]:
        """How many workers report each request's transfer finished (None: every worker)."""
        return None


class SupportsHMA(ABC):
    """A connector that takes every KV cache group's block table when a request finishes
    (vLLM's hybrid memory allocator support)."""

    @abstractmethod
    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, Optional[dict[str, Any]]]: ...


def supports_hma(connector: Any) -> bool:
    """Whether a connector (a class or an instance) declares SupportsHMA (vLLM's helper of the
    same name in kv_connector/v1/base.py)."""
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)
