"""The "Why?" of SGLang's radix tree and nano-vllm's block table, from their recorded events.

The lesson "Hash chains vs radix tree" feeds the two designs the requests of vLLM's recorded run
(designs/lesson.py) and keeps, per step, what each decided (designs/events.py). Three questions
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
designs). Sentences in English and 中文; token text is the caller's decoder's, quoted as text.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Optional, Sequence

from paged_kv_lab.why import explain as X
from paged_kv_lab.why.explain_text import hit_sentences

Pos = tuple[int, int]  # (step, index of the event in that step)

WHOLE_KEY = "whole_key"
DIVERGED = "diverged"
EVICTED = "evicted"
NEVER = "never"


class DesignError(ValueError):
    """The question has no answer in the steps shown so far."""


@dataclass(frozen=True)
class DesignRun:
    """The two designs' steps shown so far (``steps[i].step == i + 1``, each with its ``events``)
    and the vLLM run they follow; ``page_size`` is SGLang's."""

    steps: tuple[Any, ...]
    vllm: X.RecordedSteps
    page_size: int

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
        raise DesignError(f"request {request_id!r} was not looked up in SGLang's tree yet")
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
        raise DesignError(f"leaf #{node_id} was not evicted by this step")
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
    who took that block from the free deque since (the stale case)."""

    index: int
    hit: bool
    block_id: int
    reason: str = ""
    revived: bool = False
    num_tokens: int = 0
    holder: Optional[str] = None
    holder_step: Optional[int] = None
    holder_block: Optional[int] = None
    reused_by: Optional[str] = None
    reused_step: Optional[int] = None


@dataclass(frozen=True)
class NanoHit:
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
        raise DesignError(f"request {request_id!r} was not allocated in nano-vllm yet")
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
                    num_tokens=n,
                    **kw,
                )
            )
        out.append(
            NanoHit(
                request_id, step, prompt_len, bs, tuple(blocks), _vllm_hit(run, request_id, step)
            )
        )
    return out


# -- sentences -------------------------------------------------------------------------------
def _t(lang: str, en: str, zh: str, **kw) -> str:
    return (zh if lang == "zh" else en).format(**kw)


def _tok(run: DesignRun, token: Optional[int]) -> str:
    if token is None:
        return "—"
    text = run.text([token])
    return f"{text!r} (id {token})" if text is not None else f"id {token}"


def _vllm_lines(x: Optional[X.HitExplanation], lang: str) -> list[str]:
    if x is None:
        return [_t(lang, "vLLM did not admit it by this step.", "到这一步 vLLM 还没有接纳它。")]
    lines = hit_sentences(x, lang)[:-1]  # the code link is the panel's, under the answer
    return [_t(lang, "vLLM, the same request: {s}", "vLLM，同一请求：{s}", s=lines[0]), *lines[1:]]


def sglang_hit_sentences(x: SGLangHit, run: DesignRun, lang: str = "en") -> list[str]:
    kw = dict(
        r=x.request_id,
        s=x.step,
        hit=x.prefix_len,
        key=x.num_tokens,
        n=x.prompt_len,
        ps=x.page_size,
        node=x.node_id,
        v=x.nodes_visited,
        p=x.stop,
        ours=_tok(run, x.ours),
        theirs=_tok(run, x.theirs),
        q=x.other,
    )
    out = [
        _t(
            lang,
            "SGLang: {r}'s match_prefix at step {s} found {hit} of the {key} tokens of its key "
            "(its {n} prompt tokens but the last, in whole pages of {ps}), visiting {v} node(s) "
            "down to node #{node}.",
            "SGLang：{r} 在第 {s} 步的 match_prefix 在其键的 {key} 个 token 中找到 {hit} 个"
            "（{n} 个提示词 token 去掉最后一个，按每页 {ps} 个取整页），"
            "走过 {v} 个节点到达节点 #{node}。",
            **kw,
        )
    ]
    if x.reason == WHOLE_KEY:
        out.append(
            _t(
                lang,
                "The whole key matched: the tree can give no more, since the prompt's last token "
                "is always computed so that it yields the next token's logits.",
                "整个键都匹配了：树不能给出更多，因为提示词的最后一个 token 总要计算，"
                "以得到下一个 token 的 logits。",
            )
        )
    elif x.reason == DIVERGED:
        out.append(
            _t(
                lang,
                "The match stops at token {p}: {r} has {ours} there, the tree has {theirs} "
                "(put there by {q}). A radix tree compares token by token, so it keeps every "
                "token before the difference.",
                "匹配停在第 {p} 个 token：{r} 在那里是 {ours}，树里是 {theirs}（由 {q} 放入）。"
                "基数树逐 token 比较，所以差异之前的每个 token 都能命中。",
                **kw,
            )
        )
        if x.page_size > 1 and (x.stop or 0) > x.prefix_len:
            out.append(
                _t(
                    lang,
                    "The difference lies inside a page of {ps}, so the match ends at the page "
                    "before it ({hit} tokens).",
                    "差异落在一个 {ps} 个 token 的页之内，"
                    "所以匹配停在它之前的一页（{hit} 个 token）。",
                    **kw,
                )
            )
    elif x.reason == EVICTED:
        ev_ = x.evicted
        sp = ev_.span
        out.append(
            _t(
                lang,
                "The tree had held more of it: leaf #{leaf} (tokens {a}–{b} of {q}, inserted at "
                "step {qs}) was evicted at step {es} to make room for {y}, so the match stops at "
                "token {p}.",
                "树里曾有更多：叶子 #{leaf}（{q} 的第 {a}–{b} 个 token，第 {qs} 步插入）"
                "在第 {es} 步为了给 {y} 腾出空间被驱逐，所以匹配停在第 {p} 个 token。",
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
        out.append(
            _t(
                lang,
                "The match stops at token {p} ({ours}): no earlier request put a longer run of "
                "these tokens into the tree.",
                "匹配停在第 {p} 个 token（{ours}）：之前没有请求把更长的这段 token 放进树里。",
                **kw,
            )
        )
    if x.splits:
        out.append(
            _t(
                lang,
                "The match ended inside an edge, so SGLang split that node after {k} tokens "
                "(_split_node): the tree keeps one edge per divergence.",
                "匹配停在一条边的中间，所以 SGLang 在 {k} 个 token 处拆开了那个节点"
                "（_split_node）：树在每个分叉处保留一条边。",
                k=", ".join(map(str, x.splits)),
            )
        )
    for s in x.sources:
        out.append(
            _t(
                lang,
                "Tokens {a}–{b} of the match were inserted by {q} when it finished at step {qs}.",
                "匹配中的第 {a}–{b} 个 token 由 {q} 在第 {qs} 步结束时插入。",
                a=s.start,
                b=min(s.end, x.prefix_len) - 1,
                q=s.request_id,
                qs=s.step,
            )
        )
    if x.vllm is not None and x.vllm.hit_tokens != x.prefix_len:
        out.append(
            _t(
                lang,
                "So the tree gives {r} {hit} tokens and vLLM {v}: vLLM hits whole blocks of {bs} "
                "only, the tree whole pages of {ps}.",
                "所以树给 {r} {hit} 个 token，vLLM 给 {v} 个：vLLM 只命中 {bs} 个 token 的整块，"
                "树按 {ps} 个 token 的整页命中。",
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
    out = [
        _t(
            lang,
            "SGLang evicted leaf #{leaf} ({k} tokens) at step {s}: {y} needed {need} slots and "
            "only {free} were free, so the scheduler asked the tree to evict the shortfall of "
            "{short} token(s) (evict_from_tree_cache → evict).",
            "SGLang 在第 {s} 步驱逐了叶子 #{leaf}（{k} 个 token）：{y} 需要 {need} 个槽位，"
            "只有 {free} 个空闲，于是调度器请树驱逐差额 {short} 个 token"
            "（evict_from_tree_cache → evict）。",
            **kw,
        )
    ]
    if x.leaves:
        order = ", ".join(
            _t(
                lang,
                "#{n} ({k} tok, {p})",
                "#{n}（{k} 个 token，{p}）",
                n=leaf.node_id,
                k=leaf.num_tokens,
                p=leaf.priority,
            )
            for leaf in x.leaves
        )
        out.append(
            _t(
                lang,
                "The evictable leaves (no children, lock_ref 0), smallest priority first "
                "(LRU: last access time): {order}. Locked nodes, on a running request's path, "
                "are never among them.",
                "可驱逐的叶子（没有子节点、lock_ref 为 0），按优先级从小到大"
                "（LRU：最后访问时间）：{order}。加锁的节点在运行中请求的路径上，从不在其中。",
                order=order,
            )
        )
    if x.rank == 0:
        out.append(
            _t(
                lang,
                "Leaf #{leaf} came first: the least recently used (priority {pr}).",
                "叶子 #{leaf} 排在第一：最近最少使用（优先级 {pr}）。",
                **kw,
            )
        )
    elif x.rank is not None:
        out.append(
            _t(
                lang,
                "Leaf #{leaf} was number {r} in that order: the leaves before it did not free "
                "enough.",
                "叶子 #{leaf} 在这个顺序中排第 {r}：它前面的叶子释放得不够。",
                r=x.rank + 1,
                **{k: v for k, v in kw.items() if k != "r"},
            )
        )
    else:
        out.append(
            _t(
                lang,
                "Leaf #{leaf} became a leaf during this eviction, when its last child went, and "
                "joined the heap.",
                "叶子 #{leaf} 在这次驱逐中才成为叶子（它最后一个子节点被驱逐），随后进入堆。",
                **kw,
            )
        )
    out.append(
        _t(
            lang,
            "Whole leaves go: the eviction freed {freed} token(s) for a shortfall of {short}.",
            "整片叶子一起走：为了 {short} 个 token 的差额，驱逐释放了 {freed} 个。",
            **kw,
        )
    )
    if x.span is not None:
        out.append(
            _t(
                lang,
                "Its tokens ({a}–{b} of {q}) were inserted when {q} finished at step {qs}.",
                "它的 token（{q} 的第 {a}–{b} 个）在 {q} 于第 {qs} 步结束时插入。",
                a=x.span.start,
                b=x.span.end - 1,
                q=x.span.request_id,
                qs=x.span.step,
            )
        )
    return out


_NANO_REASON = {
    "partial": (
        "it holds only {k} of {bs} tokens, so it has no hash (never shared)",
        "它只有 {bs} 个中的 {k} 个 token，没有哈希（从不共享）",
    ),
    "absent": (
        "its chained hash is not in hash_to_block_id: no earlier request filled a block with "
        "these tokens after this prefix",
        "它的链式哈希不在 hash_to_block_id 中：之前没有请求在这个前缀之后用这些 token 填满过一块",
    ),
    "stale": (
        "hash_to_block_id still names block {hb} ({q}'s, step {qs}), but block {hb} was taken "
        "from the free deque for {y} at step {ys}, so its tokens are gone",
        "hash_to_block_id 仍指向块 {hb}（{q} 的，第 {qs} 步），但块 {hb} 在第 {ys} 步"
        "被 {y} 从空闲双端队列取走，它的 token 已不在",
    ),
    "collision": (
        "the block its hash names holds other token ids (a hash collision, caught by the token "
        "check)",
        "哈希指向的块里是别的 token id（哈希碰撞，被 token 检查拦下）",
    ),
    "after_miss": (
        "an earlier block missed, and after a miss nano-vllm counts every later block as a miss",
        "前面的块已未命中；一旦未命中，nano-vllm 把之后每一块都算作未命中",
    ),
    "non_cache_token": ("it holds a token that never hits", "它含有一个永不命中的 token"),
}


def nano_sentences(x: NanoHit, lang: str = "en") -> list[str]:
    out = [
        _t(
            lang,
            "nano-vllm: {r}'s allocate at step {s} hit {hit} of its {n} prompt tokens, block by "
            "block (blocks of {bs}; every full block counts, the prompt's last one included):",
            "nano-vllm：{r} 在第 {s} 步的 allocate 命中其 {n} 个提示词 token 中的 {hit} 个，"
            "逐块查找（每块 {bs} 个；每个满块都算，包括提示词的最后一块）：",
            r=x.request_id,
            s=x.step,
            hit=x.hit_tokens,
            n=x.prompt_len,
            bs=x.block_size,
        )
    ]
    for b in x.blocks:
        if b.hit:
            out.append(
                _t(
                    lang,
                    "block {i}: hit block {bid}{rev}{src}.",
                    "第 {i} 块：命中块 {bid}{rev}{src}。",
                    i=b.index,
                    bid=b.block_id,
                    rev=_t(lang, ", back from the free deque", "，从空闲双端队列中取回")
                    if b.revived
                    else "",
                    src=_t(
                        lang,
                        " ({q} filled it at step {qs})",
                        "（{q} 在第 {qs} 步填满它）",
                        q=b.holder,
                        qs=b.holder_step,
                    )
                    if b.holder
                    else "",
                )
            )
            continue
        en, zh = _NANO_REASON.get(b.reason, ("{reason}", "{reason}"))
        why = _t(
            lang,
            en,
            zh,
            k=b.num_tokens,
            bs=x.block_size,
            hb=b.holder_block,
            q=b.holder or "—",
            qs=b.holder_step,
            y=b.reused_by or "—",
            ys=b.reused_step,
            reason=b.reason,
        )
        out.append(
            _t(
                lang,
                "block {i}: miss, {why}; it took block {bid} from the free deque's left.",
                "第 {i} 块：未命中，{why}；它从空闲双端队列左端取走块 {bid}。",
                i=b.index,
                why=why,
                bid=b.block_id,
            )
        )
    if x.vllm is not None and x.vllm.hit_tokens != x.hit_tokens:
        out.append(
            _t(
                lang,
                "So nano-vllm gives {r} {hit} tokens and vLLM {v}: vLLM always leaves the "
                "prompt's last token to compute, nano-vllm hits every full block.",
                "所以 nano-vllm 给 {r} {hit} 个 token，vLLM 给 {v} 个：vLLM 总会留下提示词最后一个 "
                "token 来计算，nano-vllm 命中每一个满块。",
                r=x.request_id,
                hit=x.hit_tokens,
                v=x.vllm.hit_tokens,
            )
        )
    return out + _vllm_lines(x.vllm, lang)
