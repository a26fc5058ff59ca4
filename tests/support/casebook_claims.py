"""Each casebook case's claim as a check over its two recorded runs (before and after the fix):
(records before, records after) -> problems (empty: the claim holds). tests/lab/test_casebook.py
runs every check on the tiny model and on SmolLM2, so what the casebook page says is what the engine
does. Test-only: the app shows the case's sentences (content/cases/<id>/text.json), not these
checks."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from kvcore.model.loader import tiny_random_config
from kvcore.model.memory import bytes_per_block_dims, model_dims
from paged_kv_lab.content.casebook import numbers, run_numbers
from paged_kv_lab.content.topics import common_prefix
from paged_kv_lab.recording.snapshot import Snapshot, StepRecord

Records = Sequence[StepRecord]


def _events(records: Records, kind: str, request: Optional[str] = None):
    return [
        (rec, e)
        for rec in records
        for e in rec.events
        if e.kind == kind and (request is None or e.request_id == request)
    ]


def _last(records: Records) -> Snapshot:
    return records[-1].snapshot


def _hit_tokens(records: Records, request: str) -> int:
    return sum(e.num_tokens for _, e in _events(records, "cache_hit", request))


def _claim_short_prefix(before: Records, after: Records) -> list[str]:
    """On a hybrid model at the block size vLLM raises it to: B continues A's prompt, which is
    shorter than a block, and misses; with prefix_match_unit, B hits inside the block (the block
    as large as before) and writes into a copy; C, sharing only the system prompt, misses both
    times."""
    out = []
    snap = _last(before)
    a, b = snap.request("A").prompt_token_ids, snap.request("B").prompt_token_ids
    shared = common_prefix(a, b)
    if not (shared == len(a) < snap.block_size and any(g["kind"] == "mamba" for g in snap.groups)):
        out.append("B should continue all of A's prompt, shorter than a hybrid model's block")
    if numbers(snap)["hits"] != 0 or numbers(snap)["queries"] == 0:
        out.append("before the fix: tokens were queried and none hit")
    fixed = _last(after)
    hit = _hit_tokens(after, "B")
    if fixed.block_size != snap.block_size or not 0 < hit < fixed.block_size:
        out.append("after the fix: B hits inside a block of the same size")
    if not any(e.reason == "partial_hit" for _, e in _events(after, "copied", "B")):
        out.append("after the fix: B writes into a private copy of the block its hit ends in")
    if _hit_tokens(after, "C") or _hit_tokens(before, "C"):
        out.append("C shares only the system prompt: no state is stored there, it misses")
    return out


def _claim_sliding_churn(before: Records, after: Records) -> list[str]:
    out = []
    if _hit_tokens(before, "A2") != 0:
        out.append("dense retention: session A's second turn should find nothing")
    if not any(e.block_hash for _, e in _events(before, "evicted")):
        out.append("dense retention: cached blocks should be evicted by the churn")
    if _hit_tokens(after, "A2") <= 0:
        out.append("sparse retention: session A's second turn should hit its kept tail")
    return out


def _claim_preempted_hits(before: Records, after: Records) -> list[str]:
    out = []
    pre = _events(before, "preempted")
    if not pre:
        return ["nothing was preempted"]
    victim = pre[0][1].request_id
    if not any(e.preempted_before for _, e in _events(before, "cache_hit", victim)):
        out.append(f"{victim} should resume with a hit on its own recomputed blocks")
    n = numbers(_last(before))
    if n["preempted_hits"] <= 0:
        out.append("the resumed request's hits should be counted (as preempted hits)")
    if n["hits"] != 0:
        out.append("no prompt shares a prefix: vLLM 0.34.0's hit rate should be 0")
    if not n["hit_rate_with_preempted"] > 0:
        out.append("counted as before vLLM #25787, the hit rate should be above 0")
    fixed = numbers(_last(after))
    if _events(after, "preempted") or fixed["preempted_hits"] or fixed["hit_rate_with_preempted"]:
        out.append("with enough blocks: no preemption and no recomputed 'hits'")
    return out


def _claim_salt(before: Records, after: Records) -> list[str]:
    out = []
    if _hit_tokens(before, "A2") <= 0:
        out.append("tenant A's second request (same salt) should hit")
    if _hit_tokens(before, "B1") != 0 or not _events(before, "cache_miss", "B1"):
        out.append("tenant B (another salt) should miss A's cached prompt")
    if _hit_tokens(after, "B1") <= 0:
        out.append("with one shared salt, B should hit A's blocks")
    return out


def _claim_usage_zero(before: Records, after: Records) -> list[str]:
    out = []
    idle = [
        r
        for r in before
        if r.snapshot.usage == 0.0 and not r.snapshot.running and not r.snapshot.waiting
    ]
    if not idle:
        out.append("usage should drop to 0% once A finished")
    elif not any(b.block_hash for b in idle[0].snapshot.blocks):
        out.append("at 0% usage, A's blocks should still be cached (hashed, in the free queue)")
    if _hit_tokens(before, "B") <= 0:
        out.append("B, arriving later, should hit A's blocks")
    idle_off = [r for r in after if r.snapshot.usage == 0.0 and not r.snapshot.running]
    if not idle_off or _hit_tokens(after, "B") != 0:
        out.append("with prefix caching off: the same 0% usage, and B finds nothing")
    return out


def _claim_timestamp(before: Records, after: Records) -> list[str]:
    out = []
    snap = _last(before)
    if any(_hit_tokens(before, r.request_id) for r in snap.requests):
        out.append("with the timestamp first, no request should hit")
    fixed = _last(after)
    later = [r.request_id for r in fixed.requests][1:]
    if not later or not all(_hit_tokens(after, r) > 0 for r in later):
        out.append("with the stable part first, every later request should hit")
    return out


def _claim_preemptions_seen(before: Records, after: Records) -> list[str]:
    """A preemption is counted (vllm:num_preemptions: one per preempted request) but no KV event
    reports it: a BlockRemoved at a preemption's step is an eviction for an allocation, each with
    its evicted event, and the victim's hashed blocks keep their hashes; its resumed hits are
    counted apart. With two requests at a time, nothing is preempted."""
    out = []
    pre = _events(before, "preempted")
    if not pre:
        return ["nothing was preempted"]
    if numbers(_last(before))["preemptions"] != len(pre):
        out.append("the preemption count should equal the preempted events")
    by_step = {rec.step: i for i, rec in enumerate(before)}
    for rec, e in pre:
        removed = [k for k in rec.kv_events if type(k).__name__ == "BlockRemoved"]
        evicted = [ev for ev in rec.events if ev.kind == "evicted"]
        if len(removed) != len(evicted):
            out.append(f"step {rec.step}: a BlockRemoved that is not an eviction")
        i = by_step[rec.step]
        held = before[i - 1].snapshot.request(e.request_id).block_tables if i else ()
        was = {b.block_id: b.block_hash for b in before[i - 1].snapshot.blocks} if i else {}
        now = {b.block_id: b.block_hash for b in rec.snapshot.blocks}
        hashed = [b for t in held for b in t if was.get(b)]
        evicted_ids = {b for ev in evicted for b in ev.block_ids}
        if not hashed or any(now[b] != was[b] for b in hashed if b not in evicted_ids):
            out.append(f"step {rec.step}: the victim's hashed blocks should keep their hashes")
    n = numbers(_last(before))
    if n["hits"] != 0 or n["preempted_hits"] <= 0:
        out.append("the resumed request's own hits should be counted apart, the hit rate 0")
    if not _events(before, "resumed", pre[0][1].request_id):
        out.append("the preempted request should resume")
    if _events(after, "preempted") or numbers(_last(after))["preemptions"]:
        out.append("with max_num_seqs 2: no preemption")
    if not any(e.reason == "max_num_seqs" for _, e in _events(after, "blocked")):
        out.append("with max_num_seqs 2: a request should wait for a running one to finish")
    return out


def _on(records: Records, replica: str, kind: str, request: str):
    return [e for rec, e in _events(records, kind, request) if rec.replica == replica]


def _claim_pd_cached_tokens(before: Records, after: Records) -> list[str]:
    """Each replica looks up its own prefix cache: A misses on both, B hits on both and the
    decode replica pulls only the blocks past its own hit. The decode replica starts every
    pulled request with its whole prompt computed but the last token (its own cached_tokens
    count: the whole prompt), whatever the hits. With prefix caching off: no hit anywhere, and
    the decode replica starts B the same way."""
    out = []
    snap = _last(before)
    prompt = {r.request_id: r.num_prompt_tokens for r in snap.requests}
    a_pre = _on(before, "prefill", "admitted", "A")
    if not a_pre or a_pre[0].num_cached_tokens != 0 or _hit_tokens(before, "A"):
        out.append("A's prompt is new: no hit on either replica")
    b_hit = _on(before, "prefill", "cache_hit", "B")
    if not b_hit or b_hit[0].num_tokens <= 0:
        out.append("B should hit A's opening in the prefill replica's own cache")
    if not _on(before, "decode", "cache_hit", "B"):
        out.append("B should hit the blocks the decode replica pulled for A and cached")
    pulled = {
        rid: len(blocks[1]) for rec in before for rid, blocks in rec.pulls.items() if blocks[1]
    }
    if not 0 < pulled.get("B", 0) < pulled.get("A", 0):
        out.append("the decode replica should pull fewer blocks for B than for A")
    for records, rid in ((before, "A"), (before, "B"), (after, "B")):
        dec = _on(records, "decode", "admitted", rid)
        if not dec or dec[0].num_cached_tokens != prompt[rid] - 1:
            out.append(f"{rid} should start on the decode replica with its prompt computed")
    if numbers(snap)["hit_rate"] <= 0:
        out.append("the decode replica's own hit rate should count B's local hit")
    if _events(after, "cache_hit") or numbers(_last(after))["hit_rate"]:
        out.append("with prefix caching off: no hit anywhere")
    return out


def _claim_eagle_drop(before: Records, after: Records) -> list[str]:
    """With the EAGLE drop (plain block hashes) a hit gives up its last matched block: B, a
    resend, hits one block less than with disable_eagle_block_drop, where it hits every full
    block below its num_tokens - 1; C, sharing one block of system prompt, misses, then hits
    that block; drafts are proposed in both runs; the hit rate vLLM logs goes up with the fix."""
    out = []
    snap = _last(before)
    bs = snap.block_size
    b_before, b_after = _hit_tokens(before, "B"), _hit_tokens(after, "B")
    c_before, c_after = _hit_tokens(before, "C"), _hit_tokens(after, "C")
    b = snap.request("B")
    if b_after != (b.num_prompt_tokens - 1) // bs * bs or b_before != b_after - bs:
        out.append("B: the drop gives up exactly one block of the hit it has without the drop")
    if c_before != 0 or c_after != bs:
        out.append("C: a one-block hit becomes a miss with the drop")
    for name, records in (("before", before), ("after", after)):
        if not _events(records, "draft_proposed"):
            out.append(f"{name} the fix: the EAGLE head drafts")
    if not numbers(snap)["hit_rate"] < numbers(_last(after))["hit_rate"]:
        out.append("the hit rate vLLM logs is lower with the drop")
    return out


def _routed(records: Records) -> list:
    """A fleet's decisions, in the order its replicas took the requests."""
    return [r for rec in records for r in rec.routed]


