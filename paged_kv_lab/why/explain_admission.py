"""Admission order over a recorded run: when each request was admitted, how many steps it waited,
and "why was B admitted before A?" answered with vLLM 0.34's cache-aware admission (the
scheduler's ``cache_aware_admission_window``, ``cache_aware_admission_threshold`` and the pool's
usage when the step began).

Computed from the recording only (snapshots and events), as every answer in ``why``. The window
covers the queue vLLM reorders, ``waiting`` alone: a snapshot's ``waiting_queues`` says which
waiting requests sit in ``kv_holding_waiting`` or ``async_kv_waiting`` instead. A reorder is
read from the ``cache_aware_reorder`` event kvcore records when, and only when, it changes the
waiting queue's order: who went ahead of whom, the window, the threshold, the usage it compared
and each request's cached prefix as ``KVCacheManager.get_num_cached_tokens`` probed it. Where no
such event put B ahead of A, the answer says why the window did not: the usage a step began with
is the snapshot before it, and a waiting request's cached prefix then is the longest run of its
block hashes the prefix cache held (the last prompt token is always computed).
``order_sentences`` turns an answer into catalogue sentences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from paged_kv_lab.recording import events as E
from paged_kv_lab.recording.snapshot import Snapshot
from paged_kv_lab.text.i18n import Text, tr
from paged_kv_lab.why.explain import ExplainError, RecordedSteps, request_list

# where vLLM 0.34.0 decides the order the answer explains: (vLLM's file, the name in it), the
# shape of content/sources.py's Source
ADMISSION_SOURCES = (
    ("vllm/config/scheduler.py", "SchedulerConfig.cache_aware_admission_window"),
    ("vllm/config/scheduler.py", "SchedulerConfig.cache_aware_admission_threshold"),
    ("vllm/v1/core/sched/scheduler.py", "Scheduler._reorder_waiting_by_cached_prefix"),
    ("vllm/v1/core/kv_cache_manager.py", "KVCacheManager.get_num_cached_tokens"),
)


@dataclass(frozen=True)
class Admission:
    """One request's first admission: its place in arrival order (from 0), the step it was
    admitted at (None: never), the steps it ended in the waiting queue before that, and the
    prefix-cache hit it was admitted with (tokens)."""

    request_id: str
    arrival_rank: int
    step: Optional[int]
    waiting_steps: int
    hit_tokens: int


def arrival_order(run: RecordedSteps) -> list[str]:
    """The requests in the order they arrived (the engine's arrival step, then the order the
    engine added them)."""
    views = run.request_views()
    return sorted(views, key=lambda rid: (views[rid].arrival, list(views).index(rid)))


def admissions(run: RecordedSteps) -> list[Admission]:
    """Each request's first admission, in arrival order."""
    first: dict[str, tuple[int, int]] = {}
    for rec in run.records:
        for ev in rec.events:
            if ev.kind == E.ADMITTED and ev.request_id not in first:
                first[ev.request_id] = (rec.step, ev.num_cached_tokens)
    out = []
    for rank, rid in enumerate(arrival_order(run)):
        step, hit = first.get(rid, (None, 0))
        waited = sum(
            1
            for rec in run.records
            if (step is None or rec.step < step) and rid in rec.snapshot.waiting
        )
        out.append(Admission(rid, rank, step, waited, hit))
    return out


def cached_tokens_before(run: RecordedSteps, request_id: str, step: int) -> int:
    """How many of the request's prompt tokens the prefix cache held when ``step`` began:
    its leading full-block hashes present then (in the first full-attention group), at most
    the prompt less its last token, as ``get_num_cached_tokens`` counts them."""
    snap = run.snapshot_before(step)
    view = run.request_views().get(request_id)
    if snap is None or view is None or not view.block_hashes:
        return 0
    group, size = run.primary_group(), run.block_size()
    limit = (view.num_prompt_tokens - 1) // size
    n = 0
    for h in view.block_hashes[:limit]:
        if f"{h}@{group}" not in snap.hash_map:
            break
        n += 1
    return n * size


@dataclass(frozen=True)
class OrderAnswer:
    """Why ``second`` was admitted before ``first`` (or was not). ``verdict``:
    "not_before" (it was not admitted first), "arrived_first" (it arrived earlier: arrival
    order, nothing to explain), "reordered" (cache-aware admission moved it ahead), and the
    reasons it was not moved by the window but by something else: "window_off",
    "below_threshold", "outside_window" or "other"."""

    first: str
    second: str
    verdict: str
    step: Optional[int]
    window: int
    threshold: float
    usage: float
    cached_first: int
    cached_second: int
    reorder_step: Optional[int] = None  # "reordered": the step whose reorder put it ahead


