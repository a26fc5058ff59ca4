"""Random operation sequences keep every invariant (hypothesis RuleBasedStateMachine).

Each example draws engine settings (block size 1..8, small pools, both policies, both free
orders, both admission rules, caching on/off, full / sliding / hybrid groups, every
prefix_cache_retention_interval kind (null, 0, a multiple of the block size), watermark,
max_cache_hit_length, the four hash algorithms and NONE_HASH seeds), then interleaves arrivals of
prompts that share prefixes, engine steps, aborts, evict_blocks and reset_prefix_cache. The engine
runs with debug=True, so check_invariants() runs after every step; the machine also checks it after
every rule, together with the scheduler's own bookkeeping. At the end every request must finish and
the pool must be all free.
"""

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcore.config.scheduler import ADMISSIONS
from kvcore.core.block_pool import FREE_ORDERS
from kvcore.core.sched.request_queue import POLICIES
from kvcore.request import RequestStatus
from kvcore.utils.hashing import HASH_ALGOS
from paged_kv_lab.recording.invariants import InvariantError, check_invariants
from paged_kv_lab.recording.recorder import Recorder
from support.kv import make_engine, make_manager, make_request, spec

_rng = random.Random(1234)
PREFIXES = [
    [],
    [7] * 3,
    [_rng.randrange(50) for _ in range(8)],
    [_rng.randrange(50) for _ in range(16)],
]
PREFIXES.append(PREFIXES[2] + [1, 2, 3, 4, 5])
SUFFIXES = [[], [1], [1, 2], [3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7, 8, 9]]


