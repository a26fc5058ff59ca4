"""Parallel sampling (``n > 1``) as vLLM v1 does it: fan-out into child requests, no copy-on-write.

vLLM v1 never gives the scheduler a request with ``n > 1``. At arrival the engine makes a
``ParentRequest`` and adds ``n`` ordinary child requests, in index order, with ids
``"0_<id>"``, ``"1_<id>"``, ... and ``n = 1`` each; with a seed, child ``i`` samples with
``seed + i``. Nothing else connects the children: they share the prompt's K/V only because
they have the same prompt, through the prefix cache. Child 0 is scheduled first and its
allocation caches its full prompt blocks; children 1.. then hit those blocks in the same
``schedule()`` pass (``touch`` -> ref_cnt n) and compute only their last, partial block,
which each owns. No block is ever written by two requests, so nothing is copied on write
(vLLM V0's block manager forked sequences and copied a shared block before writing it).

The parent exists only on the output side: :func:`group_outputs` gathers each child's
output under its parent, ordered by child index, like vLLM's ``RequestOutput.outputs``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Optional, TypeVar

# A request as sent (the scenario's RequestSpec: a dataclass with ``id``, ``n`` and ``seed``).
RequestSpec = TypeVar("RequestSpec")


@dataclass(frozen=True)
class ParentRequest:
    """One request with ``n`` children. Invariant: ``child_request_ids[i] == f"{i}_{request_id}"``
    and child ``i`` samples with ``seed + i`` (greedy / the engine's seed when ``seed`` is None)."""

    request_id: str
    n: int
    seed: Optional[int] = None

    def child_request_id(self, index: int) -> str:
        return f"{index}_{self.request_id}"

    @property
    def child_request_ids(self) -> tuple[str, ...]:
        return tuple(self.child_request_id(i) for i in range(self.n))

    def child_seed(self, index: int) -> Optional[int]:
        return None if self.seed is None else self.seed + index

    def child_specs(self, spec: RequestSpec) -> tuple[RequestSpec, ...]:
        """The children, in the order they are added to the scheduler."""
        return tuple(
            replace(spec, id=self.child_request_id(i), n=1, seed=self.child_seed(i))
            for i in range(self.n)
        )


def fan_out(spec: RequestSpec) -> tuple[Optional[ParentRequest], tuple[RequestSpec, ...]]:
    """``(parent, the requests the scheduler gets)``: ``(None, (spec,))`` when ``n == 1``."""
    if spec.n == 1:
        return None, (spec,)
    parent = ParentRequest(spec.id, spec.n, spec.seed)
    return parent, parent.child_specs(spec)


def scheduled_request_ids(specs: Iterable[RequestSpec]) -> list[str]:
    """Every id the scheduler will see for these specs (children instead of their parents)."""
    return [c.id for s in specs for c in fan_out(s)[1]]


def parent_groups(parents: Iterable[ParentRequest]) -> dict[str, list[str]]:
    """parent id -> its child ids in index order (the trace's ``parents`` entry)."""
    return {p.request_id: list(p.child_request_ids) for p in parents}


def scenario_parents(specs: Iterable[RequestSpec], present: Iterable[str]) -> dict[str, list[str]]:
    """parent id -> child ids for the specs with n > 1 whose children are among ``present``
    (the request ids a run has outputs for)."""
    have = set(present)
    return {
        p.request_id: list(p.child_request_ids)
        for p in (fan_out(s)[0] for s in specs)
        if p is not None and p.child_request_ids[0] in have
    }


def group_outputs(
    outputs: Mapping[str, dict[str, Any]], parents: Mapping[str, list[str]]
) -> dict[str, dict[str, Any]]:
    """Outputs per request as the user sent it: ``{id: {"outputs": [...], "finished": bool}}``.

    ``outputs`` maps the scheduler's request ids to their output (``Engine.outputs()``);
    ``parents`` maps parent ids to child ids. Each completion carries its ``index`` and the
    ``request_id`` it ran under; a request with ``n == 1`` is a group of one (index 0).
    A group is finished once every child is.
    """
    child_of = {c: (p, i) for p, kids in parents.items() for i, c in enumerate(kids)}
    groups: dict[str, dict[str, Any]] = {}
    for rid, out in outputs.items():
        pid, index = child_of.get(rid, (rid, 0))
        groups.setdefault(pid, {"outputs": []})["outputs"].append(
            {"index": index, "request_id": rid, **out}
        )
    for g in groups.values():
        g["outputs"].sort(key=lambda o: o["index"])
        g["finished"] = all(o.get("finish_reason") is not None for o in g["outputs"])
    return groups