def reorder_that_moved(
    run: RecordedSteps, mover: str, passed: str, until: int
) -> Optional[tuple[int, E.CacheAwareReorder]]:
    """The last recorded reorder, at or before step ``until``, in which ``mover`` went ahead of
    ``passed`` (step, event); None if none did."""
    found = None
    for rec in run.records:
        if rec.step > until:
            break
        for ev in rec.events:
            if ev.kind == E.CACHE_AWARE_REORDER and passed in ev.moved_ahead.get(mover, ()):
                found = (rec.step, ev)
    return found


def explain_order(run: RecordedSteps, first: str, second: str) -> OrderAnswer:
    """Why ``second`` was admitted before ``first``: the step it was, the window, the threshold,
    the pool's usage when the step began, and each one's cached prefix then."""
    rows = {a.request_id: a for a in admissions(run)}
    for rid in (first, second):
        if rid not in rows:
            raise ExplainError(
                Text("why.error.no_request", {"rid": rid, "ids": request_list(rows)})
            )
    s = run.settings
    # the window vLLM's Scheduler applies: none under the priority policy or without prefix
    # caching (Scheduler.cache_aware_window), whatever the setting says
    on = s is not None and s.policy == "fcfs" and s.enable_prefix_caching
    window = s.cache_aware_admission_window if on else 0
    threshold = s.cache_aware_admission_threshold if s is not None else 0.5
    a, b = rows[first], rows[second]
    step = b.step
    snap = run.snapshot_before(step) if step is not None else None
    usage = snap.usage if snap is not None else 0.0
    cached_a = cached_tokens_before(run, first, step) if step is not None else 0
    cached_b = cached_tokens_before(run, second, step) if step is not None else 0
    if step is None or (a.step is not None and a.step < step):
        verdict = "not_before"
    elif b.arrival_rank < a.arrival_rank:
        verdict = "arrived_first"
    elif (moved := reorder_that_moved(run, second, first, step)) is not None:
        rstep, ev = moved  # what the scheduler compared when it reordered
        return OrderAnswer(
            first,
            second,
            "reordered",
            step,
            ev.window,
            ev.threshold,
            ev.usage,
            ev.num_cached_tokens.get(first, 0),
            ev.num_cached_tokens.get(second, 0),
            rstep,
        )
    elif not window:
        verdict = "window_off"
    elif usage < threshold:
        verdict = "below_threshold"
    elif snap is not None and not _both_in_window(snap, first, second, window):
        verdict = "outside_window"
    else:
        verdict = "other"
    return OrderAnswer(first, second, verdict, step, window, threshold, usage, cached_a, cached_b)


def _both_in_window(snap: Snapshot, a: str, b: str, window: int) -> bool:
    """Whether both were among the first ``window`` requests of the queue vLLM reorders when the
    step began: ``Scheduler.waiting`` alone (``_reorder_waiting_by_cached_prefix``), not the
    requests in ``kv_holding_waiting`` or ``async_kv_waiting`` (``Snapshot.waiting_queues``),
    which are never in its window. A request that arrived at that step joins behind the queue
    the snapshot shows."""
    queue = [r for r in snap.waiting if snap.queue_of(r) == "waiting"]
    head = queue[:window]
    room = window - len(head)
    return all(r in head or (r not in snap.waiting and room > 0) for r in (a, b))


def order_sentences(x: OrderAnswer, lang: str = "en") -> list[str]:
    """The answer as sentences: what happened, then the settings and the usage it rested on."""
    fields = {
        "a": x.first,
        "b": x.second,
        "step": x.step,
        "window": x.window,
        "threshold": f"{x.threshold:.2f}",
        "usage": f"{x.usage:.2f}",
        "ca": x.cached_first,
        "cb": x.cached_second,
        "rstep": x.reorder_step,
    }
    out = [tr(f"why.order.{x.verdict}", lang, **fields)]
    if x.verdict == "reordered":  # the numbers the scheduler compared, from the recorded reorder
        out.append(tr("why.order.settings.reorder", lang, **fields))
    elif x.verdict != "not_before":
        out.append(tr("why.order.settings", lang, **fields))
    return out


def source_lines(lang: str = "en") -> list[str]:
    """Where vLLM 0.34.0 decides it, one line per source."""
    return [tr("why.order.source", lang, f=f, n=n) for f, n in ADMISSION_SOURCES]
