"""The runner's step inputs (kvcore/worker/gpu/input_batch.py: InputBatch, vLLM's names; built by
GPUModelRunner.prepare_inputs, a method of the runner as in vLLM 0.34.0) and their place in the
step record."""

from __future__ import annotations

import pytest

from kvcore.worker.gpu.input_batch import InputBatch, SeqBatchItem
from kvcore.worker.gpu.model_runner import GPUModelRunner
from paged_kv_lab.run import trace_file as trace
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario


@pytest.fixture
def runner(tiny_model):
    """A runner of 10 blocks of 4 tokens over the tiny model (4 layers), with the given
    groups' windows: the first two layers in group 0, the last two in the last group."""
    made = {}

    def make(windows):
        key = tuple(windows)
        if key not in made:
            layer_group = [0, 0, len(windows) - 1, len(windows) - 1]
            made[key] = GPUModelRunner(
                tiny_model, 10, 4, layer_group=layer_group, group_sliding_window=windows
            )
        return made[key]

    return make


def test_prepare_inputs_lays_out_two_requests_and_two_groups(runner):
    # A: a 5-token prefill chunk from position 3 (blocks of 4); B: one decode token at position 9.
    # Group 1 slides with W = 4: B (sees positions 6..9) has logical block 0 out of its window
    # (null).
    a = SeqBatchItem("A", [11, 12, 13, 14, 15], 3, ([7, 2, 9], [7, 2, 9]), sample=False)
    b = SeqBatchItem("B", [21], 9, ([4, 5, 6], [0, 5, 8]), sample=True)
    mi = runner([None, 4]).prepare_inputs([a, b])
    assert mi.req_ids == ("A", "B")
    assert mi.input_ids == (11, 12, 13, 14, 15, 21)
    assert mi.positions == (3, 4, 5, 6, 7, 9)
    assert mi.query_start_loc == (0, 5, 6)
    assert mi.seq_lens == (8, 10)
    assert mi.logits_indices == (5,) and mi.sample_req_ids == ("B",)
    # slot = block_table[pos // 4] * 4 + pos % 4
    assert mi.slot_mapping[0] == (7 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 2 * 4 + 2, 2 * 4 + 3, 6 * 4 + 1)
    assert mi.slot_mapping[1][-1] == 8 * 4 + 1
    assert mi.block_table == (((7, 2, 9), (4, 5, 6)), ((7, 2, 9), (0, 5, 8)))
    assert mi.slots_of("A", 0) == mi.slot_mapping[0][:5] and mi.positions_of("B") == (9,)
    assert (mi.num_reqs, mi.num_actual_tokens, mi.max_query_len, mi.max_seq_len) == (2, 6, 5, 10)
    assert InputBatch.from_dict(mi.to_dict()) == mi


def test_prepare_attn_then_build_attn_metadata_give_one_metadata_per_group(runner):
    # vLLM's order: the runner's prepare_attn (tables and slots), then attn_utils'
    # build_attn_metadata (one CommonAttentionMetadata per KV cache group)
    import torch

    from kvcore.worker.gpu.attn_utils import build_attn_metadata

    a = SeqBatchItem("A", [11, 12, 13, 14, 15], 3, ([7, 2, 9, 3], [7, 2, 9, 3]), sample=False)
    b = SeqBatchItem("B", [21], 9, ([4, 5, 6], [0, 5, 8]), sample=True)
    r = runner([None, 4])
    mi = r.prepare_inputs([a, b])
    block_tables, slot_mappings = r.prepare_attn(mi)
    # B's shorter table is padded with the null block 0
    assert [t.tolist() for t in block_tables] == [
        [[7, 2, 9, 3], [4, 5, 6, 0]],
        [[7, 2, 9, 3], [0, 5, 8, 0]],
    ]
    assert slot_mappings.tolist() == [list(g) for g in mi.slot_mapping]
    metadata = build_attn_metadata(
        num_reqs=mi.num_reqs,
        num_tokens=mi.num_actual_tokens,
        query_start_loc=torch.tensor(mi.query_start_loc),
        max_query_len=mi.max_query_len,
        seq_lens=torch.tensor(mi.seq_lens),
        max_seq_len=mi.max_seq_len,
        block_tables=block_tables,
        slot_mappings=slot_mappings,
    )
    assert len(metadata) == 2
    for g, md in enumerate(metadata):
        assert md.block_table_tensor is block_tables[g]
        assert md.slot_mapping.tolist() == list(mi.slot_mapping[g])
        assert (md.num_reqs, md.num_actual_tokens, md.max_query_len, md.max_seq_len) == (
            2,
            6,
            5,
            10,
        )
        assert md.query_start_loc.tolist() == [0, 5, 6] and md.seq_lens.tolist() == [8, 10]


