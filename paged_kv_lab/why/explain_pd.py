""" "Why?" on a P/D pair's run (paged_kv_lab/disagg/pd.py): a block or a request of either replica,
answered from the recorded steps up to the last one read (each names its replica and its pulls).

A block's answer starts from its part at that step (disagg/pd.py: ``pair_at``): kept for a
transfer on the prefill replica, waiting uncached for its K/V on the decode replica, read or
filled by the step's pull, a failed pull, or an ordinary state; it then says where that began
and what ends it, with the vLLM functions that decide it (names of why.source_links.FUNCTIONS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from paged_kv_lab.disagg.pd import DECODE, PREFILL, REPLICAS, pair_at
from paged_kv_lab.recording.snapshot import StepRecord
from paged_kv_lab.text.i18n import Text
from paged_kv_lab.why.explain import ExplainError, RecordedSteps

# the vLLM functions behind each answer, by the part it explains
SOURCES = {
    "kept": ("request_finished", "_update_from_kv_xfer_finished"),
    "pull_from": ("request_finished", "_update_from_kv_xfer_finished"),
    "delayed": ("allocate_slots", "_update_waiting_for_remote_kv"),
    "pull_into": ("allocate_slots", "_update_waiting_for_remote_kv"),
    "failed": ("_update_waiting_for_remote_kv", "_handle_invalid_blocks"),
    "loaded": ("_update_waiting_for_remote_kv",),
}


@dataclass(frozen=True)
class PDAnswer:
    """An answer: its sentences (catalogue Texts) and the vLLM functions that decide what they
    say (names of why.source_links.FUNCTIONS; empty for an answer about an ordinary state)."""

    texts: tuple[Text, ...]
    sources: tuple[str, ...] = ()


def _replica_records(steps: RecordedSteps) -> list[StepRecord]:
    records = list(steps.records)
    if not any(r.replica for r in records):
        raise ExplainError(Text("why.pd.not_pd"))
    return records


def _pull_of(records: list[StepRecord], replica: str, block_id: int, rid: Optional[str] = None):
    """The last pull that read (prefill) or filled (decode) ``block_id``: (step, request, the
    other side's block id), or None."""
    side = 0 if replica == PREFILL else 1
    for r in reversed(records):
        for req, pair in r.pulls.items():
            if (rid is None or req == rid) and block_id in pair[side]:
                return r.step, req, pair[1 - side][pair[side].index(block_id)]
    return None


def _first(records: list[StepRecord], replica: str, kind: str, rid: str, block_id=None):
    """The first step of ``replica`` with an event ``kind`` of ``rid`` (naming ``block_id``, when
    given)."""
    for r in records:
        if r.replica != replica:
            continue
        for e in r.events:
            if e.kind == kind and e.request_id == rid:
                if block_id is None or block_id in e.block_ids:
                    return r.step
    return None


def explain_pd_block(steps: RecordedSteps, replica: str, block_id: int) -> PDAnswer:
    """Why ``block_id`` of ``replica`` is as it is at the last step read."""
    records = _replica_records(steps)
    if replica not in REPLICAS:
        raise ExplainError(Text("why.pd.not_pd"))
    view = pair_at(steps.initial, records, records[-1].step)
    cell = next((b for b in view.blocks[replica] if b.block_id == block_id), None)
    if cell is None:
        last = len(view.blocks[replica])
        raise ExplainError(Text("why.error.no_block", {"b": block_id, "last": last}))
    where = Text(f"pd.replica.{replica}")
    base = {"block": block_id, "replica": where, "step": view.as_of[replica]}
    owners = list(cell.owners)
    rid = owners[0] if owners else ""
    part = cell.part
    texts: list[Text] = []
    if part in ("kept", "pull_from"):
        finished = _first(records, PREFILL, "finished", rid)
        texts.append(Text("why.pd.kept", {**base, "req": rid, "finished": finished}))
        pull = _pull_of(records, PREFILL, block_id, rid)
        failed = _first(records, DECODE, "kv_load_failed", rid)
        if pull is not None:
            texts.append(Text("why.pd.kept_read", {**base, "pull": pull[0], "paired": pull[2]}))
        elif failed is not None:
            texts.append(Text("why.pd.kept_failed", {**base, "req": rid, "failed": failed}))
        else:
            texts.append(Text("why.pd.kept_waiting", {**base, "req": rid}))
    elif part in ("delayed", "pull_into"):
        pull = _pull_of(records, DECODE, block_id, rid)
        fields = {**base, "req": rid}
        if pull is not None:
            fields.update(pull=pull[0], paired=pull[2])
            texts.append(Text("why.pd.delayed", fields))
        else:  # a decode-side hit is not pulled; a block waiting uncached always was
            texts.append(Text("why.pd.delayed_unpaired", fields))
    elif part == "failed":
        failed = _first(records, DECODE, "kv_load_failed", rid, block_id)
        texts.append(Text("why.pd.failed", {**base, "req": rid, "failed": failed}))
    else:
        texts.append(Text(f"why.pd.plain.{part}", {**base, "reqs": ", ".join(owners)}))
        # a block in use that a pull of one of its requests filled: its K/V came from there
        pull = _pull_of(records, DECODE, block_id) if replica == DECODE else None
        if pull is not None and part == "used" and pull[1] in owners:
            cached = _first(records, DECODE, "cached", pull[1], block_id)
            fields = {**base, "req": pull[1], "pull": pull[0], "paired": pull[2]}
            if cached is None:
                texts.append(Text("why.pd.loaded_unhashed", fields))
            else:
                texts.append(Text("why.pd.loaded", {**fields, "cached": cached}))
            part = "loaded"
    return PDAnswer(tuple(texts), SOURCES.get(part, ()))


def explain_pd_request(steps: RecordedSteps, replica: str, rid: str) -> PDAnswer:
    """Where ``rid`` stands on ``replica`` at the last step read, and why."""
    records = _replica_records(steps)
    snap = next(
        (r.snapshot for r in reversed(records) if r.replica == replica),
        None,
    )
    view = next((v for v in (snap.requests if snap else ()) if v.request_id == rid), None)
    where = Text(f"pd.replica.{replica}")
    if view is None:
        return PDAnswer((Text("why.pd.request.absent", {"req": rid, "replica": where}),))
    blocks = [b for t in view.block_tables for b in t]
    fields = {"req": rid, "replica": where, "blocks": blocks, "status": view.status}
    if replica == PREFILL and view.status.startswith("finished") and blocks:
        finished = _first(records, PREFILL, "finished", rid)
        return PDAnswer(
            (Text("why.pd.request.kept", {**fields, "finished": finished}),), SOURCES["kept"]
        )
    if replica == DECODE and view.status == "waiting_for_remote_kvs":
        pull = next(((r.step, r.pulls[rid]) for r in records if rid in r.pulls), None)
        if pull is not None:
            fields.update(pull=pull[0], remote=list(pull[1][0]), local=list(pull[1][1]))
            return PDAnswer((Text("why.pd.request.waiting", fields),), SOURCES["delayed"])
    failed = _first(records, DECODE, "kv_load_failed", rid) if replica == DECODE else None
    if failed is not None:
        conf = steps.settings.kv_transfer_config if steps.settings is not None else None
        policy = conf.kv_load_failure_policy if conf is not None else "fail"
        fields.update(failed=failed)
        return PDAnswer((Text(f"why.pd.request.failed.{policy}", fields),), SOURCES["failed"])
    return PDAnswer((Text("why.pd.request.plain", fields),))
