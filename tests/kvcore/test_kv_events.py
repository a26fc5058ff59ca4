"""vLLM 0.33's KV-event wire format, checked against frames recorded from real vLLM 0.33.0
(tests/fixtures/vllm-kv-events, a copy of shared/fixtures/vllm-kv-events): decode, re-encode byte
for byte, and our engine's own events for the same operations."""

import base64
import json
from pathlib import Path

import msgspec
import pytest

from kvcore.core.kv_cache_utils import maybe_convert_block_hash
from kvcore.distributed import kv_events as ke
from paged_kv_lab.watch.prefix_index import PrefixCacheIndex
from support.kv_events import run_ops
from support.paths import FIXTURES

# real vLLM 0.33.0 frames
FIXTURES = FIXTURES / "vllm-kv-events"
NAMES = ["shared_prefix", "shared_prefix_bytes", "eviction", "hybrid"]


def _fixture_dir() -> Path:
    return FIXTURES


def load(name):
    d = _fixture_dir()
    expected = json.loads((d / f"{name}.expected.json").read_text())
    frames = [
        json.loads(line)
        for line in (d / f"{name}.frames.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return expected, frames


def wanted_events(batch):
    return [{k: v for k, v in e.items() if k != "wire_keys"} for e in batch["events"]]


@pytest.mark.parametrize("name", NAMES)
def test_every_frame_decodes_to_the_recorded_events_and_reencodes_to_the_same_bytes(name):
    expected, frames = load(name)
    assert len(frames) == len(expected["batches"]) == expected["counts"]["batches"]
    for frame, want in zip(frames, expected["batches"]):
        payload = base64.b64decode(frame["payload_b64"])
        batch = ke.decode_batch(payload)
        assert frame["topic"] == "kv-events" and frame["seq"] == want["seq"]
        assert batch.ts == want["ts"] and batch.data_parallel_rank == want["data_parallel_rank"]
        assert [ke.event_to_dict(e) for e in batch.events] == wanted_events(want)
        # The keys on the wire, in order: the tag first, nulls with defaults left out.
        raw = msgspec.msgpack.decode(payload)
        assert [list(m) for m in raw[1]] == [e["wire_keys"] for e in want["events"]]
        assert ke.encode_batch(batch) == payload


@pytest.mark.parametrize("name", NAMES)
def test_the_rebuilt_index_equals_every_checkpoint_and_the_final_state(name):
    expected, frames = load(name)
    index = PrefixCacheIndex()
    checkpoints = {c["after_seq"]: c["state"] for c in expected["checkpoints"]}
    for frame in frames:
        for ev in ke.decode_batch(base64.b64decode(frame["payload_b64"])).events:
            index.apply(ev)
        if frame["seq"] in checkpoints:
            # checkpoints hold the groups
            assert index.state()["groups"] == checkpoints.pop(frame["seq"])
    assert not checkpoints
    assert index.state() == expected["final_state"]
    counts = {
        g: {h: e["count"] for h, e in t.items()}
        for g, t in expected["final_state"]["groups"].items()
    }
    assert counts == expected["engine_block_pool_counts"]


def test_the_index_counts_duplicates_and_drops_a_hash_at_zero():
    index = PrefixCacheIndex()
    stored = ke.BlockStored(
        block_hashes=[7],
        parent_block_hash=None,
        token_ids=[1, 2],
        block_size=2,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
    )
    index.apply(stored)
    index.apply(stored)
    assert index.state()["groups"]["0"]["0000000000000007"]["count"] == 2
    removed = ke.BlockRemoved(block_hashes=[7], medium="GPU", group_idx=0)
    index.apply(removed)
    index.apply(removed)
    index.apply(removed)  # unknown now: ignored
    assert index.state() == {"groups": {}}
    cpu = ke.BlockStored(
        block_hashes=[9],
        parent_block_hash=None,
        token_ids=[1, 2],
        block_size=2,
        lora_id=None,
        medium="CPU",
        lora_name=None,
        group_idx=0,
    )
    index.apply(cpu)
    index.apply(stored)
    index.apply(ke.AllBlocksCleared())  # the GPU pool only
    assert (
        index.state() == {"groups": {}} and "0000000000000009" in index.state("CPU")["groups"]["0"]
    )


def test_the_index_keeps_at_most_its_cap_of_hashes_and_counts_the_rest():
    from paged_kv_lab.watch.prefix_index import HashBudget

    budget = HashBudget(3)
    index = PrefixCacheIndex(budget)
    index.apply(
        ke.BlockStored(
            block_hashes=[1, 2, 3, 4, 5],
            parent_block_hash=None,
            token_ids=list(range(10)),
            block_size=2,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
        )
    )
    assert len(index.state()["groups"]["0"]) == 3 and budget.refused == 2
    index.apply(ke.BlockRemoved(block_hashes=[1], medium="GPU", group_idx=0))
    index.apply(
        ke.BlockStored(
            block_hashes=[6],
            parent_block_hash=5,
            token_ids=[0, 1],
            block_size=2,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
        )
    )
    assert "0000000000000006" in index.state()["groups"]["0"] and budget.used == 3


def test_a_batch_without_rank_decodes_whether_sent_as_two_or_three_elements():
    for raw in ([1.5, [{"type": "AllBlocksCleared"}]], [1.5, [{"type": "AllBlocksCleared"}], None]):
        b = ke.decode_batch(msgspec.msgpack.encode(raw))
        assert b.data_parallel_rank is None and b.events == [ke.AllBlocksCleared()]


def test_older_array_events_are_read_too():
    """Before 0.33 events were arrays tagged by their first element, with fewer fields."""
    raw = [
        2.5,
        [
            ["BlockStored", [7, 8], None, [1, 2, 3, 4], 2, None, "GPU"],
            ["BlockRemoved", [7], "GPU"],
            ["AllBlocksCleared"],
        ],
        1,
    ]
    b = ke.decode_batch(msgspec.msgpack.encode(raw))
    assert b.ts == 2.5 and b.data_parallel_rank == 1
    assert b.events == [
        ke.BlockStored(
            block_hashes=[7, 8],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            block_size=2,
            lora_id=None,
            medium="GPU",
            lora_name=None,
        ),
        ke.BlockRemoved(block_hashes=[7], medium="GPU"),
        ke.AllBlocksCleared(),
    ]


def test_garbage_payloads_raise_decode_errors():
    for junk in (
        b"",
        b"\x93\x01",
        b"\xc1",
        msgspec.msgpack.encode([1.0, [{"type": "Nope"}], 0]),
        msgspec.msgpack.encode({"ts": 1}),
    ):
        with pytest.raises(msgspec.DecodeError):
            ke.decode_batch(junk)


def test_hash_conversion_keeps_the_low_64_bits_big_endian():
    # maybe_convert_block_hash sits where vLLM 0.34.0 keeps it (v1/core/kv_cache_utils.py)
    h = bytes(range(32))
    assert maybe_convert_block_hash(h) == int.from_bytes(h[-8:], "big")
    assert maybe_convert_block_hash(h, use_int_block_hashes=False) == h
    assert ke.hash_text(5) == "0000000000000005" and ke.hash_text(h) == h.hex()
    for n in range(0, 40):  # vLLM's formula (the whole hash masked to 64 bits), any length
        h = bytes(range(200, 200 - n, -1))
        assert maybe_convert_block_hash(h) == int.from_bytes(h, "big") & ((1 << 64) - 1)


def test_endpoint_rules_follow_vllm():
    assert ke.offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert ke.offset_endpoint_port("tcp://10.0.0.5:5557", 0) == "tcp://10.0.0.5:5557"
    assert ke.offset_endpoint_port("tcp://127.0.0.1:0", 3) == "tcp://127.0.0.1:0"
    assert ke.offset_endpoint_port("inproc://kv", 1) == "inproc://kv_dp1"
    assert ke.offset_endpoint_port(None, 1) is None
    assert ke.is_bind_endpoint("tcp://*:5557") and ke.is_bind_endpoint("ipc:///tmp/x")
    assert ke.is_bind_endpoint("tcp://[::]:5557")
    assert not ke.is_bind_endpoint("tcp://127.0.0.1:5557")
    with pytest.raises(ValueError, match="buffer_steps: must be"):
        ke.KVEventsConfig(enable_kv_cache_events=True, buffer_steps=0)
    assert ke.KVEventsConfig().publisher == "null" and ke.KVEventsConfig(True).publisher == "zmq"


@pytest.mark.parametrize("name", NAMES)
def test_our_engine_publishes_the_same_events_and_bytes_for_the_same_ops(name):
    expected, frames = load(name)
    ours = run_ops(expected)
    assert [[ke.event_to_dict(e) for e in b.events] for b in ours] == [
        wanted_events(b) for b in expected["batches"]
    ]
    for b, frame, want in zip(ours, frames, expected["batches"]):
        b.data_parallel_rank = 0  # the publisher fills it in
        b.ts = want["ts"]  # the only field that differs between runs
        assert ke.encode_batch(b) == base64.b64decode(frame["payload_b64"])


def test_spec_kind_and_window_are_read_as_vllm_stamps_them():
    # get_kv_cache_spec_kind / get_kv_cache_spec_sliding_window sit where vLLM 0.34.0 keeps them
    # (v1/kv_cache_interface.py); a spec of vLLM's own classes is read by its class name
    from dataclasses import dataclass

    from kvcore.kv_cache_interface import (
        full_attention,
        get_kv_cache_spec_kind,
        get_kv_cache_spec_sliding_window,
        mamba,
        sliding_window,
    )

    @dataclass
    class SlidingWindowSpec:  # the name vLLM's class has
        sliding_window: int

    @dataclass
    class MLAAttentionSpec:  # a kind kvcore does not model
        block_size: int

    cases = [
        (full_attention(16).kv_cache_spec, "full_attention", None),
        (sliding_window(16, 128).kv_cache_spec, "sliding_window", 128),
        (mamba(16).kv_cache_spec, "mamba", None),
        (SlidingWindowSpec(64), "sliding_window", 64),
        (MLAAttentionSpec(16), "unknown", None),
    ]
    for spec, kind, window in cases:
        assert get_kv_cache_spec_kind(spec) == kind
        assert get_kv_cache_spec_sliding_window(spec) == window
