"""The large-pool player's payload: recorded PoolFrames (recording/pool_frames.py) as compact JSON,
and the player's assets (assets/pool.html, pool.css, pool.js over text.js).

A frame on the wire (short keys, arrays in a fixed order):
``{"s": step, "k": 1 if keyframe, "b": [[block_id, ref_cnt, num_tokens, owners(, hash, parent)]],
"r": [[request_id, status, num_prompt, num_output, num_computed, num_cached, num_preemptions,
[[keep, *ids] per group]]], "g": [gone ids], "q": [head, tail, num_free, num_cached_free],
"w": waiting, "u": running, "us": usage, "pc": prefix cache stats, "sc": scheduled tokens,
"ev": [[kind, request_id, block_ids, sentence]], "sum": summary}``; ``"wq"``: beside "w", each
waiting request's vLLM 0.34 queue, only where one is outside plain ``waiting``; and, only where
the KV cache groups' block sizes differ, ``"bg"``: each listed block's group (None: it serves
none), in the order of ``"b"``, with the head's ``groups`` giving each group its ``block_size``
(as the step player's head does); a run whose groups share one size has neither, byte for byte as
before. A block's hash and parent travel only when they changed (and in every keyframe). A block
table travels as the number of entries kept from the request's table in the frame before plus
the new ones, so a decode step that appends nothing sends ``[n]``. No Streamlit here.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any, Optional, Sequence

from paged_kv_lab.player.export import asset
from paged_kv_lab.player.payload import head_groups
from paged_kv_lab.recording.pool_frames import PoolFrame
from paged_kv_lab.text.i18n import player_strings, tr
from paged_kv_lab.why.sentences import step_sentences

POOL_ASSETS = ("pool.html", "pool.css", "pool.js")


@lru_cache(maxsize=None)
def pool_asset(name: str) -> str:
    if name not in POOL_ASSETS:
        raise ValueError(f"unknown pool player asset {name!r}")
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def pool_module_js() -> str:
    """text.js, room.js and pool.js as one module (their imports of each other dropped)."""
    parts = [asset("text.js"), asset("room.js"), pool_asset("pool.js")]
    return "\n".join(
        "\n".join(line for line in p.split("\n") if not line.startswith("import ")) for p in parts
    )


def pool_css() -> str:
    return asset("player.css") + "\n" + pool_asset("pool.css")


def _tables(old, new: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    out = []
    for gi, t in enumerate(new):
        prev = old[gi] if old is not None and gi < len(old) else ()
        n = min(len(prev), len(t))
        keep = n
        if t[:n] != prev[:n]:  # most tables only grow: one comparison says so
            keep = 0
            while prev[keep] == t[keep]:
                keep += 1
        out.append([keep, *t[keep:]])
    return out


def _block(b, hashes: dict[int, tuple], keyframe: bool) -> list:
    """[id, ref_cnt, num_tokens, owners] and, when they changed (always in a keyframe), hash and
    parent: most deltas only move a block's ref_cnt and owners."""
    out = [b.block_id, b.ref_cnt, b.num_tokens, list(b.owners)]
    h = (b.block_hash, b.parent_hash)
    if keyframe or hashes.get(b.block_id, (None, None)) != h:
        out += [b.block_hash, b.parent_hash]
    hashes[b.block_id] = h
    return out


def _summary(f: PoolFrame, lang: str) -> str:
    total = sum(f.scheduled.values())
    return tr("step_summary", lang, step=f.step, total=total) + tr(
        "player.pool_summary_tail", lang, running=len(f.running), waiting=len(f.waiting)
    )


