"""The Recorder's queue positions (where a revived block stood in the free queue) equal a walk of
the queue, over random sequences of pool operations; it keeps them without walking."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.core.block_pool import BlockPool
from paged_kv_lab.recording import events
from paged_kv_lab.recording.recorder import Recorder
from support.kv import make_request

BS = 2


def walked_positions(pool, ids):
    order = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    return tuple(order.index(i) for i in ids)


ops = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "touch", "cache"]), st.integers(0, 10**6)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, n=st.integers(3, 24), legacy=st.booleans())
def test_touched_queue_positions_equal_a_walk_of_the_queue(ops, n, legacy):
    pool = BlockPool(n, True, BS, True, free_order="legacy" if legacy else "v0.33")
    rec = Recorder().attach_block_pool(pool)
    held: list = []  # blocks with ref_cnt > 0
    k = 0
    for op, r in ops:
        if op == "alloc" and pool.get_num_free_blocks():
            held += pool.get_new_blocks(1 + r % pool.get_num_free_blocks())
        elif op == "free" and held:
            i = r % len(held)
            chunk, held[:] = held[i : i + 1 + r % 3], held[:i] + held[i + 1 + r % 3 :]
            pool.free_blocks(list(reversed(chunk)))
        elif op == "cache" and held:
            b = held[r % len(held)]
            if b.block_hash is None:
                k += 1
                req = make_request(f"r{k}", [k, k + 1], BS)
                pool.cache_full_blocks(req, [b], 0, 1, BS, 0)
        elif op == "touch":
            free = pool.free_block_queue.get_all_free_blocks()
            if free:
                picks = list(dict.fromkeys(free[(r + j * 7) % len(free)] for j in range(1 + r % 3)))
                want = walked_positions(pool, [b.block_id for b in picks])
                rec.drain()
                pool.touch(picks)
                (ev,) = [e for e in rec.drain() if e.kind == events.TOUCHED]
                assert ev.queue_positions == want
                held += picks