def _scattered(records: Records) -> bool:
    """Some conversation ran on more than one replica."""
    where: dict[str, set] = {}
    for r in _routed(records):
        where.setdefault(r.session, set()).add(r.replica)
    return any(len(js) > 1 for js in where.values())


def _claim_router_hashes(before: Records, after: Records) -> list[str]:
    """Hashing with another block size and seed than the engines', the router finds none of any
    prompt on any replica: its hit rate is 0, only the load decides and conversations scatter,
    while the engines still hit what happens to be cached where the load sent a request. With
    the engines' settings, it sees the blocks, and its hit rate is the engines'."""
    out = []
    if any(max(r.decision.overlap_blocks) for r in _routed(before)):
        out.append("before: the router should find no overlap on any replica")
    b, a = run_numbers(before), run_numbers(after)
    if b["router_hit_rate"] != 0 or b["hits"] == 0:
        out.append("before: the router's hit rate is 0 while the engines still hit")
    if not _scattered(before):
        out.append("before: a conversation should run on several replicas")
    if not any(max(r.decision.overlap_blocks) for r in _routed(after)):
        out.append("after: the router should see cached blocks")
    if not 0 < a["router_hit_rate"] == a["hit_rate"] or a["hit_rate"] <= b["hit_rate"]:
        out.append("after: the router's hit rate is the engines', and higher than before")
    return out


