"""Figure builders: pure functions of Snapshots built by hand and by the engine (no model)."""
import json

import plotly.graph_objects as go
import pytest

from kvcore.engine import Engine, NoModelRunner
from kvcore.scenario import load_scenario
from kvcore.snapshot import BlockView, RequestView, Snapshot
from lesson import figures as F
from lesson.figures.common import short_hash

H1, H2, H3 = "a1" * 16, "b2" * 16, "c3" * 16


def hand_snapshot() -> Snapshot:
    """8 blocks, block_size 2: A and B share block 1 (ref 2); block 4 is cached and free at the
    queue tail; block 5 free at the head; B's table starts with a null slot (sliding window)."""
    def blk(i, ref=0, h=None, parent=None, toks=(), q=None, owners=()):
        return BlockView(i, ref, i == 0, h, parent, 0 if h else None, tuple(toks), q, tuple(owners))
    blocks = (
        blk(0),
        blk(1, 2, H1, None, (10, 11), owners=("A", "B")),
        blk(2, 1, H2, H1, (12, 13), owners=("A",)),
        blk(3, 1, None, None, (14,), owners=("A",)),
        blk(4, 0, H3, H1, (20, 21), q=2),
        blk(5, 0, q=0), blk(6, 0, q=1), blk(7, 1, owners=("B",)),
    )
    req = lambda rid, table, prompt, out, comp: RequestView(
        rid, "running", len(prompt), len(out), comp, 0, (tuple(table),), 0, 0, 0, tuple(out), tuple(prompt), "")
    reqs = (req("A", (1, 2, 3), (10, 11, 12, 13), (14,), 5), req("B", (0, 1, 7), (9, 9, 10, 11), (15,), 5))
    return Snapshot(step=3, block_size=2, num_gpu_blocks=8, blocks=blocks, free_queue=(5, 6, 4),
                    hash_map={f"{H1}@0": (1,), f"{H2}@0": (2,), f"{H3}@0": (4,)}, requests=reqs,
                    waiting=(), running=("A", "B"), usage=4 / 7, num_free_blocks=3,
                    prefix_cache={"queries": 8, "hits": 2, "hit_rate": 0.25},
                    groups=({"kind": "full", "sliding_window": None},))


def engine_records(n_steps=6):
    scn = load_scenario({"engine": {"block_size": 4, "num_gpu_blocks": 10}, "requests": [
        {"id": "A", "prompt_token_ids": list(range(1, 11)), "max_tokens": 4},
        {"id": "B", "prompt_token_ids": list(range(1, 9)) + [50, 51], "max_tokens": 4, "arrival_step": 1}]})
    eng = Engine(scn, runner=NoModelRunner())
    first = eng.snapshot()
    return first, [eng.step() for _ in range(n_steps)]


def trace_of(fig, kind):
    return [t for t in fig.data if t.type == kind]


def test_grid_colours_counts_and_hover():
    snap = hand_snapshot()
    fig = F.block_grid(snap, decode=lambda ids: "".join(chr(96 + i % 26) for i in ids), changed={4})
    assert isinstance(fig, go.Figure)
    hm, = trace_of(fig, "heatmap")
    cells = [c for row in hm.text for c in row if c]
    assert len(cells) == 8
    assert "r2" in cells[1] and cells[0] == "∅"
    assert f"#{H3[:4]}" in cells[4], "cached free blocks show their short hash"
    hover = [c for row in hm.customdata for c in row if c]
    assert H3 in hover[4] and H1 in hover[4], "hover shows the full hash and the parent hash"
    assert "A, B" in hover[1] and "position: 2" in hover[4]
    borders = {s.line.color for s in fig.layout.shapes}
    assert "#e00000" in borders and "#111111" in borders and "#ff9900" in borders
    names = {t.name for t in fig.data if t.type == "scatter"}
    assert {"null block", "free", "cached, free", "next victim", "A"} <= names
    json.dumps(fig.to_plotly_json(), default=str)


def test_grid_in_chinese():
    fig = F.block_grid(hand_snapshot(), lang="zh")
    assert "空块" in {t.name for t in fig.data}


def test_block_tables_show_null_slots_and_text():
    snap = hand_snapshot()
    fig = F.block_tables(snap, decode=lambda ids: "tok" * len(ids))
    hm, = trace_of(fig, "heatmap")
    assert list(hm.y) == ["A", "B"]
    assert hm.text[1][0] == "∅"
    assert hm.text[0][0].startswith("<b>1</b>")
    assert "null block" in hm.customdata[1][0]
    assert "slots 2–3" in hm.customdata[0][0]


def test_free_queue_order_and_victim():
    fig = F.free_queue(hand_snapshot())
    hm, = trace_of(fig, "heatmap")
    assert [c.split("</b>")[0].replace("<b>", "") for c in hm.text[0] if c] == ["5", "6", "4"]
    assert fig.layout.shapes[0].line.color == "#e00000"
    assert any("HEAD" in a.text for a in fig.layout.annotations)
    empty = F.free_queue(Snapshot(**{**hand_snapshot().__dict__, "free_queue": ()}))
    assert "empty" in empty.layout.annotations[0].text


def test_hash_chains_tree():
    snap = hand_snapshot()
    nodes, parent, depth = F.chain_nodes(snap)
    assert set(h for h, _ in nodes) == {H1, H2, H3}
    assert depth[(H1, 0)] == 0 and depth[(H2, 0)] == 1 and depth[(H3, 0)] == 1
    fig = F.hash_chains(snap)
    labels = [t for t in fig.data if t.mode == "markers+text" and t.customdata is not None][0]
    assert sorted(labels.text) == ["1", "2", "4"]


def test_address_math():
    snap = hand_snapshot()
    a, = F.address_of(snap, "A", 3)
    assert (a.logical_block, a.offset, a.physical_block, a.slot, a.is_null) == (1, 1, 2, 5, False)
    b, = F.address_of(snap, "B", 1)
    assert b.is_null and b.physical_block == 0
    assert isinstance(F.address_figure(snap, "A", 3), go.Figure)


def test_charts_from_engine_records():
    first, recs = engine_records()
    snaps = [first] + [r.snapshot for r in recs]
    m = F.metrics_over_time(snaps)
    assert list(m.data[0].x) == list(range(len(snaps)))
    b = F.token_budget(recs, 256)
    assert {t.name for t in b.data} >= {"A", "B", "max_num_batched_tokens"}
    assert sum(b.data[0].y) == sum(r.scheduled.get("A", 0) for r in recs)
    h = F.blocks_held(snaps)
    assert max(h.data[0].y) >= 3


@pytest.mark.parametrize("step", [0, 1, 3, 6])
def test_every_builder_on_engine_snapshots(step):
    first, recs = engine_records()
    snap = first if step == 0 else recs[step - 1].snapshot
    for fig in (F.block_grid(snap), F.block_tables(snap), F.free_queue(snap), F.hash_chains(snap)):
        assert isinstance(fig, go.Figure)
        json.dumps(fig.to_plotly_json(), default=str)


def test_short_hash():
    assert short_hash("0123456789abcdef") == "01234567" and short_hash(None) == ""
