"""The large-pool player's recording (recording/pool_frames.py): keyframes plus deltas rebuild,
at every recorded step, what ``take_snapshot`` reads from the live engine; its payload is
compact; the replay's cache history answers "why?" consistently with the replay's own hits."""

import pytest

from paged_kv_lab.player.pool_payload import encode_frames, pool_payload
from paged_kv_lab.recording.pool_frames import FrameRecorder, state_at
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.recording.snapshot import take_snapshot
from paged_kv_lab.why.explain_replay import EVICTED, NEVER_COMPUTED, replay_hit_sentences
from paged_kv_lab.workloads.page_data import (
    Settings,
    fill_checkpoints,
    record_window,
    run_workload,
)
from paged_kv_lab.workloads.replay import Replay
from paged_kv_lab.workloads.trace_formats import load_trace
from paged_kv_lab.workloads.trace_limits import page_trace_limits
from support.paths import FIXTURES

SLICE = FIXTURES / "mooncake_shared_slice.jsonl"


@pytest.fixture(scope="module")
def trace():
    return load_trace(SLICE)


def test_keyframes_plus_deltas_rebuild_every_step(trace):
    """A small pool (evictions, sharing): after each step the frames give every block's
    ref_cnt, hash, owners and tokens held, the shown requests, and the queue's ends and counts
    exactly (tokens held too: a decode step fills a request's last block with no event)."""
    s = Settings(block_size=16, num_gpu_blocks=4000, arrival="timestamps")
    r = Replay(trace, s.replay_settings(trace))
    r.advance(until_step=398)
    rec = r.attach(Recorder())
    fr = FrameRecorder(r.scheduler, keyframe_every=8)
    evicted = hit = 0
    for _ in range(24):
        shown = dict(r.requests)
        info = r.step()
        finished = {k: v for k, v in shown.items() if k not in r.requests}
        events = tuple(rec.drain())
        evicted += sum(e.kind == "evicted" for e in events)
        hit += sum(e.kind == "cache_hit" for e in events)
        f = fr.capture(info.step, {}, events, finished)
        snap = take_snapshot(
            r.scheduler, info.step, None, rec.hash_meta, {**r.requests, **finished}
        )
        blocks, reqs = state_at(fr.frames, len(fr.frames) - 1)
        for bv in snap.blocks:
            b = blocks.get(bv.block_id)
            got = (b.ref_cnt, b.block_hash, b.owners) if b else (0, None, ())
            want = (bv.ref_cnt, bv.block_hash[:16] if bv.block_hash else None, bv.owners)
            if bv.owners:  # the tokens a request holds in it
                got, want = (*got, b.num_tokens), (*want, len(bv.token_ids))
            assert got == want, (info.step, bv.block_id)
        assert {k: v.block_tables for k, v in reqs.items()} == {
            v.request_id: v.block_tables for v in snap.requests
        }
        assert f.queue.head == snap.free_queue[:16] and f.queue.tail == snap.free_queue[-16:]
        assert f.queue.num_free == len(snap.free_queue)
        assert f.queue.num_cached_free == sum(
            1 for b in snap.blocks if b.ref_cnt == 0 and b.block_hash and not b.is_null
        )
        if r.done:
            break
    assert evicted and hit, "the stretch must evict and hit to test anything"
    # deltas, not copies: most frames carry far fewer blocks than the pool
    deltas = [len(f.blocks) for f in fr.frames if not f.keyframe]
    assert deltas and sum(deltas) / len(deltas) < 4000 / 4


def test_the_payload_sends_block_tables_as_appends_and_hashes_only_when_changed(trace):
    s = Settings(block_size=16, num_gpu_blocks=10_000, arrival="timestamps")
    w = record_window(trace, s, 300, page_trace_limits(), before=10, after=30)
    wire = encode_frames(w.frames)
    assert wire[0]["k"] == 1 and w.frames[w.start].step == 300
    later = [b for f in wire[1:] if not f["k"] for b in f["b"]]
    assert later and any(len(b) == 4 for b in later)  # ref / owners moved, hash unchanged
    tables = [t for f in wire[1:] if not f["k"] for r in f["r"] for t in r[7]]
    assert any(t[0] > 0 for t in tables)  # kept entries are not sent again
    p = pool_payload(w.frames, num_gpu_blocks=10_000, block_size=16)
    assert p["head"]["num_gpu_blocks"] == 10_000 and "pool_strip" in p["strings"]["en"]