class KVCacheMachine(RuleBasedStateMachine):
    @initialize(data=st.data())
    def setup(self, data):
        bs = data.draw(st.integers(1, 8), label="block_size")
        mode = data.draw(st.sampled_from(["full", "full", "sliding", "hybrid"]), label="mode")
        window = data.draw(st.integers(1, 12), label="window") if mode != "full" else None
        kw = dict(
            block_size=bs,
            num_gpu_blocks=data.draw(
                st.one_of(st.integers(2, 10), st.integers(2, 24)), label="num_gpu_blocks"
            ),
            max_num_seqs=data.draw(st.integers(1, 4), label="max_num_seqs"),
            max_num_batched_tokens=data.draw(st.integers(1, 32), label="budget"),
            long_prefill_token_threshold=data.draw(
                st.sampled_from([0, 0, 3, 8]), label="threshold"
            ),
            policy=data.draw(st.sampled_from(POLICIES), label="policy"),
            free_order=data.draw(st.sampled_from(FREE_ORDERS), label="free_order"),
            admission=data.draw(st.sampled_from(ADMISSIONS), label="admission"),
            enable_prefix_caching=data.draw(st.booleans(), label="caching"),
            prefix_cache_retention_interval=data.draw(
                st.sampled_from([None, 0] + ([bs, 2 * bs, 3 * bs] if mode != "full" else [])),
                label="retention",
            ),
            watermark=data.draw(st.sampled_from([0.0, 0.0, 0.1, 0.3]), label="watermark"),
            max_cache_hit_length=data.draw(
                st.sampled_from([None, None, 0, 5, 12]), label="max_cache_hit_length"
            ),
            hash_algo=data.draw(st.sampled_from(HASH_ALGOS), label="hash_algo"),
            hash_seed=data.draw(
                st.sampled_from(["vllm-none-hash", "another seed", None]), label="hash_seed"
            ),
            sliding_window=window,
            layer_types=("full_attention", "sliding_attention") if mode == "hybrid" else None,
        )
        self.kw = kw
        self.eng = make_engine([], debug=True, **kw)
        self.n = 0
        self.steps = 0

    # -- rules -------------------------------------------------------------------------------------
    @rule(data=st.data(), k=st.integers(1, 3))
    def add_requests(self, data, k):
        for _ in range(k):
            prefix = data.draw(st.sampled_from(PREFIXES))
            suffix = data.draw(
                st.one_of(st.sampled_from(SUFFIXES), st.lists(st.integers(0, 5), max_size=10))
            )
            if not prefix + suffix:
                suffix = [0]
            rid = f"r{self.n}"
            self.n += 1
            s = spec(
                rid,
                prefix + suffix,
                max_tokens=data.draw(st.integers(1, 12)),
                priority=data.draw(st.integers(0, 3)),
                cache_salt=data.draw(st.sampled_from([None, None, None, "", "salt-a"])),
            )
            try:
                self.eng.add_request(s)
            except ValueError as e:
                assert "usable blocks" in str(e)
                assert rid not in self.eng.scheduler.requests

    @rule()
    def step(self):
        self._step()

    @rule(n=st.integers(2, 8))
    def steps(self, n):
        for _ in range(n):
            self._step()

    @precondition(
        lambda self: any(not r.is_finished() for r in self.eng.scheduler.requests.values())
    )
    @rule(data=st.data())
    def abort(self, data):
        live = sorted(rid for rid, r in self.eng.scheduler.requests.items() if not r.is_finished())
        rid = data.draw(st.sampled_from(live))
        self.eng.scheduler.abort_request(rid)
        assert self.eng.requests[rid].status == RequestStatus.FINISHED_ABORTED
        assert rid not in self.eng.scheduler.requests

    @rule(data=st.data())
    def evict_blocks(self, data):
        n = self.kw["num_gpu_blocks"]
        self.eng.evict_blocks(data.draw(st.sets(st.integers(0, n - 1), max_size=3)))

    @rule(go=st.integers(0, 3))
    def reset_prefix_cache(self, go):
        if go:
            return  # keep resets rare so that hits can build up
        pool = self.eng.kv_cache_manager.block_pool
        all_free = pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
        assert self.eng.reset_prefix_cache() is all_free
        if all_free:
            assert all(b.block_hash is None for b in pool.blocks)

    # -- checks ------------------------------------------------------------------------------------
    def _step(self):
        rec = self.eng.step()  # debug=True: check_invariants() inside
        self.steps += 1
        total = sum(rec.scheduled.values())
        assert total <= self.kw["max_num_batched_tokens"]
        thr = self.kw["long_prefill_token_threshold"]
        if thr and len(rec.scheduled) > 1:  # the cap only applies with more than one request
            assert all(n <= thr for n in rec.scheduled.values())
        stats = self.eng.kv_cache_manager.prefix_cache_totals
        assert (
            0 <= stats.hits <= stats.queries
            and 0 <= stats.preempted_hits <= stats.preempted_queries
        )
        cap = self.kw["max_cache_hit_length"]
        if cap is not None:
            assert stats.hits + stats.preempted_hits <= cap * (
                stats.requests + stats.preempted_requests
            )
        assert rec.snapshot.num_free_blocks == len(rec.snapshot.free_queue)
        return rec

    @invariant()
    def invariants_hold(self):
        eng = self.eng
        check_invariants(
            eng.kv_cache_manager, eng.hash_fn, eng.scheduler.requests, eng.hasher.none_hash
        )
        sched = eng.scheduler
        # as vLLM: a finished request has left the scheduler (the recording keeps it)
        assert not sched.finished_req_ids & set(sched.requests)
        assert all(eng.requests[rid].is_finished() for rid in sched.finished_req_ids)
        running = {r.request_id for r in sched.running}
        waiting = [
            r.request_id
            for q in (sched.kv_holding_waiting, sched.waiting, sched.async_kv_waiting)
            for r in q.ordered()
        ]
        # every waiting request is in exactly one of the three queues
        assert len(waiting) == len(set(waiting))
        waiting = set(waiting)
        assert len(sched.running) == len(running) <= self.kw["max_num_seqs"]
        assert not running & waiting
        bs = self.kw["block_size"]
        for m in eng.kv_cache_manager.coordinator.single_type_managers:
            assert set(m.req_to_blocks) <= running | {
                rid for rid, tbl in m.req_to_blocks.items() if not tbl
            }
        for rid, r in sched.requests.items():
            tables = eng.kv_cache_manager.get_block_ids(rid)
            if rid in running:
                assert r.status == RequestStatus.RUNNING
                assert 0 < r.num_computed_tokens <= r.num_tokens
                assert all(len(t) * bs >= r.num_computed_tokens for t in tables)
            elif rid in waiting:
                assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
                assert r.num_computed_tokens == 0 and not any(tables)
            else:
                assert r.is_finished() and not any(tables)
            assert r.num_output_tokens <= r.max_tokens

    def teardown(self):
        eng = getattr(self, "eng", None)
        if eng is None:
            return
        # Each request needs at most ~45 token slots; 100 steps each is ample even with a
        # budget of 1 token per step and preemptions (observed: under 20 per request).
        unfinished = sum(1 for r in eng.scheduler.requests.values() if not r.is_finished())
        for _ in range(200 + 100 * unfinished):
            if not eng.has_unfinished():
                break
            self._step()
        assert not eng.has_unfinished(), "requests never finished"
        assert all(r.is_finished() for r in eng.scheduler.requests.values())
        for r in eng.scheduler.requests.values():
            if r.status == RequestStatus.FINISHED_LENGTH_CAPPED:
                assert r.num_output_tokens == r.max_tokens
        pool = eng.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
        assert all(b.ref_cnt == 0 for b in pool.blocks if not b.is_null)
        assert pool.get_usage() == 0.0
        assert eng.reset_prefix_cache() is True
        check_invariants(
            eng.kv_cache_manager, eng.hash_fn, eng.scheduler.requests, eng.hasher.none_hash
        )


KVCacheMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestKVCacheMachine = KVCacheMachine.TestCase


# -- the checker itself catches broken states ------------------------------------------------------
def _populated():
    kvm = make_manager(8, 2, recorder=Recorder())  # the recorder keeps what each hash stands for
    a = make_request("a", [1, 2, 3, 4, 5], 2)
    hits, n, _ = kvm.get_computed_blocks(a)
    kvm.allocate_slots(a, 5, n, hits)
    return kvm, {"a": a}


def test_check_invariants_accepts_a_sound_state():
    kvm, reqs = _populated()
    from kvcore.utils.hashing import get_hash_fn_by_name

    check_invariants(kvm, get_hash_fn_by_name("sha256"), reqs)


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda kvm: setattr(kvm.block_pool.blocks[1], "ref_cnt", 2), "ref_cnt 2 but held by 1"),
        (
            lambda kvm: kvm.block_pool.free_block_queue.append(kvm.block_pool.blocks[1]),
            "free queue",
        ),
        (
            lambda kvm: setattr(kvm.block_pool.free_block_queue, "num_free_blocks", 9),
            "num_free_blocks is 9",
        ),
        (
            lambda kvm: setattr(
                kvm.block_pool.blocks[2], "block_hash", kvm.block_pool.blocks[1].block_hash
            ),
            "hash map entry|carries a hash that the map does not list",
        ),
        (
            lambda kvm: kvm.block_pool.free_block_queue.prepend_n([kvm.block_pool.null_block]),
            "null block",
        ),
        (lambda kvm: kvm.coordinator.single_type_managers[0].req_to_blocks["a"].pop(), "held by 0"),
    ],
)
def test_check_invariants_rejects_broken_states(corrupt, message):
    kvm, reqs = _populated()
    from kvcore.utils.hashing import get_hash_fn_by_name

    corrupt(kvm)
    with pytest.raises(InvariantError, match=message):
        check_invariants(kvm, get_hash_fn_by_name("sha256"), reqs)


def test_check_invariants_rejects_a_hash_that_does_not_match_its_tokens():
    kvm, reqs = _populated()
    from kvcore.utils.hashing import get_hash_fn_by_name

    meta = kvm.block_pool.observer.hash_meta
    raw = next(iter(meta))
    meta[raw].token_ids = (99, 99)
    with pytest.raises(InvariantError, match="does not match its parent and tokens"):
        check_invariants(kvm, get_hash_fn_by_name("sha256"), reqs)