def _claim_one_replica(before: Records, after: Records) -> list[str]:
    """Longest cached prefix with a shared system prompt: every request on one replica, whose
    scheduler has to keep some waiting while the others idle; Dynamo's load term spreads them,
    at the cost of some hits."""
    out = []
    b, a = run_numbers(before), run_numbers(after)
    if b["busiest_share"] != 1.0:
        out.append("before: one replica should get every request")
    if not any(len(rec.snapshot.waiting) for rec in before):
        out.append("before: the busy replica should keep requests waiting")
    if not 0 < a["busiest_share"] < 1.0 or len({r.replica for r in _routed(after)}) < 2:
        out.append("after: the requests should spread over the replicas")
    if not b["hit_rate"] > a["hit_rate"] > 0:
        out.append("the pile-up hits more: every request finds the system prompt there")
    return out


def _claim_router_vs_engine(before: Records, after: Records) -> list[str]:
    """The router's rate summed over tokens equals the engines' (nothing cached or evicted
    between a decision and its admission); Dynamo's per-request mean is lower; round robin stays
    below the engines' rate under Dynamo's cost, and both are at or below the one-pass bound."""
    out = []
    b, a = run_numbers(before), run_numbers(after)
    for name, n in (("before", b), ("after", a)):
        if abs(n["router_hit_rate"] - n["hit_rate"]) > 1e-9:
            out.append(f"{name}: the router's token-weighted rate should equal the engines'")
        if not n["router_mean_hit_rate"] < n["router_hit_rate"]:
            out.append(f"{name}: the per-request mean should be below the token-weighted rate")
    if not b["hit_rate"] < a["hit_rate"]:
        out.append("round robin should hit less than Dynamo's cost")
    routed = _routed(before)
    if not routed or any(r.decision.policy != "round_robin" for r in routed):
        out.append("before: round robin routes")
    return out


