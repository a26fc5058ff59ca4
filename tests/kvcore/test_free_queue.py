"""FreeKVCacheBlockQueue: the doubly linked free list between two sentinels (vLLM v1
kv_cache_utils)."""

import pytest

from kvcore.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock


def make(n):
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def forward(q):
    return [b.block_id for b in q.get_all_free_blocks()]


def backward(q):
    out, curr = [], q.fake_free_list_tail.prev_free_block
    while curr is not q.fake_free_list_head:
        out.append(curr.block_id)
        curr = curr.prev_free_block
    return out


def assert_consistent(q, expected):
    assert forward(q) == expected
    assert backward(q) == list(reversed(expected))
    assert q.num_free_blocks == len(expected)


def test_init_links_all_blocks_in_order():
    blocks, q = make(5)
    assert_consistent(q, [0, 1, 2, 3, 4])
    assert q.fake_free_list_head.next_free_block is blocks[0]
    assert q.fake_free_list_tail.prev_free_block is blocks[4]
    assert blocks[0].prev_free_block is q.fake_free_list_head


def test_empty_queue():
    _, q = make(0)
    assert_consistent(q, [])
    with pytest.raises(ValueError):
        q.popleft()


def test_popleft_takes_the_head_and_clears_links():
    blocks, q = make(4)
    b = q.popleft()
    assert b is blocks[0]
    assert b.prev_free_block is None and b.next_free_block is None
    assert_consistent(q, [1, 2, 3])


def test_popleft_n_takes_the_first_n_in_order():
    blocks, q = make(6)
    got = q.popleft_n(3)
    assert [b.block_id for b in got] == [0, 1, 2]
    assert all(b.prev_free_block is None and b.next_free_block is None for b in got)
    assert_consistent(q, [3, 4, 5])
    assert q.popleft_n(0) == []
    assert_consistent(q, [3, 4, 5])
    assert [b.block_id for b in q.popleft_n(3)] == [3, 4, 5]
    assert_consistent(q, [])


def test_popleft_n_refuses_more_than_free():
    _, q = make(3)
    with pytest.raises(ValueError, match="only 3 free"):
        q.popleft_n(4)
    assert_consistent(q, [0, 1, 2])


def test_remove_from_the_middle_is_o1_and_keeps_links():
    blocks, q = make(5)
    q.remove(blocks[2])
    assert_consistent(q, [0, 1, 3, 4])
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    q.remove(blocks[0])
    q.remove(blocks[4])
    assert_consistent(q, [1, 3])


def test_remove_a_block_that_is_not_queued_raises():
    blocks, q = make(3)
    q.remove(blocks[1])
    with pytest.raises(RuntimeError, match="not in the free queue"):
        q.remove(blocks[1])
    assert_consistent(q, [0, 2])


def test_append_goes_to_the_tail():
    blocks, q = make(3)
    b0 = q.popleft()
    q.append(b0)
    assert_consistent(q, [1, 2, 0])


def test_append_n_keeps_the_given_order():
    blocks, q = make(5)
    got = q.popleft_n(3)
    q.append_n([got[2], got[0], got[1]])
    assert_consistent(q, [3, 4, 2, 0, 1])
    q.append_n([])
    assert_consistent(q, [3, 4, 2, 0, 1])


def test_prepend_n_puts_blocks_at_the_head_first_one_first():
    blocks, q = make(5)
    got = q.popleft_n(3)  # queue: 3 4
    q.prepend_n([got[2], got[1]])  # 2 becomes the head, then 1
    assert_consistent(q, [2, 1, 3, 4])
    q.prepend_n([])
    assert_consistent(q, [2, 1, 3, 4])


def test_prepend_and_append_into_an_empty_queue():
    blocks, q = make(3)
    got = q.popleft_n(3)
    assert_consistent(q, [])
    q.prepend_n([got[1]])
    assert_consistent(q, [1])
    q.append_n([got[2]])
    q.prepend_n([got[0]])
    assert_consistent(q, [0, 1, 2])


def test_mixed_operations_keep_both_directions_consistent():
    blocks, q = make(8)
    a = q.popleft_n(4)  # 4 5 6 7
    q.remove(blocks[6])  # 4 5 7
    q.append_n([a[3], a[1]])  # 4 5 7 3 1
    q.prepend_n([a[0], a[2]])  # 0 2 4 5 7 3 1
    q.append(blocks[6])  # 0 2 4 5 7 3 1 6
    assert_consistent(q, [0, 2, 4, 5, 7, 3, 1, 6])
    assert q.popleft() is blocks[0]
    assert_consistent(q, [2, 4, 5, 7, 3, 1, 6])


def test_append_n_asserts_the_tail_sentinel_has_a_previous_node_as_vllm():
    blocks = [KVCacheBlock(i) for i in range(3)]
    q = FreeKVCacheBlockQueue(blocks)
    q.append_n([])  # nothing to add: nothing touched
    assert q.num_free_blocks == 3
    q.fake_free_list_tail.prev_free_block = None  # a broken list
    with pytest.raises(AssertionError, match="tail sentinel"):
        q.append_n([KVCacheBlock(9)])
