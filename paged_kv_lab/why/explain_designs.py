"""The "Why?" of SGLang's radix tree and nano-vllm's block table, from their recorded events.

The lesson "Hash chains vs radix tree" feeds the two designs the requests of vLLM's recorded run
(designs/side_by_side.py) and keeps, per step, what each decided (designs/design_events.py). Three
questions
are answered from those events alone, up to the player's step:

- ``explain_sglang_hit``: why a request matched ``prefix_len`` tokens in the tree: the whole key
  matched (SGLang leaves the prompt's last token to compute), or the tree's tokens diverged from
  the request's at one position, or the tokens that would have matched were in a leaf evicted
  since, or no earlier request had them; where the matched tokens came from;
- ``explain_leaf``: why a leaf was evicted: who was short of slots, by how much, and the order of
  the evictable leaves (the strategy's priority, LRU: last access time) at that moment;
- ``explain_nano_hit``: each block of a request's allocation in nano-vllm, hit or missed and why
  (partial, absent, stale, collision, after a miss), with the earlier block it hit or lost.

Each answer carries vLLM's own answer for the same admission (why.explain), so the three designs
can be told apart on one request. The events are read by their ``kind`` (words never imports
designs). Sentences from the catalogue (designs_why.json); token text is the caller's
decoder's, quoted as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Optional, Sequence

from paged_kv_lab.text.i18n import Text, catalogue, tr
from paged_kv_lab.why import explain as X
from paged_kv_lab.why.explain_text import hit_sentences

Pos = tuple[int, int]  # (step, index of the event in that step)

WHOLE_KEY = "whole_key"
DIVERGED = "diverged"
EVICTED = "evicted"
NEVER = "never"


class DesignError(X.ExplainError):
    """The question has no answer in the steps shown so far."""


@dataclass(frozen=True)
class DesignRun:
    """The two designs' steps shown so far (``steps[i].step == i + 1``, each with its ``events``)
    and the vLLM run they follow; ``page_size`` is SGLang's, ``nano_commit`` the nano-vllm
    commit that made the events (its short hash: bb823b3 or 2f352ae)."""

    steps: tuple[Any, ...]
    vllm: X.RecordedSteps
    page_size: int
    nano_commit: str

    def events(self):
        for s in self.steps:
            for i, e in enumerate(s.events):
                yield (s.step, i), e

    @cached_property
    def views(self) -> dict:
        return self.vllm.request_views()

    def tokens(self, request_id: str) -> tuple[int, ...]:
        rv = self.views.get(request_id)
        return X.all_tokens(rv) if rv is not None else ()

    def text(self, ids: Sequence[int]) -> Optional[str]:
        return self.vllm.text(ids)


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# -- SGLang's tree, replayed -----------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """A tree node's tokens: those at ``start``..``end`` of request ``request_id``'s tokens, put
    in the tree at ``step`` (a node's depth is its ``start``: the path above holds the rest)."""

    request_id: str
    step: int
    start: int
    end: int


@dataclass(frozen=True)
class Eviction:
    step: int
    node_id: int
    span: Optional[Span]
    request_id: Optional[str]  # whose shortfall it freed


def replay_tree(run: DesignRun, until: Optional[Pos] = None):
    """Each live node's Span and every evicted leaf, from the events before ``until``.
    Invariant: a node is in ``live`` iff an insert or a split made it and no eviction took it."""
    live: dict[int, Span] = {}
    evicted: list[Eviction] = []
    for pos, e in run.events():
        if until is not None and pos >= until:
            break
        if e.kind == "node_inserted":
            live[e.node_id] = Span(e.request_id, pos[0], e.prefix_len, e.prefix_len + e.num_tokens)
        elif e.kind == "node_split" and e.child_id in live:
            c = live[e.child_id]
            live[e.node_id] = Span(c.request_id, c.step, c.start, c.start + e.split_len)
            live[e.child_id] = Span(c.request_id, c.step, c.start + e.split_len, c.end)
        elif e.kind == "leaf_evicted":
            evicted.append(Eviction(pos[0], e.node_id, live.pop(e.node_id, None), e.request_id))
    return live, evicted


@dataclass(frozen=True)
class SGLangHit:
    """Why ``request_id``'s ``match_prefix`` at ``step`` found ``prefix_len`` of the ``num_tokens``
    of its key (its prompt but the last token, cut to whole pages). ``stop``: the first token of
    the key the tree did not hold (None for a whole-key match); ``theirs``/``other``: the tree's
    token there and the request that put it there (diverged); ``evicted``: the leaf that held the
    longer match (evicted); ``sources``: where the matched tokens came from, root first."""

    request_id: str
    step: int
    prompt_len: int
    num_tokens: int
    prefix_len: int
    page_size: int
    node_id: int
    nodes_visited: int
    reason: str
    splits: tuple[int, ...] = ()
    sources: tuple[Span, ...] = ()
    stop: Optional[int] = None
    ours: Optional[int] = None
    theirs: Optional[int] = None
    other: Optional[str] = None
    evicted: Optional[Eviction] = None
    vllm: Optional[X.HitExplanation] = None


def _vllm_hit(run: DesignRun, rid: str, step: int) -> Optional[X.HitExplanation]:
    try:
        found = X.explain_hit(run.vllm, rid, step)
    except X.ExplainError:
        return None
    return found[-1] if found else None


def _path(run: DesignRun, span: Span) -> tuple[int, ...]:
    return run.tokens(span.request_id)[: span.end]


def explain_sglang_hit(run: DesignRun, request_id: str) -> list[SGLangHit]:
    """Every ``match_prefix`` of the request in the steps shown (one per admission)."""
    found = [
        (pos, e)
        for pos, e in run.events()
        if e.kind == "prefix_matched" and e.request_id == request_id
    ]
    if not found:
        raise DesignError(Text("designs_why.error.not_matched", {"rid": request_id}))
    out = []
    for pos, m in found:
        tokens = run.tokens(request_id)
        prompt_len = len(run.views[request_id].prompt_token_ids)
        key = tokens[: m.num_tokens]
        live, evicted = replay_tree(run, pos)
        splits = tuple(
            e.split_len
            for p, e in run.events()
            if e.kind == "node_split" and e.request_id == request_id and p[0] == pos[0] and p < pos
        )
        lcps = {nid: _lcp(_path(run, s), key) for nid, s in live.items()}
        sources = tuple(
            sorted(
                (
                    s
                    for s in live.values()
                    if s.start < m.prefix_len and _on_path(run, s, key, m.prefix_len)
                ),
                key=lambda s: s.start,
            )
        )
        base = dict(
            request_id=request_id,
            step=pos[0],
            prompt_len=prompt_len,
            num_tokens=m.num_tokens,
            prefix_len=m.prefix_len,
            page_size=run.page_size,
            node_id=m.node_id,
            nodes_visited=m.nodes_visited,
            splits=splits,
            sources=sources,
            vllm=_vllm_hit(run, request_id, pos[0]),
        )
        if m.prefix_len >= m.num_tokens:
            out.append(SGLangHit(reason=WHOLE_KEY, **base))
            continue
        reach = max(lcps.values(), default=0)
        gone = [
            x
            for x in evicted
            if x.span is not None
            and x.span.start <= reach < x.span.end
            and _lcp(_path(run, x.span), key) > reach
        ]
        if gone:
            out.append(
                SGLangHit(reason=EVICTED, stop=reach, ours=key[reach], evicted=gone[-1], **base)
            )
            continue
        beyond = [s for nid, s in live.items() if lcps[nid] == reach and s.start <= reach < s.end]
        if beyond:
            s = beyond[0]
            out.append(
                SGLangHit(
                    reason=DIVERGED,
                    stop=reach,
                    ours=key[reach],
                    theirs=_path(run, s)[reach],
                    other=s.request_id,
                    **base,
                )
            )
        else:
            out.append(SGLangHit(reason=NEVER, stop=reach, ours=key[reach], **base))
    return out


def _on_path(run: DesignRun, span: Span, key: Sequence[int], upto: int) -> bool:
    """The span lies on the matched path: its tokens and those above it, up to ``upto``, are
    the key's."""
    end = min(span.end, upto)
    return tuple(_path(run, span)[:end]) == tuple(key[:end])


# -- why a leaf was evicted ------------------------------------------------------------------
@dataclass(frozen=True)
class LeafEviction:
    """Leaf ``node_id`` left the tree at ``step`` because ``request_id`` needed ``num_tokens``
    slots with ``available`` free; ``leaves`` were the evictable ones, in the order evict takes
    them (``rank``: this leaf's place, 0 first); ``freed``: tokens the whole eviction freed."""

    node_id: int
    step: int
    request_id: Optional[str]
    num_tokens_leaf: int
    priority: Any
    num_tokens: int
    available: int
    leaves: tuple[Any, ...]
    rank: Optional[int]
    freed: int
    span: Optional[Span]


def evicted_leaves(run: DesignRun) -> list[tuple[int, int]]:
    """(step, node id) of every leaf evicted in the steps shown."""
    return [(pos[0], e.node_id) for pos, e in run.events() if e.kind == "leaf_evicted"]


def explain_leaf(run: DesignRun, node_id: int) -> LeafEviction:
    events = list(run.events())
    at = next(
        (k for k, (_, e) in enumerate(events) if e.kind == "leaf_evicted" and e.node_id == node_id),
        None,
    )
    if at is None:
        raise DesignError(Text("designs_why.error.not_evicted", {"node": node_id}))
    pos, e = events[at]
    ask = next(
        (a for _, a in reversed(events[:at]) if a.kind == "eviction_asked"),
        None,
    )
    done = next((d for _, d in events[at:] if d.kind == "eviction_done"), None)
    live, _ = replay_tree(run, pos)
    leaves = tuple(ask.leaves) if ask is not None else ()
    ids = [leaf.node_id for leaf in leaves]
    return LeafEviction(
        node_id=node_id,
        step=pos[0],
        request_id=e.request_id,
        num_tokens_leaf=e.num_tokens,
        priority=e.priority,
        num_tokens=ask.num_tokens if ask is not None else 0,
        available=ask.available if ask is not None else 0,
        leaves=leaves,
        rank=ids.index(node_id) if node_id in ids else None,
        freed=done.num_tokens_evicted if done is not None else e.num_tokens,
        span=live.get(node_id),
    )


# -- nano-vllm's blocks ----------------------------------------------------------------------
@dataclass(frozen=True)
class NanoBlock:
    """Block ``index`` of the sequence at its allocation: ``hit`` block ``block_id`` or took it
    (a miss, ``reason``). ``holder``: the earlier request whose same tokens filled a block (its
    ``holder_index``-th, block ``holder_block``) at ``holder_step``; ``reused_by``/``reused_step``:
    who took that block from the free deque since (the stale case, and at bb823b3 the case of
    an entry deleted when its block was taken)."""

    index: int
    hit: bool
    block_id: int
    reason: str = ""
    revived: bool = False
    wrong_prefix: bool = False
    num_tokens: int = 0
    holder: Optional[str] = None
    holder_step: Optional[int] = None
    holder_block: Optional[int] = None
    reused_by: Optional[str] = None
    reused_step: Optional[int] = None


@dataclass(frozen=True)
class NanoHit:
    commit: str
    request_id: str
    step: int
    prompt_len: int
    block_size: int
    blocks: tuple[NanoBlock, ...]
    vllm: Optional[X.HitExplanation] = None

    @property
    def hit_tokens(self) -> int:
        return sum(b.num_tokens for b in self.blocks if b.hit)


def _nano_fills(run: DesignRun, until: Pos) -> list[tuple[Pos, str, int, int, int, str]]:
    """(position, request, block index, block id, tokens it holds full, event kind) of every
    block a request got (hit, missed, appended) or sealed before ``until``."""
    bs = run.vllm.block_size()
    tables: dict[str, list[int]] = {}
    out = []
    for pos, e in run.events():
        if pos >= until:
            break
        rid = e.request_id
        if e.kind in ("block_hit", "block_miss"):
            tables.setdefault(rid, []).append(e.block_id)
            n = len(run.views[rid].prompt_token_ids)
            full = min(bs, max(n - e.index * bs, 0))
            out.append((pos, rid, e.index, e.block_id, full, e.kind))
        elif e.kind == "block_appended":
            tables.setdefault(rid, []).append(e.block_id)
            out.append((pos, rid, len(tables[rid]) - 1, e.block_id, 0, e.kind))
        elif e.kind == "block_sealed" and e.block_id in tables.get(rid, []):
            out.append((pos, rid, tables[rid].index(e.block_id), e.block_id, bs, e.kind))
    return out


def explain_nano_hit(run: DesignRun, request_id: str) -> list[NanoHit]:
    """Each allocation of the request in nano-vllm (one per admission), block by block."""
    bs = run.vllm.block_size()
    allocs: dict[int, list[tuple[Pos, Any]]] = {}
    for pos, e in run.events():
        if e.kind in ("block_hit", "block_miss") and e.request_id == request_id:
            allocs.setdefault(pos[0], []).append((pos, e))
    if not allocs:
        raise DesignError(Text("designs_why.error.not_allocated", {"rid": request_id}))
    tokens = run.tokens(request_id)
    prompt_len = len(run.views[request_id].prompt_token_ids)
    out = []
    for step, found in allocs.items():
        fills = _nano_fills(run, found[0][0])
        blocks = []
        for pos, e in found:
            n = min(bs, prompt_len - e.index * bs)
            mine = tokens[: e.index * bs + n]
            same = [
                f
                for f in fills
                if n == bs
                and f[4] == bs
                and f[5] in ("block_miss", "block_sealed")
                and f[2] == e.index
                and run.tokens(f[1])[: (e.index + 1) * bs] == tuple(mine)
            ]
            kw: dict = {}
            if same:
                hp, holder, _, hb, _, _ = same[-1]
                kw.update(holder=holder, holder_step=hp[0], holder_block=hb)
                took = [
                    f
                    for f in fills
                    if f[0] > hp and f[3] == hb and f[5] in ("block_miss", "block_appended")
                ]
                if took and e.kind == "block_miss":
                    kw.update(reused_by=took[0][1], reused_step=took[0][0][0])
            blocks.append(
                NanoBlock(
                    index=e.index,
                    hit=e.kind == "block_hit",
                    block_id=e.block_id,
                    reason=getattr(e, "reason", ""),
                    revived=getattr(e, "revived", False),
                    wrong_prefix=getattr(e, "wrong_prefix", False),
                    num_tokens=n,
                    **kw,
                )
            )
        out.append(
            NanoHit(
                run.nano_commit,
                request_id,
                step,
                prompt_len,
                bs,
                tuple(blocks),
                _vllm_hit(run, request_id, step),
            )
        )
    return out


# -- sentences -------------------------------------------------------------------------------
def _tok(run: DesignRun, token: Optional[int]) -> str:
    if token is None:
        return "—"
    text = run.text([token])
    return f"{text!r} (id {token})" if text is not None else f"id {token}"


def _vllm_lines(x: Optional[X.HitExplanation], lang: str) -> list[str]:
    if x is None:
        return [tr("designs_why.vllm_not_yet", lang)]
    lines = hit_sentences(x, lang)[:-1]  # the code link is the panel's, under the answer
    return [tr("designs_why.vllm_same", lang, s=lines[0]), *lines[1:]]


def sglang_hit_sentences(x: SGLangHit, run: DesignRun, lang: str = "en") -> list[str]:
    kw = dict(
        r=x.request_id,
        s=x.step,
        hit=x.prefix_len,
        keylen=x.num_tokens,
        n=x.prompt_len,
        ps=x.page_size,
        node=x.node_id,
        v=x.nodes_visited,
        p=x.stop,
        ours=_tok(run, x.ours),
        theirs=_tok(run, x.theirs),
        q=x.other,
    )
    out = [tr("designs_why.sglang.head", lang, **kw)]
    if x.reason == WHOLE_KEY:
        out.append(tr("designs_why.sglang.whole_key", lang))
    elif x.reason == DIVERGED:
        out.append(tr("designs_why.sglang.diverged", lang, **kw))
        if x.page_size > 1 and (x.stop or 0) > x.prefix_len:
            out.append(tr("designs_why.sglang.inside_page", lang, **kw))
    elif x.reason == EVICTED:
        ev_ = x.evicted
        sp = ev_.span
        out.append(
            tr(
                "designs_why.sglang.evicted",
                lang,
                leaf=ev_.node_id,
                a=sp.start,
                b=sp.end - 1,
                q=sp.request_id,
                qs=sp.step,
                es=ev_.step,
                y=ev_.request_id or "—",
                p=x.stop,
            )
        )
    else:
        out.append(tr("designs_why.sglang.never", lang, **kw))
    if x.splits:
        out.append(tr("designs_why.sglang.split", lang, k=", ".join(map(str, x.splits))))
    for s in x.sources:
        out.append(
            tr(
                "designs_why.sglang.source",
                lang,
                a=s.start,
                b=min(s.end, x.prefix_len) - 1,
                q=s.request_id,
                qs=s.step,
            )
        )
    if x.vllm is not None and x.vllm.hit_tokens != x.prefix_len:
        out.append(
            tr(
                "designs_why.sglang.vs_vllm",
                lang,
                v=x.vllm.hit_tokens,
                bs=x.vllm.block_size,
                **{k: kw[k] for k in ("r", "hit", "ps")},
            )
        )
    return out + _vllm_lines(x.vllm, lang)


def leaf_sentences(x: LeafEviction, lang: str = "en") -> list[str]:
    kw = dict(
        leaf=x.node_id,
        s=x.step,
        y=x.request_id or "—",
        k=x.num_tokens_leaf,
        need=x.num_tokens,
        free=x.available,
        short=x.num_tokens - x.available,
        freed=x.freed,
        pr=x.priority,
    )
    out = [tr("designs_why.leaf.head", lang, **kw)]
    if x.leaves:
        order = ", ".join(
            tr("designs_why.leaf.item", lang, n=leaf.node_id, k=leaf.num_tokens, p=leaf.priority)
            for leaf in x.leaves
        )
        out.append(tr("designs_why.leaf.order", lang, order=order))
    if x.rank == 0:
        out.append(tr("designs_why.leaf.first", lang, **kw))
    elif x.rank is not None:
        out.append(
            tr(
                "designs_why.leaf.rank",
                lang,
                r=x.rank + 1,
                **{k: v for k, v in kw.items() if k != "r"},
            )
        )
    else:
        out.append(tr("designs_why.leaf.became_leaf", lang, **kw))
    out.append(tr("designs_why.leaf.whole", lang, **kw))
    if x.span is not None:
        out.append(
            tr(
                "designs_why.leaf.span",
                lang,
                a=x.span.start,
                b=x.span.end - 1,
                q=x.span.request_id,
                qs=x.span.step,
            )
        )
    return out


def nano_sentences(x: NanoHit, lang: str = "en") -> list[str]:
    out = [
        tr(
            "designs_why.nano.head",
            lang,
            commit=x.commit,
            r=x.request_id,
            s=x.step,
            hit=x.hit_tokens,
            n=x.prompt_len,
            bs=x.block_size,
            rule=Text(f"designs_why.nano.rule.{x.commit}"),
        )
    ]
    for b in x.blocks:
        if b.hit:
            rev = tr("designs_why.nano.revived", lang) if b.revived else ""
            src = (
                tr("designs_why.nano.holder", lang, q=b.holder, qs=b.holder_step)
                if b.holder and not b.wrong_prefix
                else ""
            )
            wrong = tr("designs_why.nano.hit.wrong", lang, bid=b.block_id) if b.wrong_prefix else ""
            out.append(
                tr(
                    "designs_why.nano.hit",
                    lang,
                    i=b.index,
                    bid=b.block_id,
                    rev=rev,
                    src=src,
                    wrong=wrong,
                )
            )
            continue
        reason = b.reason
        if reason == "absent" and b.reused_by:  # bb823b3 deleted the entry of the reused block
            reason = "dropped"
        miss = Text(f"designs_why.nano.miss.{reason}")  # one sentence per reason of a miss
        fields = dict(
            k=b.num_tokens,
            bs=x.block_size,
            hb=b.holder_block,
            q=b.holder or "—",
            qs=b.holder_step,
            y=b.reused_by or "—",
            ys=b.reused_step,
        )
        why = tr(miss, lang, **fields) if miss.key in catalogue() else b.reason
        if reason == "last" and b.holder and b.num_tokens == x.block_size:
            then = "stale" if b.reused_by else "hit"  # what 2f352ae's lookup would have met
            why += tr(f"designs_why.nano.at_old.{then}", lang, **fields)
        out.append(tr("designs_why.nano.miss", lang, i=b.index, why=why, bid=b.block_id))
    if x.vllm is not None and x.vllm.hit_tokens != x.hit_tokens:
        out.append(
            tr(
                f"designs_why.nano.vs_vllm.{x.commit}",
                lang,
                r=x.request_id,
                hit=x.hit_tokens,
                v=x.vllm.hit_tokens,
            )
        )
    return out + _vllm_lines(x.vllm, lang)