def _claim_connector_hma_off(before: Records, after: Records) -> list[str]:
    """A connector without SupportsHMA: the hybrid KV cache manager is off, so the four layers
    are one full-attention group, the same KV memory makes half the blocks, no block leaves a
    window, and the sessions are preempted; with one that declares it: a full-attention and a
    sliding-window group, twice the blocks, blocks freed behind the window, no preemption, a
    lower peak usage; the same tokens come out both times (the sliding-window layers attend to
    their window either way)."""
    out = []
    snap, fixed = _last(before), _last(after)
    if [g["kind"] for g in snap.groups] != ["full"]:
        out.append("manager off: one full-attention group")
    if [g["kind"] for g in fixed.groups] != ["full", "sliding"]:
        out.append("manager on: a full-attention and a sliding-window group")
    # both pools are the same 64 KiB of float32 KV cache, divided as vLLM 0.34.0 divides it (a
    # block: a page for each layer of the largest group; kvcore/model/memory.py)
    _, heads, dims = model_dims(tiny_random_config())
    for s_, layers in ((snap, 4), (fixed, 2)):
        page = bytes_per_block_dims(s_.block_size, layers, heads, dims, "float32")
        if s_.num_gpu_blocks * page != 64 * 1024:
            out.append(f"{s_.num_gpu_blocks} blocks of {layers} layers' pages: not 64 KiB")
    if _events(before, "window_skipped") or not _events(after, "window_skipped"):
        out.append("only with the manager on should blocks leave a window and be freed")
    if numbers(snap)["preemptions"] <= 0 or numbers(fixed)["preemptions"] != 0:
        out.append("manager off: sessions preempted; on: none")
    peak = [max(r.snapshot.usage for r in records) for records in (before, after)]
    if not peak[1] < peak[0]:
        out.append("the peak KV cache usage should be lower with the manager on")
    for r in snap.requests:
        if fixed.request(r.request_id).output_token_ids != r.output_token_ids:
            out.append(f"{r.request_id}: the same tokens should come out both times")
    return out


