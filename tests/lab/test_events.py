"""The typed event vocabulary: one frozen class per kind, JSON round trip, and a Recorder that
holds no notion of a "current request". Events come from real engine runs."""

import dataclasses
import json
import typing

import pytest

from paged_kv_lab.recording import events
from paged_kv_lab.recording.events import EVENT_KINDS, EVENT_TYPES, Event, EventKind
from support.event_runs import every_kind_events, every_kind_runs
from support.kv import make_engine, spec


def test_every_kind_has_its_own_frozen_class_that_names_the_vllm_function():
    assert set(EVENT_TYPES) == set(EventKind) and len(set(EVENT_TYPES.values())) == len(EventKind)
    for kind, cls in EVENT_TYPES.items():
        assert cls.kind is kind and issubclass(cls, Event)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        assert "vLLM" in cls.__doc__, f"{cls.__name__} says which vLLM function decides it"
        names = [f.name for f in dataclasses.fields(cls)]
        assert names[:3] == ["request_id", "block_ids", "group"], cls
        assert len(names) > 3 or cls is events.Evicted, f"{cls.__name__} carries why, not only who"


def test_kind_strings_are_the_ones_traces_have_always_used():
    assert [k.value for k in EVENT_KINDS] == [
        "arrived",
        "scheduled",
        "admitted",
        "resumed",
        "blocked",
        "cache_hit",
        "cache_miss",
        "touched",
        "allocated",
        "evicted",
        "cached",
        "freed",
        "window_skipped",
        "preempted",
        "finished",
        "reset",
        "sampled",
        "draft_proposed",
        "draft_accepted",
        "draft_rejected",
        "cpu_hit",
        "cpu_load",
        "cpu_loaded",
        "cpu_stored",
        "cpu_evicted",
        "kv_load_failed",
        "cached_partial",
        "copied",
        "cache_aware_reorder",
    ]
    assert (
        events.EVICTED == "evicted"
        and f"{events.EVICTED}" == "evicted"
        and str(events.FREED) == "freed"
    )


def test_the_engine_runs_make_every_kind():
    assert {e.kind for e in every_kind_events()} == set(EventKind)


def test_every_event_from_the_engine_round_trips_through_json():
    seen = set()
    for e in every_kind_events():
        d = json.loads(json.dumps(e.to_dict()))
        assert d["kind"] == e.kind.value
        back = Event.from_dict(d)
        assert back == e and type(back) is type(e)
        seen.add(e.kind)
    assert seen == set(EventKind)


def test_every_event_has_who_which_blocks_and_which_group_typed_as_declared():
    for e in every_kind_events():
        assert isinstance(e.kind, EventKind)
        assert e.request_id is None or isinstance(e.request_id, str)
        assert isinstance(e.block_ids, tuple) and all(type(b) is int for b in e.block_ids)
        assert e.group is None or type(e.group) is int
        hints = typing.get_type_hints(type(e))
        for f in dataclasses.fields(e):
            v = getattr(e, f.name)
            if typing.get_origin(hints[f.name]) is tuple:
                assert isinstance(v, tuple), (e, f.name)


def test_events_are_frozen():
    e = every_kind_events()[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.request_id = "zz"


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "explosion"},
        {"kind": "evicted", "block_ids": [1], "reason": "evict_blocks"},  # no block_hash
        {"kind": "arrived", "num_prompt_tokens": 3},  # no request_id
        {"request_id": "a"},  # no kind
        [1, 2],
    ],
)
def test_from_dict_refuses_what_is_not_an_event(bad):
    with pytest.raises(ValueError):
        Event.from_dict(bad)


