"""The scheduler's KV connector seam: any object with vLLM 0.33's ``KVConnectorBase_V1``
scheduler-side methods plugs in (it need not subclass kvcore's base), and the scheduler calls them
where 0.33's Scheduler does: ``bind_kv_cache_manager`` once, ``on_new_request`` on arrival,
``get_num_new_matched_tokens`` / ``update_state_after_alloc`` on admission,
``build_connector_meta`` per step, ``update_connector_output`` after it, ``request_finished`` (one
group, no ``request_finished_all_groups``) when a request finishes; a connector that keeps the
blocks (``True``) frees them when it reports the request in ``finished_sending``."""

from __future__ import annotations

from kvcore.config.scheduler import SchedulerConfig
from kvcore.core.sched.scheduler import Scheduler
from kvcore.outputs import KVConnectorOutput, ModelRunnerOutput
from kvcore.request import RequestStatus
from support.kv import make_manager, make_request


class PushConnector:
    """A producer in the manner of vLLM's P/D connectors: nothing to load, every finished
    request's blocks are sent out before they may be freed. Logs every call."""

    def __init__(self, num_external: int = 0, load_async: bool = False) -> None:
        self.calls: list[tuple] = []
        self.num_external, self.load_async = num_external, load_async

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        self.calls.append(("bind_kv_cache_manager",))

    def on_new_request(self, request) -> None:
        self.calls.append(("on_new_request", request.request_id))

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.calls.append(("get_num_new_matched_tokens", request.request_id, num_computed_tokens))
        return self.num_external, self.load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens) -> None:
        self.calls.append(("update_state_after_alloc", request.request_id, num_external_tokens))

    def build_connector_meta(self, scheduler_output):
        self.calls.append(("build_connector_meta", sorted(scheduler_output.num_scheduled_tokens)))
        return object()

    def update_connector_output(self, connector_output) -> None:
        self.calls.append(("update_connector_output",))

    def request_finished(self, request, block_ids):
        self.calls.append(("request_finished", request.request_id, list(block_ids)))
        return True, {"remote_block_ids": list(block_ids)}

    def has_pending_push_work(self) -> bool:
        return False


def step(sched, out, tokens, kv_out=None):
    rids = list(out.num_scheduled_tokens)
    return sched.update_from_output(
        out,
        ModelRunnerOutput(rids, {r: i for i, r in enumerate(rids)}, tokens, kv_out),
    )


def test_a_duck_typed_connector_is_called_where_vllm_calls_it_and_holds_the_blocks():
    kvm = make_manager(10, 4)
    conn = PushConnector()
    sched = Scheduler(SchedulerConfig(), kvm, conn)
    req = make_request("P", range(10), 4, max_tokens=1)
    sched.add_request(req)
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"P": 10}
    table = list(kvm.get_block_ids("P")[0])
    assert step(sched, out, [[5]], KVConnectorOutput()) == ["P"]
    assert [c[0] for c in conn.calls] == [
        "bind_kv_cache_manager",
        "on_new_request",
        "get_num_new_matched_tokens",
        "update_state_after_alloc",
        "build_connector_meta",
        "request_finished",
        "update_connector_output",
    ]
    # the blocks of the computed tokens only, and they stay held until the send is reported
    assert conn.calls[5] == ("request_finished", "P", table)
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert "P" in sched.requests and sched.has_requests() and sched.has_finished_requests()
    free_before = kvm.block_pool.get_num_free_blocks()
    out = sched.schedule()
    assert out.finished_req_ids == {"P"} and not out.num_scheduled_tokens
    step(sched, out, [], KVConnectorOutput(finished_sending={"P"}))
    assert "P" not in sched.requests and not sched.has_requests()
    assert kvm.block_pool.get_num_free_blocks() == free_before + len(table)


def test_an_aborted_request_still_loading_frees_its_blocks_when_the_load_reports():
    kvm = make_manager(10, 4)
    conn = PushConnector(num_external=8, load_async=True)
    sched = Scheduler(SchedulerConfig(), kvm, conn, kv_load_failure_policy="recompute")
    sched.add_request(make_request("D", range(12), 4, max_tokens=2))
    out = sched.schedule()
    assert not out.num_scheduled_tokens  # this step only loads
    req = sched.requests["D"]
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    held = kvm.block_pool.get_num_free_blocks()
    sched.abort_request("D")
    assert "D" in sched.requests and kvm.block_pool.get_num_free_blocks() == held
    step(sched, out, [], KVConnectorOutput(finished_recving={"D"}))
    assert "D" not in sched.requests and kvm.block_pool.get_num_free_blocks() > held


def test_a_load_failure_named_by_request_recomputes_from_nothing():
    kvm = make_manager(10, 4)
    conn = PushConnector(num_external=8, load_async=True)
    sched = Scheduler(SchedulerConfig(), kvm, conn, kv_load_failure_policy="recompute")
    sched.add_request(make_request("D", range(12), 4, max_tokens=2))
    out = sched.schedule()
    conn.num_external, conn.load_async = 0, False  # the retry's lookup finds nothing remote
    step(sched, out, [], KVConnectorOutput(finished_recving={"D"}, failed_recving={"D"}))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"D": 12}
    assert conn.calls.count(("get_num_new_matched_tokens", "D", 0)) == 2
