"""A router and what it knows: the policy, its global index fed by KV events, and its own
bookkeeping of the requests it routed (Dynamo's: prompt load still to prefill, blocks in flight).

The fleet (fleet/fleet.py) keeps one. A replica, to the router, is its position in the fleet
and what fleet/fleet.py's ``Replica`` protocol lets it read: its ``scheduler`` (vLLM's queues
and requests), its ``block_pool`` (how many blocks are in use) and ``queued()`` (the requests
routed there and not yet in its scheduler).
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

    def _settle(self, i: int, r) -> None:
        """Drop from the router's own bookkeeping what replica ``i`` has answered: the prompt
        load of requests that sampled their first token, the blocks of requests that finished
        (as Dynamo's router hears them on the response path)."""
        inbox = set(r.queued())
        reqs = r.scheduler.requests
        pending = self._prefill[i]
        for rid in list(pending):
            req = reqs.get(rid)
            if rid in inbox or (req is not None and not req.num_output_tokens):
                continue
            del pending[rid]
        active, count = self._active[i], self._active_count[i]
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
        for i, r in enumerate(replicas):
            self._settle(i, r)
            running, waiting = r.scheduler.get_request_counts()
            count = self._active_count[i]
            pool = r.block_pool
            usable = pool.num_gpu_blocks - 1
            views.append(
                ReplicaView(
                    i,
                    self.index.overlap(i, fr.block_hashes),
                    running,
                    waiting + len(r.queued()),
                    usable - pool.get_num_free_blocks(),
                    usable,
                    sum(self._prefill[i].values()),
                    len(self.index.blocks(i)),
                    len(count),
                    len(keys) - sum(map(count.__contains__, keys)),  # those not in count
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