def test_kvcore_keeps_vllms_signatures_and_a_recorder_attaches_without_changing_them():
    """The pool's methods take what vLLM 0.33's take, no request/group/reason keywords; the
    recorder learns whom a call is for from the request scopes kvcore opens on its observer,
    so attaching it replaces no method of the manager it observes."""
    import inspect

    from kvcore.core.block_pool import BlockPool
    from kvcore.core.kv_cache_manager import KVCacheManager
    from kvcore.core.single_type_kv_cache_manager import SingleTypeKVCacheManager
    from paged_kv_lab.recording.recorder import Recorder
    from support.kv import make_manager

    want = {
        BlockPool.get_new_blocks: ["self", "num_blocks"],
        BlockPool.touch: ["self", "blocks"],
        BlockPool.free_blocks: ["self", "ordered_blocks", "evict_first"],
        BlockPool.evict_blocks: ["self", "block_ids"],
        BlockPool.cache_full_blocks: [
            "self",
            "request",
            "blocks",
            "num_cached_blocks",
            "num_full_blocks",
            "block_size",
            "kv_cache_group_id",
            "block_mask",
        ],
        KVCacheManager.free: ["self", "request"],
        SingleTypeKVCacheManager.free: ["self", "request_id"],
        SingleTypeKVCacheManager.allocate_new_blocks: [
            "self",
            "request_id",
            "num_tokens",
            "num_tokens_main_model",
        ],
    }
    for fn, params in want.items():
        assert list(inspect.signature(fn).parameters) == params, fn.__qualname__
    plain = make_manager(8, 2)
    assert plain.block_pool.observer is None and "free" not in vars(plain)
    rec = Recorder()
    kvm = make_manager(8, 2, recorder=rec)
    assert kvm.block_pool.observer is rec and "free" not in vars(kvm)
    with pytest.raises(TypeError):
        events.Allocated((3,))  # fields by name only


def test_pool_events_name_the_request_and_group_they_were_done_for():
    """Every pool decision in a run names its request explicitly; the blocks it got or touched
    are in that request's block table of that group right after the step (unless the request
    lost them again in the same step)."""
    checked = 0
    pins = (events.TOUCHED, events.FREED)
    for name, recs in every_kind_runs():
        for rec in recs:
            gone = {
                e.request_id for e in rec.events if e.kind in (events.PREEMPTED, events.FINISHED)
            }
            # a tail-block copy's blocks: a source a hit touched leaves the table for its copy,
            # a copy made to keep a cache entry never enters one
            copying = {
                b
                for e in rec.events
                if e.kind == events.COPIED
                for b in (e.source_block_id, *e.block_ids)
            }
            for e in rec.events:
                tiered = name in ("cpu_offload", "kv_load_failed")
                if tiered and e.request_id is None and e.kind in pins:
                    continue  # the CPU tier pins the blocks it copies, for no one request
                if e.kind == events.FREED and e.reason == "copied":
                    assert e.request_id is None and set(e.block_ids) <= copying, e
                    continue  # the step's copies ran: their holds go, for no one request
                if e.kind in (events.ALLOCATED, events.TOUCHED, events.CACHED):
                    assert e.request_id is not None and e.group is not None, e
                    if e.request_id in gone:
                        continue
                    table = rec.snapshot.request(e.request_id).block_tables[e.group]
                    assert set(e.block_ids) - copying <= set(table), (rec.step, e, table)
                    checked += 1
                if e.kind in (events.FREED, events.WINDOW_SKIPPED):
                    assert e.request_id is not None and e.group is not None, e
    assert checked > 20


def test_the_engine_takes_the_kv_cache_events_every_step():
    """vLLM's KV cache events go onto the step's record; the pool's queue is empty after every
    step (it used to grow for the life of the engine). Each block the step cached is in one of
    the step's BlockStored events, each eviction is one BlockRemoved."""
    from kvcore.core.kv_cache_utils import maybe_convert_block_hash

    eng = make_engine(
        [spec("A", range(8), max_tokens=6), spec("B", range(20, 28), max_tokens=6)],
        num_gpu_blocks=6,
    )
    pool = eng.kv_cache_manager.block_pool
    stored_total = 0
    while eng.has_unfinished():
        rec = eng.step()
        assert pool.kv_event_queue == []
        stored = {
            h for ev in rec.kv_events if type(ev).__name__ == "BlockStored" for h in ev.block_hashes
        }
        cached = {
            maybe_convert_block_hash(bytes.fromhex(h), pool.use_int_block_hashes)
            for e in rec.events
            if e.kind == events.CACHED
            for h in e.block_hashes
        }
        assert cached <= stored
        removed = sum(
            len(ev.block_hashes) for ev in rec.kv_events if type(ev).__name__ == "BlockRemoved"
        )
        assert removed == sum(1 for e in rec.events if e.kind == events.EVICTED)
        stored_total += len(stored)
    assert stored_total and any(e.kind == events.EVICTED for r in eng.history for e in r.events)