def _claim_which_block_size(before: Records, after: Records) -> list[str]:
    """Full-attention blocks of 8 tokens and sliding-window blocks of 32: the scheduler's block is
    32, B's 19-token resend misses (A's two full-attention blocks are not cached: caching stops
    at a multiple of 32 too), and D's hit is a multiple of 32; at block_size 4 (blocks of 4 and
    16) the scheduler's block is 16, B hits and D hits more, so the hit rate rises; the same
    tokens come out both times."""
    out = []
    snap, fixed = _last(before), _last(after)
    if [g["kind"] for g in snap.groups] != ["full", "sliding"]:
        out.append("a full-attention and a sliding-window group")
    if (snap.block_size, fixed.block_size) != (32, 16):
        out.append("the scheduler's block: 32 tokens before the fix, 16 after")
    b_len = snap.request("B").num_prompt_tokens
    if not (8 <= b_len - 1 < snap.block_size) or _hit_tokens(before, "B"):
        out.append("before: B's resend covers a full-attention block, not a scheduler one: a miss")
    a_len = snap.request("A").num_prompt_tokens
    a_hashes = set(snap.request("A").block_hashes)
    cached = {key.split("@")[0] for rec in before for key in rec.snapshot.hash_map}
    if not a_len >= 16 or a_hashes & cached:
        out.append("before: A fills two full-attention blocks, and none of them is cached")
    for records, s_ in ((before, snap), (after, fixed)):
        d = _hit_tokens(records, "D")
        if d <= 0 or d % s_.block_size:
            out.append(f"D's hit should be a positive multiple of {s_.block_size}")
    b_hit = _hit_tokens(after, "B")
    if not (b_hit > 0 and b_hit % fixed.block_size == 0):
        out.append("after: B hits a multiple of the smaller scheduler block")
    if not _hit_tokens(after, "D") > _hit_tokens(before, "D"):
        out.append("after: D hits more")
    if not numbers(fixed)["hit_rate"] > numbers(snap)["hit_rate"]:
        out.append("the hit rate should rise with the smaller block")
    for r in snap.requests:
        if fixed.request(r.request_id).output_token_ids != r.output_token_ids:
            out.append(f"{r.request_id}: the same tokens should come out both times")
    return out


CLAIMS: dict[str, Callable[[Records, Records], list[str]]] = {
    "router-hashes-differ": _claim_router_hashes,
    "one-replica-gets-everything": _claim_one_replica,
    "router-vs-engine-hit-rate": _claim_router_vs_engine,
    "short-prefix": _claim_short_prefix,
    "sliding-churn": _claim_sliding_churn,
    "preempted-hits": _claim_preempted_hits,
    "cache-salt": _claim_salt,
    "usage-zero": _claim_usage_zero,
    "timestamp-first": _claim_timestamp,
    "preemptions-seen": _claim_preemptions_seen,
    "pd-cached-tokens": _claim_pd_cached_tokens,
    "eagle-drop": _claim_eagle_drop,
    "connector-hma-off": _claim_connector_hma_off,
    "which-block-size": _claim_which_block_size,
}
