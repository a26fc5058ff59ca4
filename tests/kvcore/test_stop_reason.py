"""vLLM 0.33's ``check_stop`` on kvcore's Scheduler: EOS first (no stop_reason), then the
request's stop tokens (``stop_reason`` is the token), then the length cap; a stop token ends the
request even when it is its last allowed token, as in vLLM."""

from kvcore.config.scheduler import SchedulerConfig
from kvcore.core.kv_cache_utils import get_request_block_hasher
from kvcore.core.sched.scheduler import Scheduler
from kvcore.outputs import ModelRunnerOutput
from kvcore.request import Request, RequestStatus
from kvcore.utils.hashing import get_hash_fn_by_name
from support.kv import make_manager


def run_one(req: Request, tokens: list[int]) -> Request:
    sched = Scheduler(SchedulerConfig(), make_manager(10, 4))
    sched.add_request(req)
    for token in tokens:
        out = sched.schedule()
        sched.update_from_output(out, ModelRunnerOutput(["R"], {"R": 0}, [[token]]))
        if req.is_finished():
            break
    return req


def request(max_tokens: int, **kw) -> Request:
    hasher = get_request_block_hasher(4, get_hash_fn_by_name("sha256"))
    return Request("R", list(range(6)), max_tokens, eos_token_ids=(2,), block_hasher=hasher, **kw)


def test_a_stop_token_stops_the_request_and_is_its_stop_reason():
    req = run_one(request(8, stop_token_ids=(50, 51)), [7, 51, 9])
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason == 51
    assert req.output_token_ids == [7, 51]


def test_eos_stops_without_a_stop_reason_and_wins_over_the_length_cap():
    req = run_one(request(2, stop_token_ids=(50,)), [7, 2])
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason is None


def test_a_stop_token_that_is_the_last_allowed_token_is_a_stop_not_a_length_cap():
    req = run_one(request(2, stop_token_ids=(50,)), [7, 50])
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason == 50


def test_without_stop_tokens_the_length_cap_ends_it():
    req = run_one(request(2), [7, 8])
    assert req.status == RequestStatus.FINISHED_LENGTH_CAPPED and req.stop_reason is None
