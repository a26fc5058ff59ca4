"""Waiting queues: FCFS (a deque) and priority (a heap on (priority, arrival, id))."""

from __future__ import annotations

import heapq
from collections import deque

from kvcore.request import Request

FCFS = "fcfs"
PRIORITY = "priority"
# the one list of scheduling policies (the scenario schema, the playground's form and the tests
# derive theirs from it)
POLICIES = (FCFS, PRIORITY)


class FCFSRequestQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add_request(self, request: Request) -> None:
        self._q.append(request)

    def prepend_request(self, request: Request) -> None:
        """A preempted request goes back to the front: it arrived before those behind it."""
        self._q.appendleft(request)

    def peek_request(self) -> Request:
        return self._q[0]

    def pop_request(self) -> Request:
        return self._q.popleft()

    def remove_request(self, request: Request) -> None:
        self._q.remove(request)

    def remove_requests(self, requests) -> None:
        """Several at once, in one pass over the queue (vLLM's ``remove_requests``)."""
        gone = set(map(id, requests))
        self._q = deque(r for r in self._q if id(r) not in gone)

    def ordered(self) -> list[Request]:
        return list(self._q)

    def __iter__(self):
        return iter(self.ordered())

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return bool(self._q)


class PriorityRequestQueue:
    """Lower priority value first, then earlier arrival, then request id."""

    def __init__(self) -> None:
        self._heap: list[Request] = []

    def add_request(self, request: Request) -> None:
        heapq.heappush(self._heap, request)

    prepend_request = add_request  # a preempted request re-enters by its own key

    def peek_request(self) -> Request:
        return self._heap[0]

    def pop_request(self) -> Request:
        return heapq.heappop(self._heap)

    def remove_request(self, request: Request) -> None:
        self._heap.remove(request)
        heapq.heapify(self._heap)

    def remove_requests(self, requests) -> None:
        """Several at once, re-heaped once (vLLM's ``remove_requests``)."""
        gone = set(map(id, requests))
        self._heap = [r for r in self._heap if id(r) not in gone]
        heapq.heapify(self._heap)

    def ordered(self) -> list[Request]:
        return sorted(self._heap)

    def __iter__(self):
        """In scheduling order (as vLLM's)."""
        return iter(self.ordered())

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)


def create_request_queue(policy: str):
    if policy == FCFS:
        return FCFSRequestQueue()
    if policy == PRIORITY:
        return PriorityRequestQueue()
    raise ValueError(f"unknown scheduling policy {policy!r}; choose one of {POLICIES}")