@pytest.mark.parametrize(
    "item, windows, message",
    [
        (
            SeqBatchItem("A", [1, 2], 0, ([0],), True),
            [None],
            "null block in a full-attention table",
        ),
        (
            SeqBatchItem("A", [1], 8, ([1, 0, 3],), True),
            [6],
            "null block inside the sliding window",
        ),
        (
            SeqBatchItem("A", [1], 4, ([1],), True),
            [None],
            "has 1 entries but the step needs logical block 1",
        ),
        (
            SeqBatchItem("A", [1], 0, ([12],), True),
            [None],
            "block id 12 is outside the pool of 10 blocks",
        ),
        (SeqBatchItem("A", [], 0, ([1],), True), [None], "no tokens to feed"),
        (
            SeqBatchItem("A", [1], 0, ([1], [1]), True),
            [None],
            "2 block tables for 1 KV cache groups",
        ),
    ],
)
def test_prepare_inputs_names_the_request_and_the_problem(runner, item, windows, message):
    with pytest.raises(ValueError, match=message) as refused:
        runner(windows).prepare_inputs([item])
    assert "'A'" in str(refused.value)


def test_prepare_inputs_refuses_a_request_twice(runner):
    it = SeqBatchItem("A", [1], 0, ([1],), True)
    with pytest.raises(ValueError, match="twice"):
        runner([None]).prepare_inputs([it, it])


def _scenario(**engine) -> Scenario:
    return Scenario(
        model="tiny-random",
        device="cpu",
        engine=EngineSettings(
            **{"block_size": 4, "num_gpu_blocks": 40, "max_num_batched_tokens": 8, **engine}
        ),
        requests=(
            RequestSpec("A", prompt_token_ids=tuple(range(5, 19)), max_tokens=4),
            RequestSpec("B", prompt_token_ids=tuple(range(5, 15)), max_tokens=3, arrival_step=1),
        ),
    )


@pytest.mark.parametrize("engine", [{}, {"sliding_window": 6}], ids=["full", "sliding"])
def test_engine_records_the_runners_inputs(tiny_model, engine):
    """Each record's slot_mapping is what the block tables after the step say, token by token,
    for exactly the tokens the scheduler scheduled; the trace carries it."""
    eng = Engine(_scenario(**engine), model=tiny_model)
    records = eng.run()
    assert records and all(r.model_inputs is not None for r in records if r.scheduled)
    bs = eng.settings.block_size
    for rec in records:
        mi = rec.model_inputs
        assert (
            dict(
                zip(mi.req_ids, (b - a for a, b in zip(mi.query_start_loc, mi.query_start_loc[1:])))
            )
            == rec.scheduled
        )
        for rid in mi.req_ids:
            view = rec.snapshot.request(rid)
            positions = mi.positions_of(rid)
            assert positions[-1] + 1 == mi.seq_lens[mi.req_ids.index(rid)]
            for g, table in enumerate(view.block_tables):
                if view.status.startswith("finished"):
                    continue  # its blocks were freed at the end of the step
                assert mi.slots_of(rid, g) == tuple(table[p // bs] * bs + p % bs for p in positions)
    back = trace.read_trace("\n".join(trace.step_line(r) for r in records))
    assert [r.model_inputs for r in back.records] == [r.model_inputs for r in records]
