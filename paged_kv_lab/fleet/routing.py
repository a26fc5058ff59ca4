"""A router and what it knows: the policy, its global index fed by KV events, and its own
bookkeeping of the requests it routed (Dynamo's: prompt load still to prefill, blocks in flight).

Shared by the model-free fleet (fleet/trace_fleet.py) and the fleet on the real model
(fleet/model_fleet.py). A replica, to the router, is anything with an ``index``, a
``scheduler`` (vLLM's), an ``inbox`` of requests routed but not yet added, ``used_blocks()``
and a ``block_pool``.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional, Sequence

from paged_kv_lab.fleet.index import GlobalIndex
from paged_kv_lab.fleet.router import Decision, FleetRequest, ReplicaView, make_router


class Routing:
    """Invariant: a request's prompt load and blocks are in the bookkeeping of the replica it was
    routed to from its routing until the replica answers (first token; finished)."""

    def __init__(self, num_replicas: int, policy: str, router_overrides: Optional[dict] = None):
        self.policy = policy
        self.router = make_router(policy, router_overrides)
        self.index = GlobalIndex(num_replicas)
        self._prefill: list[dict[str, int]] = [{} for _ in range(num_replicas)]
        self._active: list[dict[str, tuple[str, ...]]] = [{} for _ in range(num_replicas)]
        self._active_count: list[Counter] = [Counter() for _ in range(num_replicas)]

    def _settle(self, r) -> None:
        """Drop from the router's own bookkeeping what the replica has answered: the prompt load
        of requests that sampled their first token, the blocks of requests that finished (as
        Dynamo's router hears them on the response path)."""
        inbox = {q.request_id for q in r.inbox}
        reqs = r.scheduler.requests
        pending = self._prefill[r.index]
        for rid in list(pending):
            req = reqs.get(rid)
            if rid in inbox or (req is not None and not req.num_output_tokens):
                continue
            del pending[rid]
        active, count = self._active[r.index], self._active_count[r.index]
        for rid in list(active):
            if rid in inbox or rid in reqs:
                continue
            for key in active.pop(rid):
                count[key] -= 1
                if not count[key]:
                    del count[key]

    @staticmethod
    def _block_keys(fr: FleetRequest) -> tuple[str, ...]:
        """The request's blocks as Dynamo's active-block tracking names them (its full blocks'
        hashes, shared with other requests; a partial last block its own)."""
        tail = (f"{fr.request_id}:tail",) if fr.num_prompt_tokens % fr.block_size else ()
        return fr.block_hashes + tail

    def views(self, replicas: Sequence, fr: FleetRequest) -> list[ReplicaView]:
        views = []
        keys = self._block_keys(fr)
        for r in replicas:
            self._settle(r)
            running, waiting = r.scheduler.get_request_counts()
            count = self._active_count[r.index]
            views.append(
                ReplicaView(
                    r.index,
                    self.index.overlap(r.index, fr.block_hashes),
                    running,
                    waiting + len(r.inbox),
                    r.used_blocks(),
                    r.block_pool.num_gpu_blocks - 1,
                    sum(self._prefill[r.index].values()),
                    len(self.index.blocks(r.index)),
                    len(count),
                    sum(1 for k in keys if k not in count),
                )
            )
        return views

    def decide(self, replicas: Sequence, fr: FleetRequest) -> Decision:
        """Ask the policy; book the request on the replica it chose."""
        views = self.views(replicas, fr)
        decision = self.router.choose(fr, views)
        j = decision.replica
        credit = views[j].overlap_blocks * fr.block_size
        self._prefill[j][fr.request_id] = max(fr.num_prompt_tokens - credit, 0)
        keys = self._block_keys(fr)
        self._active[j][fr.request_id] = keys
        self._active_count[j].update(keys)
        return decision