def test_why_agrees_with_the_replay_and_names_the_eviction(trace):
    run = run_workload(trace, Settings(16, 4000, arrival="timestamps"), page_trace_limits())
    reasons = set()
    for p in run.result.per_request:
        xs = run.explain(p.request_id)
        assert xs and xs[0].hit_tokens == p.hit_tokens, p.request_id
        assert xs[0].hit_blocks <= len(xs[0].shared) or xs[0].hit_blocks == 0
        reasons.add(xs[0].reason)
    assert {EVICTED, NEVER_COMPUTED} <= reasons
    x = next(
        x for p in run.result.per_request for x in run.explain(p.request_id) if x.reason == EVICTED
    )
    en = " ".join(
        replay_hit_sentences(x, "en", trace.block_size, trace.requests[int(x.request_id)].hash_ids)
    )
    zh = " ".join(replay_hit_sentences(x, "zh"))
    assert (
        f"{len(x.shared)} of those blocks" in en and "evicted at step" in en and "trace block" in en
    )
    assert "驱逐" in zh


def test_a_window_resumed_from_a_checkpoint_is_the_window_replayed_from_step_0(trace):
    """The page's run keeps checkpoints; a window recorded from the last one before it equals,
    frame for frame, the window replayed from step 0, at steps before, between and after them."""
    from paged_kv_lab.workloads.replay import Checkpoints

    s = Settings(block_size=16, num_gpu_blocks=4000, arrival="timestamps")
    limits = page_trace_limits()
    run = run_workload(trace, s, limits)
    assert isinstance(run.checkpoints, Checkpoints)  # taken by time: how many depends on speed
    cp = Checkpoints()
    r = Replay(trace, s.replay_settings(trace))
    for at in (150, 390, 700):
        r.advance(until_step=at)
        cp.take(r)
    assert cp.steps == [150, 390, 700]
    steps = run.result.steps
    for at in (5, cp.steps[0] + 1, cp.steps[-1], cp.steps[-1] + 45, steps - 3):
        resumed = record_window(trace, s, at, limits, before=10, after=20, checkpoints=cp)
        fresh = record_window(trace, s, at, limits, before=10, after=20)
        assert resumed == fresh, at


