"""Every event as one sentence with its reason, in any language of the catalogue.

One table, ``SENTENCES``: per event kind a function giving the event's ``Text`` (catalogue keys
``event.<kind>...`` in ``text/catalogue/events.json``, one key per way the sentence can go). The
CLI's step log and the app's event list both read it. Token text comes from a ``decode`` function
the caller passes in (kvcore does not know the UI or load a tokenizer here). Sentences are plain
text, safe to show as markdown; they never carry HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from kvcore.structured_output.utils import strip_speculative_padding
from paged_kv_lab.recording import events as E
from paged_kv_lab.recording.events import Event, EventKind
from paged_kv_lab.text.i18n import Text, catalogue, tr

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Style:
    """How sentences are written: ``decode`` turns token ids into text (None: show the ids);
    ``multi_group`` names the KV cache group of pool events (only hybrid models have several);
    ``kept``: requests that finished but still hold their blocks at the end of the step (a P/D
    prefill replica's connector delayed the free until the transfer is read)."""

    decode: Decode | None = None
    multi_group: bool = False
    kept: frozenset[str] = frozenset()


Render = Callable[[Event, Style], Text]

ICONS: dict[EventKind, str] = {
    E.ARRIVED: "📥",
    E.SCHEDULED: "🗓",
    E.ADMITTED: "✅",
    E.RESUMED: "↩️",
    E.BLOCKED: "⛔",
    E.CACHE_HIT: "🎯",
    E.CACHE_MISS: "🔍",
    E.TOUCHED: "👆",
    E.ALLOCATED: "🧱",
    E.EVICTED: "🗑",
    E.CACHED: "🔒",
    E.FREED: "♻️",
    E.WINDOW_SKIPPED: "🪟",
    E.PREEMPTED: "⚠️",
    E.FINISHED: "🏁",
    E.RESET: "🧹",
    E.SAMPLED: "✍️",
    E.DRAFT_PROPOSED: "🔮",
    E.DRAFT_ACCEPTED: "👍",
    E.DRAFT_REJECTED: "👎",
    E.CPU_HIT: "🧊",
    E.CPU_LOAD: "⬆️",
    E.CPU_LOADED: "📦",
    E.CPU_STORED: "⬇️",
    E.CPU_EVICTED: "🫗",
    E.KV_LOAD_FAILED: "💥",
    E.CACHED_PARTIAL: "🔐",
    E.COPIED: "📑",
    E.CACHE_AWARE_REORDER: "🔀",
}


def reason_text(code: str | None) -> Text | str:
    """The words behind a short reason code an event carries (``event.reason.<code>``, spaces
    as _); an unknown code is shown as it is."""
    if code is None:
        return ""
    text = Text(f"event.reason.{str(code).replace(' ', '_')}")
    return text if text.key in catalogue() else str(code)


def reason(key: str | None, lang: str) -> str:
    """The words for a reason code in ``lang``; an unknown code is shown as it is."""
    return tr(reason_text(key), lang)


def ids(xs: Iterable[int]) -> str:
    return "[" + ", ".join(str(x) for x in xs) + "]"


def short_hash(h: str | None, n: int = 8) -> str:
    return "" if not h else h[:n]


def _grp(e: Event, s: Style) -> str:
    return f" (g{e.group})" if s.multi_group and e.group is not None else ""


def _plural(n: int) -> str:
    """The plural form of a text for a count of ``n``: its ``.one`` or ``.other`` entry."""
    return "one" if n == 1 else "other"


def _clauses(parts: Sequence[Text]) -> Text:
    """Clauses joined by the language's clause separator (``event.clauses``)."""
    out = parts[-1]
    for p in reversed(parts[:-1]):
        out = Text("event.clauses", {"a": p, "b": out})
    return out


# -- one renderer per kind: the event's Text -----------------------------------------------------
def _arrived(e: E.Arrived, s: Style) -> Text:
    return Text(
        "event.arrived",
        {"rid": e.request_id, "n": e.num_prompt_tokens, "priority": e.priority},
    )


def _scheduled(e: E.Scheduled, s: Style) -> Text:
    return Text(
        "event.scheduled.padded" if e.num_placeholder_tokens else "event.scheduled",
        {
            "rid": e.request_id,
            "n": e.num_tokens,
            "p": e.num_placeholder_tokens,
            "start": e.start,
            "phase": reason_text(e.phase),
        },
    )


def _admitted(e: E.Admitted, s: Style) -> Text:
    return Text("event.admitted", {"rid": e.request_id, "c": e.num_cached_tokens})


def _resumed(e: E.Resumed, s: Style) -> Text:
    c = e.num_cached_tokens
    if c:
        return Text("event.resumed.kept", {"rid": e.request_id, "c": c})
    return Text("event.resumed.none_kept", {"rid": e.request_id})


def _blocked(e: E.Blocked, s: Style) -> Text:
    return Text("event.blocked", {"rid": e.request_id, "why": reason_text(e.reason)})


def _cache_hit(e: E.CacheHit, s: Style) -> Text:
    blocks = " + ".join(ids(g) for g in e.block_ids_per_group if g) or ids(e.block_ids)
    fields = {"rid": e.request_id, "k": e.num_blocks, "n": e.num_tokens, "blocks": blocks}
    if any(len(g) > e.num_blocks for g in e.block_ids_per_group):
        # a group's hit reaches into the block after the full ones: it ends inside a block
        return Text("event.cache_hit.inside", fields)
    return Text("event.cache_hit", fields)


def _cache_miss(e: E.CacheMiss, s: Style) -> Text:
    key = "event.cache_miss.skipped" if e.skip_reading_prefix_cache else "event.cache_miss"
    return Text(key, {"rid": e.request_id, "n": e.num_tokens})


def _touched(e: E.Touched, s: Style) -> Text:
    head = Text("event.touched.base", {"ids": ids(e.block_ids), "grp": _grp(e, s)})
    if e.request_id is None:  # the CPU tier pins the blocks it copies
        head = Text("event.touched.cpu", {"head": head})
        if not e.from_queue:
            return Text("event.touched.pinned", {"head": head})
    if e.request_id:
        head = Text("event.touched.by", {"rid": e.request_id, "head": head})
    if not e.from_queue:
        return Text("event.touched.shared", {"head": head})
    return Text(
        "event.touched.rescued",
        {"head": head, "fq": ids(e.from_queue), "pos": ids(e.queue_positions)},
    )


def _allocated(e: E.Allocated, s: Style) -> Text:
    out = Text(
        "event.allocated",
        {"rid": e.request_id or "?", "ids": ids(e.block_ids), "grp": _grp(e, s)},
    )
    if e.queue_positions:
        out = Text("event.allocated.positions", {"head": out, "pos": ids(e.queue_positions)})
    if e.evicted_hashes:
        lost = ", ".join(f"{bid} ← #{short_hash(h)}" for bid, h in e.evicted_hashes.items())
        out = Text("event.allocated.dropped", {"head": out, "lost": lost})
    return Text("event.end", {"s": out})


def _evicted(e: E.Evicted, s: Style) -> Text:
    fields = {
        "ids": ids(e.block_ids),
        "h": short_hash(e.block_hash),
        "why": reason_text(e.reason),
        "rid": e.request_id,
    }
    if e.reason == "rekeyed":  # a partial entry the block outgrew
        return Text("event.evicted.rekeyed", {**fields, "grp": _grp(e, s)})
    if e.request_id:
        return Text("event.evicted.for", fields)
    return Text("event.evicted", fields)


def _cached(e: E.Cached, s: Style) -> Text:
    pairs = ", ".join(f"{bid}=#{short_hash(h)}" for bid, h in zip(e.block_ids, e.block_hashes))
    return Text(
        "event.cached",
        {"rid": e.request_id or "?", "grp": _grp(e, s), "pairs": pairs, "n": e.num_tokens},
    )


def _cached_partial(e: E.CachedPartial, s: Style) -> Text:
    return Text(
        "event.cached_partial",
        {
            "rid": e.request_id or "?",
            "ids": ids(e.block_ids),
            "grp": _grp(e, s),
            "h": short_hash(e.block_hash),
            "n": e.num_tokens,
        },
    )


def _copied(e: E.Copied, s: Style) -> Text:
    fields = {
        "rid": e.request_id,
        "ids": ids(e.block_ids),
        "src": e.source_block_id,
        "grp": _grp(e, s),
        "hashes": ", ".join(f"#{short_hash(h)}" for h in e.block_hashes),
    }
    if e.reason == "keep_cached":
        return Text("event.copied.keep_cached", fields)
    return Text("event.copied.partial_hit", fields)


def _freed(e: E.Freed, s: Style) -> Text:
    if e.request_id:
        who: Text | str = e.request_id
    else:
        holder = {"offload": "event.freed.cpu_tier", "copied": "event.freed.copies"}
        who = Text(holder[e.reason]) if e.reason in holder else "?"
    parts = []
    if e.to_tail:
        parts.append(Text("event.freed.to_tail", {"ids": ids(e.to_tail)}))
    if e.to_head:
        parts.append(Text("event.freed.to_head", {"ids": ids(e.to_head)}))
    if e.still_used:
        parts.append(Text("event.freed.still_used", {"ids": ids(e.still_used)}))
    fields = {"rid": who, "ids": ids(e.block_ids), "grp": _grp(e, s), "why": reason_text(e.reason)}
    if not parts:
        return Text("event.freed", fields)
    return Text("event.freed.detail", {**fields, "detail": _clauses(parts)})


def _window_skipped(e: E.WindowSkipped, s: Style) -> Text:
    return Text(
        "event.window_skipped",
        {"rid": e.request_id, "slots": ids(e.slots), "grp": _grp(e, s), "ids": ids(e.block_ids)},
    )


def _preempted(e: E.Preempted, s: Style) -> Text:
    return Text(
        "event.preempted",
        {
            "rid": e.request_id,
            "policy": reason_text(e.policy),
            "by": e.needed_by,
            "priority": e.victim_priority,
        },
    )


def _cache_aware_reorder(e: E.CacheAwareReorder, s: Style) -> Text:
    moves = None
    for rid, passed in e.moved_ahead.items():
        move = Text("event.cache_aware_reorder.move", {"rid": rid, "passed": ", ".join(passed)})
        moves = move if moves is None else Text("event.list", {"a": moves, "b": move})
    cached = ", ".join(f"{rid} {n}" for rid, n in e.num_cached_tokens.items())
    fields = {
        "moves": moves,
        "cached": cached,
        "window": e.window,
        "usage": f"{e.usage:.2f}",
        "threshold": f"{e.threshold:.2f}",
    }
    return Text("event.cache_aware_reorder", fields)


def _finished(e: E.Finished, s: Style) -> Text:
    fields = {"rid": e.request_id, "why": reason_text(e.reason)}
    if e.request_id in s.kept:  # a P/D prefill replica keeps its blocks until they are read
        return Text("event.finished.kept", fields)
    return Text("event.finished", fields)


def _reset(e: E.PrefixCacheReset, s: Style) -> Text:
    if e.ok:
        return Text("event.reset.ok")
    return Text("event.reset.refused", {"n": e.blocks_in_use})


def _sampled(e: E.Sampled, s: Style) -> Text:
    text = (lambda t: str(t)) if s.decode is None else (lambda t: s.decode([t]))
    parts = ", ".join(f"{rid} → “{text(t)}”" for rid, t in e.tokens.items()) or "—"
    return Text("event.sampled", {"parts": parts})


def _tokens(ids: Sequence[int], s: Style) -> str:
    return ", ".join(f"“{s.decode([t])}”" for t in ids) if s.decode else ", ".join(map(str, ids))


def _draft_proposed(e: E.DraftProposed, s: Style) -> Text:
    d = len(e.draft_token_ids)
    k = e.num_lookahead_tokens
    how = "eagle" if e.uses_target_hidden_states else ("lookahead" if k else "ngram")
    return Text(
        f"event.draft_proposed.{how}.{_plural(d)}",
        {
            "rid": e.request_id,
            "d": d,
            "toks": _tokens(e.draft_token_ids, s),
            "n": e.num_tokens,
            "k": k,
        },
    )


def _draft_accepted(e: E.DraftAccepted, s: Style) -> Text:
    a = len(e.accepted_token_ids)
    return Text(
        f"event.draft_accepted.{_plural(e.num_draft_tokens)}",
        {
            "rid": e.request_id,
            "a": a,
            "d": e.num_draft_tokens,
            "toks": _tokens(e.accepted_token_ids, s),
            "next": _tokens([e.next_token_id], s),
            "total": a + 1,
        },
    )


def _draft_rejected(e: E.DraftRejected, s: Style) -> Text:
    r = len(e.rejected_token_ids)
    fields = {"rid": e.request_id, "r": r, "n": e.num_computed_tokens}
    fields["pos"] = _tokens(e.positions, Style())
    if not strip_speculative_padding(list(e.rejected_token_ids)):
        # a padded admission's placeholders: no token to show, nothing the model turned down
        return Text(f"event.draft_rejected.padding.{_plural(r)}", fields)
    fields["target"] = _tokens([e.target_token_id], s)
    fields["draft"] = _tokens(e.rejected_token_ids[:1], s)
    return Text(f"event.draft_rejected.{_plural(r)}", fields)


def _cpu_hit(e: E.CpuHit, s: Style) -> Text:
    return Text(
        "event.cpu_hit",
        {
            "rid": e.request_id,
            "local": e.num_local_tokens,
            "n": e.num_tokens,
            "ids": ids(e.block_ids),
        },
    )


def _cpu_load(e: E.CpuLoad, s: Style) -> Text:
    pairs = ", ".join(f"{c}→{g}" for c, g in zip(e.cpu_block_ids, e.block_ids))
    return Text(
        "event.cpu_load",
        {"rid": e.request_id, "ids": ids(e.block_ids), "n": e.num_tokens, "pairs": pairs},
    )


def _cpu_loaded(e: E.CpuLoaded, s: Style) -> Text:
    fields = {"rid": e.request_id, "n": e.num_computed_tokens}
    if not e.load_failed:
        return Text("event.cpu_loaded", fields)
    if e.num_computed_tokens:
        return Text("event.cpu_loaded.failed_partial", fields)
    return Text("event.cpu_loaded.failed_none", fields)


def _kv_load_failed(e: E.KVLoadFailed, s: Style) -> Text:
    n = e.num_computed_tokens
    if e.policy == "fail":
        then = "fail_async" if e.asynchronous else "fail_sync"
    else:
        then = "recompute_async" if e.asynchronous else "recompute_sync"
    return Text(
        "event.kv_load_failed",
        {
            "rid": e.request_id,
            "ids": ids(e.block_ids),
            "n": n,
            "lost": e.num_lost_tokens,
            "then": Text(f"event.kv_load_failed.{then}", {"n": n}),
        },
    )


def _cpu_stored(e: E.CpuStored, s: Style) -> Text:
    pairs = ", ".join(f"{g}→{c}" for g, c in zip(e.block_ids, e.cpu_block_ids))
    if e.mode == "lazy":
        why = Text("event.cpu_stored.lazy")
    else:
        why = Text("event.cpu_stored.eager", {"who": ", ".join(e.req_ids) or "?"})
    return Text("event.cpu_stored", {"pairs": pairs, "why": why})


def _cpu_evicted(e: E.CpuEvicted, s: Style) -> Text:
    return Text("event.cpu_evicted", {"ids": ids(e.block_ids), "h": short_hash(e.block_hash)})


SENTENCES: dict[EventKind, Render] = {
    E.ARRIVED: _arrived,
    E.SCHEDULED: _scheduled,
    E.ADMITTED: _admitted,
    E.RESUMED: _resumed,
    E.BLOCKED: _blocked,
    E.CACHE_HIT: _cache_hit,
    E.CACHE_MISS: _cache_miss,
    E.TOUCHED: _touched,
    E.ALLOCATED: _allocated,
    E.EVICTED: _evicted,
    E.CACHED: _cached,
    E.FREED: _freed,
    E.WINDOW_SKIPPED: _window_skipped,
    E.PREEMPTED: _preempted,
    E.FINISHED: _finished,
    E.RESET: _reset,
    E.SAMPLED: _sampled,
    E.DRAFT_PROPOSED: _draft_proposed,
    E.DRAFT_ACCEPTED: _draft_accepted,
    E.DRAFT_REJECTED: _draft_rejected,
    E.CPU_HIT: _cpu_hit,
    E.CPU_LOAD: _cpu_load,
    E.CPU_LOADED: _cpu_loaded,
    E.CPU_STORED: _cpu_stored,
    E.CPU_EVICTED: _cpu_evicted,
    E.KV_LOAD_FAILED: _kv_load_failed,
    E.CACHED_PARTIAL: _cached_partial,
    E.COPIED: _copied,
    E.CACHE_AWARE_REORDER: _cache_aware_reorder,
}


def sentence(
    e: Event,
    lang: str = "en",
    decode: Decode | None = None,
    multi_group: bool = False,
    kept: frozenset[str] = frozenset(),
) -> str:
    """One event as one sentence in ``lang`` (``kept``: Style)."""
    return tr(SENTENCES[e.kind](e, Style(decode, multi_group, kept)), lang)


def step_sentences(
    evs: Sequence[Event],
    lang: str = "en",
    decode: Decode | None = None,
    multi_group: bool = False,
    kept: frozenset[str] = frozenset(),
) -> list[tuple[str, str]]:
    """(kind, icon + sentence) for each event, in the order they happened (``kept``: Style)."""
    return [
        (e.kind.value, f"{ICONS[e.kind]} {sentence(e, lang, decode, multi_group, kept)}")
        for e in evs
    ]


def kept_blocks(snapshot) -> frozenset[str]:
    """The finished requests that still hold blocks in ``snapshot`` (Style.kept)."""
    return frozenset(
        r.request_id
        for r in snapshot.requests
        if r.status.startswith("finished") and any(r.block_tables)
    )


def changed_blocks(evs: Sequence[Event]) -> set[int]:
    """Blocks whose state an event of the step changed (for the grid's 'changed' outline)."""
    return E.changed_block_ids(evs)


def sizing_sentences(sizing) -> list[Text]:
    """What a reader is told about a :class:`kvcore.model.memory.KVCacheSizing` (the "How many
    blocks?" panel, the profile command): vLLM 0.34's extensible KV cache setting, with its name
    and default, and which path gave num_gpu_blocks, each with the vLLM code behind it."""
    from paged_kv_lab.why.source_links import FUNCTIONS, SIZING_LINKS

    link = FUNCTIONS["finalize_extensible_kv_cache"].vllm.url
    setting = " ".join(
        SIZING_LINKS[n].url
        for n in ("resolve_extensible_kv_cache", "resolved_gpu_memory_utilization")
    )
    util = sizing.stated_gpu_memory_utilization
    out = [
        Text(
            "sizing.setting",
            {
                "value": str(sizing.enable_extensible_kv_cache).lower(),
                "utilization": "None" if util is None else util,
                "resolved": sizing.gpu_memory_utilization,
                "source": setting,
            },
        )
    ]
    if sizing.sizing_path == "measured":
        cpu = sizing.profile.device.startswith("cpu")
        out.append(
            Text(
                "sizing.path.measured",
                {
                    "blocks": f"{sizing.num_gpu_blocks:,}",
                    "capacity": f"{sizing.capacity_blocks:,}",
                    "measured": f"{sizing.measured_num_blocks:,}",
                    "source": link,
                },
            )
        )
        if cpu:
            out.append(Text("sizing.cpu_stands_for"))
    else:
        out.append(
            Text(
                "sizing.path.estimate",
                {
                    "blocks": f"{sizing.num_gpu_blocks:,}",
                    "source": SIZING_LINKS["determine_available_memory"].url,
                },
            )
        )
    usable, needed = sizing.num_gpu_blocks - 1, sizing.blocks_per_request
    if (
        usable < needed
    ):  # vLLM's _check_enough_kv_cache_memory (shrink_kv_cache_configs after warm-up)
        out.append(
            Text(
                "sizing.would_refuse",
                {
                    "max_model_len": f"{sizing.max_model_len:,}",
                    "needed": f"{needed:,}",
                    "usable": f"{usable:,}",
                    "source": FUNCTIONS["shrink_kv_cache_configs"].vllm.url,
                },
            )
        )
    return out
