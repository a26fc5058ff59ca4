"""Helpers a KV connector's scheduler side shares (vLLM 0.34.0:
distributed/kv_transfer/kv_connector/utils.py); kvcore models the one its CPU tier reads."""

from __future__ import annotations

from typing import Iterable, Optional


def yield_req_data(scheduler_output) -> Iterable[tuple[str, Optional[tuple], bool]]:
    """(request id, block ids handed out this step, whether they are the whole table) for every
    request of the step. The whole table comes with every admitted request, new or resumed
    (both in ``scheduled_new_reqs``); a running one brings only this step's additions."""
    for req_data in scheduler_output.scheduled_new_reqs:
        yield req_data.req_id, req_data.block_ids, True
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, block_id_groups in zip(cached.req_ids, cached.new_block_ids):
        yield req_id, block_id_groups, False