def test_filled_checkpoints_are_close_and_resume_the_same_replay(trace):
    """A run's checkpoints filled after it are at most ``every_steps`` apart and within their
    bytes; a window resumed from them equals the window replayed from step 0."""
    s = Settings(block_size=16, num_gpu_blocks=4000, arrival="timestamps")
    limits = page_trace_limits()
    run = run_workload(trace, s, limits)
    taken = list(run.checkpoints.steps)
    assert fill_checkpoints(run, every_steps=50) > 0
    cp = run.checkpoints
    assert set(taken) <= set(cp.steps) and cp.steps == sorted(set(cp.steps))
    gaps = [b - a for a, b in zip([0, *cp.steps], [*cp.steps, run.result.steps])]
    assert max(gaps) <= 50, gaps
    assert cp.nbytes <= cp.max_bytes
    for at in (60, run.result.steps // 2, run.result.steps - 2):
        resumed = record_window(trace, s, at, limits, before=5, after=10, checkpoints=cp)
        assert resumed == record_window(trace, s, at, limits, before=5, after=10), at
    assert fill_checkpoints(run, every_steps=50) == 0  # filled once


def test_a_glimpse_shows_each_step_as_its_whole_window_does(trace):
    """The page's first answer to a click (``show_before`` / ``show_after``: a few frames around
    the step) rebuilds, at each of its steps, the blocks (ref_cnt, hash, parent, tokens held,
    owners; a plain free block listed or not), the requests, the events and the step's figures
    of the whole window around it: a block's parent is known from the whole window's first step
    on, so the glimpse follows those steps too. The steps: where a parent is learned from a
    request holding another block of the same hash (3,600 blocks, step 415), and others."""
    limits = page_trace_limits()

    def shown(frames, i):
        f = frames[i]
        blocks, reqs = state_at(list(frames), i)
        held = {k: b for k, b in blocks.items() if b.ref_cnt or b.block_hash or b.owners}
        fields = (f.step, f.events, f.queue, f.waiting, f.running, f.usage, f.prefix_cache)
        return (held, reqs, *fields, f.scheduled)

    for blocks, at in ((4000, 3), (4000, 41), (4000, 169), (4000, 700), (3600, 417)):
        s = Settings(block_size=16, num_gpu_blocks=blocks, arrival="timestamps")
        whole = record_window(trace, s, at, limits)
        glimpse = record_window(trace, s, at, limits, show_before=2, show_after=8)
        assert [f.step for f in glimpse.frames] == list(range(max(1, at - 2), at + 9))
        assert glimpse.frames[glimpse.start].step == at == whole.frames[whole.start].step
        index = {f.step: i for i, f in enumerate(whole.frames)}
        for i, f in enumerate(glimpse.frames):
            assert shown(glimpse.frames, i) == shown(whole.frames, index[f.step]), (at, f.step)
    # parents learned before the glimpse's first step show in it
    assert any(b.parent_hash for b in glimpse.frames[0].blocks)


@pytest.mark.parametrize("arrival", ["timestamps", "sequential"])
def test_a_replay_resumed_from_a_checkpoint_ends_as_the_replay_itself(trace, arrival):
    """Every checkpoint, run to the end, gives the replay's figures, per request and per step
    (the wall time apart); a checkpoint is never another replay's."""
    from dataclasses import replace

    from paged_kv_lab.workloads.replay import Checkpoints, replay

    settings = Settings(block_size=16, num_gpu_blocks=3600, arrival=arrival).replay_settings(trace)
    whole = replace(replay(trace, settings), wall_s=0.0)
    r = Replay(trace, settings)
    cp = Checkpoints(every_s=0.0)
    while not r.done:
        r.advance(until_step=r.step_count + 97)
        cp.take(r)
    assert len(cp) >= 3
    for at in cp.steps:
        back = cp.resume(trace, settings, at)
        assert back.step_count == at
        back.advance()
        assert replace(back.result(), wall_s=0.0) == whole, at
    assert cp.resume(trace, settings, cp.steps[0] - 1) is None
    other = Settings(block_size=16, num_gpu_blocks=3601, arrival=arrival).replay_settings(trace)
    assert cp.resume(trace, other, cp.steps[-1]) is None
    assert cp.resume(trace.slice(0, 10), settings, cp.steps[-1]) is None


def test_a_checkpoint_of_a_large_pool_pickles_its_linked_free_queue():
    """40,000 blocks, all free and linked, deeper than the recursion limit: the checkpoint is
    taken on a thread with the stack for it, and resumes."""
    from paged_kv_lab.workloads.replay import Checkpoints

    t = load_trace(SLICE).slice(0, 3)
    s = Settings(block_size=16, num_gpu_blocks=40_000).replay_settings(t)
    r = Replay(t, s)
    r.advance(until_step=2)
    cp = Checkpoints()
    cp.take(r)
    back = cp.resume(t, s, 2)
    back.advance()
    r.advance()
    assert back.result().per_request == r.result().per_request


def test_checkpoints_stay_within_their_bytes(trace):
    """Past ``max_bytes`` every other checkpoint goes (the last stays) and the spacing doubles;
    what is left still resumes to the replay's own end."""
    from dataclasses import replace

    from paged_kv_lab.workloads.replay import Checkpoints, replay

    settings = Settings(block_size=16, num_gpu_blocks=4000).replay_settings(trace)
    r = Replay(trace, settings)
    r.advance(until_step=50)
    one = Checkpoints(every_s=0.0)
    one.take(r)
    cp = Checkpoints(every_s=1.0, max_bytes=3 * one.nbytes)
    taken = []
    while not r.done and len(taken) < 8:
        cp.take(r)
        taken.append(r.step_count)
        r.advance(until_step=r.step_count + 60)
    assert cp.nbytes <= cp.max_bytes and cp.every_s > 1.0
    assert cp.steps[-1] == taken[-1] and set(cp.steps) < set(taken)
    whole = replace(replay(trace, settings), wall_s=0.0)
    back = cp.resume(trace, settings, cp.steps[0])
    back.advance()
    assert replace(back.result(), wall_s=0.0) == whole


# -- KV cache groups of different block sizes (case 7's engine, on a replayed trace) -------------
HYBRID = dict(arrival="timestamps", sliding_window=1024, sliding_block_multiple=4)


def _engine_block_sizes(r) -> list[int]:
    """Each KV cache group's block size, as the engine's own kv_cache_config has it."""
    return [g.kv_cache_spec.block_size for g in r.kv_cache_manager.kv_cache_config.kv_cache_groups]


def test_with_two_group_sizes_each_block_holds_at_most_its_own_groups_size(trace):
    """A full-attention group of 16-token blocks beside a sliding-window group of 64-token ones
    (the scheduler's block, 64): after each step every block's group is the group whose table
    holds it (else its hash's), the tokens it holds never exceed that group's block size and
    equal what ``take_snapshot`` reads from the live engine, and a full block of either group
    holds exactly its group's size (not the scheduler's)."""
    s = Settings(block_size=16, num_gpu_blocks=4000, **HYBRID)
    r = Replay(trace, s.replay_settings(trace))
    sizes = _engine_block_sizes(r)
    assert sizes == [16, 64] and r.kv_cache_manager.block_size == 64
    r.advance(until_step=290)
    rec = r.attach(Recorder())
    fr = FrameRecorder(r.scheduler, keyframe_every=8)
    assert fr.sizes_differ and list(fr.group_block_sizes) == sizes
    full = {0: 0, 1: 0}
    partial = 0
    for _ in range(24):
        shown = dict(r.requests)
        info = r.step()
        finished = {k: v for k, v in shown.items() if k not in r.requests}
        fr.capture(info.step, {}, tuple(rec.drain()), finished)
        snap = take_snapshot(
            r.scheduler, info.step, None, rec.hash_meta, {**r.requests, **finished}
        )
        held_in = {
            bid: g
            for v in snap.requests
            for g, table in enumerate(v.block_tables)
            for bid in table
            if bid != 0
        }
        blocks, _ = state_at(fr.frames, len(fr.frames) - 1)
        for bv in snap.blocks:
            b = blocks.get(bv.block_id)
            if bv.is_null or b is None:
                assert not bv.owners and bv.block_hash is None
                continue
            group = held_in.get(bv.block_id, bv.group)
            assert b.group == group, (info.step, bv.block_id)
            assert 0 <= b.num_tokens <= sizes[group], (info.step, bv.block_id)
            if bv.owners:
                assert b.num_tokens == len(bv.token_ids), (info.step, bv.block_id)
            if b.num_tokens == sizes[group]:
                full[group] += 1
            elif bv.owners and b.num_tokens:
                partial += 1
        if r.done:
            break
    assert full[0] and full[1] and partial, "full blocks of both groups and a partial one"


def _decode(wire: list[dict], n: int) -> list[dict[int, tuple]]:
    """What the browser's PoolState holds after each frame (pool.js's apply, in Python): per
    block its ref_cnt, tokens held, group (-1: none) and hash, for blocks not plain free."""
    out, state = [], {}
    for f in wire:
        if f["k"]:
            state = {}
        bg = f.get("bg")
        for j, b in enumerate(f["b"]):
            old = state.get(b[0], (0, 0, -1, None))
            h = b[4] if len(b) > 4 else old[3]
            g = bg[j] if bg is not None and bg[j] is not None else -1
            state[b[0]] = (b[1], b[2], g, h)
        out.append({k: v for k, v in state.items() if v != (0, 0, -1, None) and k < n})
    return out


def test_the_pool_payload_with_two_group_sizes_round_trips(trace):
    """On the wire the head gives each group its own block size (the engine's), every frame
    lists each block's group beside it, and the browser's state rebuilt from the wire is, at
    every frame, the recorded state: each block's ref_cnt, tokens held, group and hash."""
    import json

    s = Settings(block_size=16, num_gpu_blocks=4000, **HYBRID)
    w = record_window(trace, s, 300, page_trace_limits(), before=10, after=30, keyframe_every=16)
    r = Replay(trace, s.replay_settings(trace))
    p = json.loads(
        json.dumps(
            pool_payload(
                w.frames,
                num_gpu_blocks=w.num_gpu_blocks,
                block_size=w.block_size,
                groups=w.groups,
                group_block_sizes=w.group_block_sizes,
            )
        )
    )
    head = p["head"]
    assert head["block_size"] == r.kv_cache_manager.block_size == 64
    assert [g["block_size"] for g in head["groups"]] == _engine_block_sizes(r)
    assert [g["kind"] for g in head["groups"]] == ["full", "sliding"]
    assert all(len(f["bg"]) == len(f["b"]) for f in p["frames"] if f["b"])
    got = _decode(p["frames"], w.num_gpu_blocks)
    for i in range(len(w.frames)):
        blocks, _ = state_at(list(w.frames), i)
        want = {
            k: (b.ref_cnt, b.num_tokens, -1 if b.group is None else b.group, b.block_hash)
            for k, b in blocks.items()
        }
        want = {k: v for k, v in want.items() if v != (0, 0, -1, None)}
        assert got[i] == want, w.frames[i].step
        assert all(v[1] <= head["groups"][v[2]]["block_size"] for v in got[i].values() if v[2] >= 0)


def test_one_block_size_sends_no_groups(trace):
    """Where every group has the scheduler's block size (one group here, or a sliding-window
    group of the same size) the frames name no group and the head no groups: the wire is what
    it was before groups could differ."""
    # (the sliding-window group's 16-token blocks: a prefill chunk holds more of them than of
    # 64-token ones, so a bigger pool)
    for blocks, extra in (
        (4000, {}),
        (8000, {"sliding_window": 1024, "sliding_block_multiple": 1}),
    ):
        s = Settings(block_size=16, num_gpu_blocks=blocks, arrival="timestamps", **extra)
        w = record_window(trace, s, 300, page_trace_limits(), before=4, after=8)
        assert w.group_block_sizes == () and w.block_size == 16
        assert all(b.group is None for f in w.frames for b in f.blocks)
        p = pool_payload(
            w.frames,
            num_gpu_blocks=w.num_gpu_blocks,
            block_size=w.block_size,
            groups=w.groups,
            group_block_sizes=w.group_block_sizes,
        )
        assert "groups" not in p["head"] and not any("bg" in f for f in p["frames"])
        assert p == pool_payload(w.frames, num_gpu_blocks=blocks, block_size=16)


def test_resumed_replays_share_the_memo_of_the_replay_checkpointed(trace):
    """A replay resumed from a checkpoint hashes the prompts that arrive with the memo of the
    replay the checkpoints were taken from (filled by it, and by every resumed one): the same
    hashes, computed once; the window it records is the window replayed from step 0."""
    from paged_kv_lab.workloads.replay import Checkpoints

    s = Settings(block_size=16, num_gpu_blocks=4000, arrival="timestamps")
    settings = s.replay_settings(trace)
    r = Replay(trace, settings)
    r.advance(until_step=100)
    cp = Checkpoints()
    cp.take(r)
    r.advance(until_step=400)  # the memo now holds the prompts that arrived up to step 400
    memo = dict(r.hasher._memo)
    back = cp.resume(trace, settings, 100)
    assert back.hasher is not r.hasher and back.hasher._memo is r.hasher._memo
    back.advance(until_step=400)
    assert r.hasher._memo == memo  # nothing it met was missing: every prompt hashed once
    assert [q.block_hashes for q in back.requests.values()] == [
        q.block_hashes for q in r.requests.values()
    ]
    limits = page_trace_limits()
    resumed = record_window(trace, s, 300, limits, before=10, after=5, checkpoints=cp)
    assert resumed == record_window(trace, s, 300, limits, before=10, after=5)
    # a replay under another hash function keeps its own memo
    other = Replay(trace, Settings(block_size=32).replay_settings(trace))
    other.hasher.share_memo(r.hasher)
    assert other.hasher._memo is not r.hasher._memo