def encode_frames(frames: Sequence[PoolFrame], lang: str = "en") -> list[dict[str, Any]]:
    """Each frame on the wire, in order (block tables as kept + appended against the frame
    before, which the browser applies in the same order)."""
    out = []
    tables: dict[str, tuple] = {}
    hashes: dict[int, tuple] = {}
    for f in frames:
        if f.keyframe:
            tables, hashes = {}, {}
        for rid in f.gone:
            tables.pop(rid, None)
        reqs = []
        for r in f.requests:
            reqs.append(
                [
                    r.request_id,
                    r.status,
                    r.num_prompt_tokens,
                    r.num_output_tokens,
                    r.num_computed_tokens,
                    r.num_cached_tokens,
                    r.num_preemptions,
                    _tables(tables.get(r.request_id), r.block_tables),
                ]
            )
            tables[r.request_id] = r.block_tables
        events = [
            [e.kind.value, e.request_id, list(e.block_ids), text]
            for e, (_, text) in zip(f.events, step_sentences(f.events, lang))
        ]
        frame = {
            "s": f.step,
            "k": 1 if f.keyframe else 0,
            "b": [_block(b, hashes, f.keyframe) for b in f.blocks],
            "r": reqs,
            "g": list(f.gone),
            "q": [
                list(f.queue.head),
                list(f.queue.tail),
                f.queue.num_free,
                f.queue.num_cached_free,
            ],
            "w": list(f.waiting),
            "u": list(f.running),
            "us": round(f.usage, 6),
            "pc": {k: v for k, v in f.prefix_cache.items()},
            "sc": dict(f.scheduled),
            "ev": events,
            "sum": _summary(f, lang),
        }
        if f.waiting_queues:
            frame["wq"] = list(f.waiting_queues)
        if any(b.group is not None for b in f.blocks):
            frame["bg"] = [b.group for b in f.blocks]
        out.append(frame)
    return out


def pool_payload(
    frames: Sequence[PoolFrame],
    *,
    num_gpu_blocks: int,
    block_size: int,
    lang: str = "en",
    start: int = 0,
    run: str = "pool",
    extends: Optional[str] = None,
    groups: Sequence[dict[str, Any]] = (),
    group_block_sizes: Sequence[int] = (),
) -> dict[str, Any]:
    """What the pool player is given: the head, every frame, and the player's words.
    ``extends``: the run this window holds more steps of (the same step of both shows the same
    frame); a player showing that run stays at its step, zoom and selection. ``groups`` /
    ``group_block_sizes``: the KV cache groups and, where their sizes differ, each one's (then
    ``block_size`` is the scheduler's, their least common multiple); the head names the groups
    only then."""
    head = {
        "lang": lang,
        "num_gpu_blocks": num_gpu_blocks,
        "block_size": block_size,
        "start": start,
    }
    if group_block_sizes:
        head["groups"] = head_groups(groups, group_block_sizes)
    if extends is not None:
        head["extends"] = extends
    return {
        "run": run,
        "head": head,
        "frames": encode_frames(frames, lang),
        "strings": {lang: player_strings(lang)},
    }


def pool_static_html(payload: dict[str, Any], title: Optional[str] = None) -> str:
    """A recorded window as one self-contained HTML file (no server, no network): the pool
    player's html/css/js and the payload inlined, the payload read with JSON.parse only."""
    from paged_kv_lab.player.export import html_lang, json_for_script

    if title is None:
        title = tr("export.pool_default_title", payload["head"]["lang"])
    safe_title = title.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    js = pool_module_js().replace("</script", "<\\/script")
    return f"""<!doctype html>
<html lang="{html_lang(payload["head"]["lang"])}">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; \
script-src 'unsafe-inline'">
<title>{safe_title}</title>
<style>
body {{ font-family: system-ui, 'Noto Sans CJK SC', 'Microsoft YaHei', sans-serif; margin: 1rem; }}
{pool_css()}
</style>
</head>
<body>
<div id="pkv-root">{pool_asset("pool.html")}</div>
<script type="application/json" id="pkv-run">{json_for_script(payload)}</script>
<script type="module">
{js}
mountPoolPlayer({{
  data: JSON.parse(document.getElementById("pkv-run").textContent),
  parentElement: document.getElementById("pkv-root"),
}});
</script>
</body>
</html>
"""
