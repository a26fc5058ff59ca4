"""The answers of why.explain / why.explain_blocks as sentences, in English and 中文.

Plain text, shared by the CLI and the app; token text only ever comes from the caller's
decoder and is quoted, never formatted as markup. Each answer ends with the code that made
the decision (paged_kv_lab.text.source_links): the vLLM 0.33.0 permalink and our function.
"""

from __future__ import annotations

from typing import Optional, Sequence

from paged_kv_lab.text.sentences import reason as reason_words
from paged_kv_lab.text.sentences import short_hash
from paged_kv_lab.text.source_links import FUNCTIONS, Call, CodeLink
from paged_kv_lab.why import explain as X
from paged_kv_lab.why.explain_blocks import BlockLife, BlockMoment, Comparison


def _t(lang: str, en: str, zh: str, **kw) -> str:
    return (zh if lang == "zh" else en).format(**kw)


def _quote(text: Optional[str], ids: Sequence[int]) -> str:
    if text is not None:
        return repr(text)
    return "[" + ", ".join(str(i) for i in ids) + "]"


def _salt_words(s: Optional[str], lang: str) -> str:
    return f"cache_salt {s!r}" if s else _t(lang, "no cache_salt", "没有 cache_salt")


def code_line(link: CodeLink, lang: str = "en") -> str:
    return _t(
        lang,
        "Code: vLLM {q} {u} · ours {o}",
        "代码：vLLM {q} {u} · 本项目 {o}",
        q=link.vllm.qualname,
        u=link.vllm.url,
        o=link.ours.target,
    )


# -- why this hit length ------------------------------------------------------------------------
def hit_sentences(x: X.HitExplanation, lang: str = "en") -> list[str]:
    """The headline, the reason (with the texts around a differing token) and the code link."""
    bs, i = x.block_size, x.block_index
    kw = dict(
        r=x.request_id,
        s=x.step,
        hit=x.hit_tokens,
        n=x.num_tokens,
        k=x.hit_blocks,
        bs=bs,
        i=i,
        a=(i or 0) * bs,
        b=(i or 0) * bs + bs - 1,
        h=short_hash(x.block_hash),
        q=x.other_request,
        cs=x.cached_step,
        cb=x.cached_block,
        ls=x.lost_step,
        y=x.evicted_for,
        p=x.token_position,
        cap=x.cap,
    )
    if x.resumed:
        out = [
            _t(
                lang,
                "{r} resumed after preemption at step {s}: its prefix-cache "
                "hit is {hit} of its {n} tokens ({k} × {bs}-token blocks).",
                "{r} 在第 {s} 步从抢占中恢复：前缀缓存命中其 {n} 个 "
                "token 中的 {hit} 个（{k} 个满块 × 每块 {bs} 个）。",
                **kw,
            )
        ]
    else:
        out = [
            _t(
                lang,
                "{r} was admitted at step {s} with a prefix-cache hit of {hit} of its {n} tokens "
                "({k} × {bs}-token blocks).",
                "{r} 在第 {s} 步被接纳：前缀缓存命中其 {n} 个 token "
                "中的 {hit} 个（{k} 个满块 × 每块 {bs} 个）。",
                **kw,
            )
        ]
    stop = _t(
        lang,
        "The hit stops at block {i} (tokens {a}–{b}, hash {h}): ",
        "命中停在第 {i} 块（token {a}–{b}，哈希 {h}）：",
        **kw,
    )
    r = x.reason
    if r == X.NEVER_COMPUTED:
        out.append(
            stop
            + _t(
                lang,
                "no request had computed this block after this prefix, so its hash was never "
                "in the cache.",
                "此前没有任何请求在这个前缀之后算过这一块，它的哈希从未进入缓存。",
            )
        )
    elif r in (X.EVICTED, X.RESET):
        who = (
            _t(
                lang,
                "request {q} computed it at step {cs} (physical block {cb})",
                "请求 {q} 在第 {cs} 步算过它（物理块 {cb}）",
                **kw,
            )
            if x.other_request
            else _t(
                lang,
                "it was cached before step 1 (physical block {cb})",
                "它在第 1 步之前已缓存（物理块 {cb}）",
                **kw,
            )
        )
        if r == X.RESET:
            lost = _t(
                lang,
                "reset_prefix_cache dropped every hash at step {ls}",
                "第 {ls} 步 reset_prefix_cache 清空了所有哈希",
                **kw,
            )
        elif x.lost_reason == "evict_blocks":
            lost = _t(
                lang,
                "evict_blocks took its hash away at step {ls}",
                "第 {ls} 步 evict_blocks 移除了它的哈希",
                **kw,
            )
        else:
            lost = _t(
                lang,
                "it was evicted at step {ls}: the block was reused from the head of the free queue "
                "for request {y}",
                "它在第 {ls} 步被驱逐：该块从空闲队列队头被取出，复用给了请求 {y}",
                **kw,
            )
        out.append(stop + who + _t(lang, ", but ", "，但") + lost + _t(lang, ".", "。"))
    elif r == X.SALT:
        out.append(
            stop
            + _t(
                lang,
                "request {q} computed the same tokens at step {cs}, but "
                "it had {o} and this request has {m}; the salt enters "
                "the hash of block 0, so every hash of the chain differs.",
                "请求 {q} 在第 {cs} 步算过相同的 token，但它用的是 {o}，"
                "而本请求用的是 {m}；salt 参与第 0 块的哈希，所以整条链的哈希都不同。",
                o=_salt_words(x.other_salt, lang),
                m=_salt_words(x.salt, lang),
                **kw,
            )
        )
    elif r == X.TOKENS_DIFFER:
        out.append(
            stop
            + _t(
                lang,
                "the nearest cached chain, request {q}'s (cached at step {cs}), first differs "
                "from this one at token {p}.",
                "最接近的已缓存链（请求 {q} 的，第 {cs} 步缓存）在第 {p} 个 token "
                "处与它第一次不同。",
                **kw,
            )
        )
        here = _quote(x.text_here, x.ids_here)
        other = _quote(x.text_other, x.ids_other)
        if x.ids_before:
            out.append(
                _t(
                    lang,
                    "Shared just before it: {t}",
                    "紧挨在它之前的共同部分：{t}",
                    t=_quote(x.text_before, x.ids_before),
                )
            )
        out.append(
            _t(
                lang,
                "From token {p}: {r}: {here} · {q}: {other}",
                "从第 {p} 个 token 起：{r}：{here} · {q}：{other}",
                here=here,
                other=other,
                **kw,
            )
        )
    elif r == X.CACHING_OFF:
        out.append(
            _t(
                lang,
                "Prefix caching is off (enable_prefix_caching = false): "
                "nothing is looked up and every token is computed.",
                "前缀缓存已关闭（enable_prefix_caching = false）：不查缓存，每个 token 都要计算。",
            )
        )
    elif r == X.SHORTER_THAN_BLOCK:
        out.append(
            _t(
                lang,
                "The prompt ({n} tokens) is shorter than one block ({bs} tokens): "
                "only full blocks are hashed and cached, so there is nothing to hit.",
                "提示词（{n} 个 token）比一个块（{bs} 个 token）"
                "还短：只有满块才会被哈希和缓存，所以无从命中。",
                **kw,
            )
        )
    elif r == X.PARTIAL_BLOCK:
        out.append(
            _t(
                lang,
                "Every full block hit. The last {rest} tokens fill only part of "
                "block {i}, and a partial block is never cached: they are computed.",
                "所有满块都命中了。最后 {rest} 个 token 只占第 {i} "
                "块的一部分，而未满的块从不缓存：它们要重新计算。",
                rest=x.num_tokens - x.hit_tokens,
                **kw,
            )
        )
    elif r == X.CAPPED_LAST_TOKEN:
        out.append(
            _t(
                lang,
                "Block {i} is cached too, but a hit is capped at num_tokens "
                "− 1 = {cap} tokens: the last token is always computed, "
                "because its logits are needed to sample the next token.",
                "第 {i} 块其实也在缓存里，但命中最多 num_tokens − 1 = {cap} 个 "
                "token：最后一个 token 总要计算，因为采样下一个 token 需要它的 logits。",
                **kw,
            )
        )
    elif r == X.MAX_CACHE_HIT_LENGTH:
        out.append(
            _t(
                lang,
                "The hit is capped by the setting max_cache_hit_length = {cap} tokens.",
                "命中长度被设置 max_cache_hit_length = {cap} 限制。",
                **kw,
            )
        )
    elif r in (X.SLIDING_WINDOW, X.GROUPS_DISAGREE):
        kept = ", ".join(str(k) for k in x.kept_blocks) or "-"
        if r == X.GROUPS_DISAGREE:
            out.append(
                _t(
                    lang,
                    "The full-attention group has block {i} cached, but in a hybrid model all "
                    "KV cache groups must agree on the hit: the sliding-window group kept only "
                    "blocks [{kept}] of this chain, so the hit is cut to {hit} tokens.",
                    "全注意力组缓存着第 {i} 块，但混合模型中各 KV "
                    "缓存组必须对命中长度达成一致：滑动窗口组只保留了这条链的第 "
                    "[{kept}] 块，因此命中被截到 {hit} 个 token。",
                    kept=kept,
                    **kw,
                )
            )
        else:
            out.append(
                _t(
                    lang,
                    "A sliding-window group can hit only where it kept the blocks of the "
                    "window before the hit's end; it kept blocks [{kept}] of this chain.",
                    "滑动窗口组只能在保留了命中终点之前那一窗口的块"
                    "的位置命中；它保留了这条链的第 [{kept}] 块。",
                    kept=kept,
                    **kw,
                )
            )
    elif r == X.CANNOT_REHASH:
        out.append(
            _t(
                lang,
                "This recording kept no block hashes (a trace written before snapshots kept the "
                "engine's hashes), so the first missing block cannot be named.",
                "这份录制没有保存块哈希（在快照开始保存引擎哈希之"
                "前写下的 trace），因此无法指出第一个缺失的块。",
            )
        )
    out.append(code_line(FUNCTIONS["get_computed_blocks"], lang))
    return out


# -- the life of a block ------------------------------------------------------------------------
def moment_sentence(m: BlockMoment, lang: str = "en") -> str:
    kw = dict(
        s=m.step,
        r=m.request_id,
        i=m.logical_index,
        ref=m.ref_cnt,
        h=short_hash(m.block_hash),
        lost=short_hash(m.lost_hash),
        qp=m.queue_pos,
        g=m.group,
    )
    head = _t(lang, "step {s}: ", "第 {s} 步：", **kw)
    if m.kind == "allocated":
        return head + _t(
            lang,
            "allocated to {r} as its logical block {i}, popped from the free-queue head; "
            "ref_cnt {ref}",
            "从空闲队列队头取出，分配给 {r} 作为其第 {i} 个逻辑块；ref_cnt {ref}",
            **kw,
        )
    if m.kind in ("touched", "freed") and m.request_id is None:
        return head + (
            _t(
                lang,
                "pinned by the CPU tier while it is copied; ref_cnt {ref}",
                "拷贝期间被 CPU 层钉住；ref_cnt {ref}",
                **kw,
            )
            if m.kind == "touched"
            else _t(
                lang,
                "released by the CPU tier (its copy is done); ref_cnt {ref}",
                "CPU 层释放了它（拷贝已完成）；ref_cnt {ref}",
                **kw,
            )
        )
    if m.kind == "touched":
        rescued = (
            _t(
                lang,
                ", rescued from free-queue position {qp}",
                "，从空闲队列第 {qp} 位被救回",
                **kw,
            )
            if m.queue_pos is not None
            else ""
        )
        return (
            head
            + _t(
                lang,
                "hit by {r} as its logical block {i}; ref_cnt {ref}",
                "被 {r} 命中，作为其第 {i} 个逻辑块；ref_cnt {ref}",
                **kw,
            )
            + rescued
        )
    if m.kind == "cached":
        text = (
            _t(lang, " — prefix {t}", " —— 前缀 {t}", t=repr(m.prefix_text[-60:]))
            if m.prefix_text
            else ""
        )
        return (
            head
            + _t(
                lang,
                "got hash {h} (group {g}) for {r}'s tokens {toks}",
                "获得哈希 {h}（组 {g}），对应 {r} 的 token {toks}",
                toks=list(m.token_ids),
                **kw,
            )
            + text
        )
    if m.kind == "evicted":
        if m.reason == "evict_blocks":
            return head + _t(
                lang, "lost hash {lost}: evict_blocks", "失去哈希 {lost}：evict_blocks", **kw
            )
        return head + _t(
            lang,
            "evicted: lost hash {lost}, reused for {r}",
            "被驱逐：失去哈希 {lost}，复用给 {r}",
            **kw,
        )
    if m.kind == "reset":
        return head + _t(
            lang,
            "lost hash {lost}: reset_prefix_cache",
            "失去哈希 {lost}：reset_prefix_cache",
            **kw,
        )
    if m.kind == "freed":
        where = {
            "head": _t(
                lang,
                "; joined the free queue at the head (no hash: reused first)",
                "；进入空闲队列队头（无哈希：最先被复用）",
            ),
            "tail": _t(
                lang,
                "; joined the free queue at the tail (hashed: can still be hit)",
                "；进入空闲队列队尾（有哈希：仍可被命中）",
            ),
        }.get(m.joined, "")
        return (
            head
            + _t(
                lang,
                "freed by {r} ({why}); ref_cnt {ref}",
                "被 {r} 释放（{why}）；ref_cnt {ref}",
                why=reason_words(m.reason, lang),
                **kw,
            )
            + where
        )
    if m.kind == "window_skipped":
        return head + _t(lang, "left {r}'s sliding window", "滑出了 {r} 的滑动窗口", **kw)
    return head + m.kind


def life_sentences(life: BlockLife, lang: str = "en") -> list[str]:
    if life.is_null:
        return [
            _t(
                lang,
                "Block {b} is the null block: it stands in for blocks outside "
                "a sliding window and is never allocated, hashed or freed.",
                "块 {b} 是空块（null block）：代替滑动窗口外的块，从不分配、哈希或释放。",
                b=life.block_id,
            )
        ]
    if not life.moments:
        return [
            _t(
                lang,
                "Block {b} was never used in this run.",
                "块 {b} 在本次运行中从未被使用。",
                b=life.block_id,
            )
        ]
    out = [_t(lang, "The life of block {b}:", "块 {b} 的一生：", b=life.block_id)]
    out += [moment_sentence(m, lang) for m in life.moments]
    last = life.states[-1]
    if last.queue_pos is not None:
        out.append(
            _t(
                lang,
                "At the end (step {s}) it is free, at position {p} of the free queue (0 = head).",
                "最后（第 {s} 步）它是空闲的，在空闲队列第 {p} 位（0 = 队头）。",
                s=last.step,
                p=last.queue_pos,
            )
        )
    return out


# -- two requests side by side --------------------------------------------------------------------
def comparison_sentences(c: Comparison, lang: str = "en") -> list[str]:
    same = sum(1 for r in c.rows if r.same)
    out = [
        _t(
            lang,
            "{a} and {b}: {n} full blocks of their chains have the same hash.",
            "{a} 与 {b}：两条链有 {n} 个满块哈希相同。",
            a=c.a,
            b=c.b,
            n=same,
        )
    ]
    if c.reason == X.SALT:
        out.append(
            _t(
                lang,
                "They diverge at block {d} although the tokens match: {x} vs {y} (the salt enters "
                "block 0's hash).",
                "它们在第 {d} 块分叉，尽管 token 相同：{x} 对 {y}（salt 参与第 0 块的哈希）。",
                d=c.diverge_index,
                x=_salt_words(c.salt_a, lang),
                y=_salt_words(c.salt_b, lang),
            )
        )
    elif c.reason == X.TOKENS_DIFFER:
        out.append(
            _t(
                lang,
                "They diverge at block {d}: token {p} differs.",
                "它们在第 {d} 块分叉：第 {p} 个 token 不同。",
                d=c.diverge_index,
                p=c.token_position,
            )
        )
        if c.text_a is not None or c.text_b is not None:
            out.append(
                _t(
                    lang,
                    "From token {p}: {a}: {x} · {b}: {y}",
                    "从第 {p} 个 token 起：{a}：{x} · {b}：{y}",
                    p=c.token_position,
                    a=c.a,
                    b=c.b,
                    x=repr(c.text_a),
                    y=repr(c.text_b),
                )
            )
    else:
        out.append(
            _t(
                lang,
                "They never diverge: one chain is a prefix of the other.",
                "两条链从不分叉：一条是另一条的前缀。",
            )
        )
    for sp in c.shared:
        out.append(
            _t(
                lang,
                "They shared physical block {k} (logical block {i}) from step {f} to step {l}.",
                "它们从第 {f} 步到第 {l} 步共享物理块 {k}（第 {i} 个逻辑块）。",
                k=sp.block_id,
                i=sp.index,
                f=sp.first_step,
                l=sp.last_step,
            )
        )
    for r in c.rows:
        if r.same and not r.shared:
            lost = (
                _t(
                    lang,
                    " (a block holding it lost the hash at step {s})",
                    "（持有它的块在第 {s} 步失去了哈希）",
                    s=", ".join(map(str, r.lost_steps)),
                )
                if r.lost_steps
                else ""
            )
            both = sorted(set(r.blocks_a) & set(r.blocks_b))
            if both:
                out.append(
                    _t(
                        lang,
                        "Block {i}: same hash; both used physical "
                        "block {k}, one after the other{x}.",
                        "第 {i} 块：哈希相同；两者先后使用了物理块 {k}{x}。",
                        i=r.index,
                        k=both[0],
                        x=lost,
                    )
                )
            else:
                out.append(
                    _t(
                        lang,
                        "Block {i}: same hash, but held in different "
                        "physical blocks ({ka} / {kb}){x}.",
                        "第 {i} 块：哈希相同，但存放在不同的物理块中（{ka} / {kb}）{x}。",
                        i=r.index,
                        ka=list(r.blocks_a),
                        kb=list(r.blocks_b),
                        x=lost,
                    )
                )
    if not c.shared:
        out.append(
            _t(lang, "They never held a block at the same time.", "它们从未同时持有同一个块。")
        )
    return out


# -- the code behind a step ------------------------------------------------------------------------
def call_lines(calls: Sequence[Call], lang: str = "en") -> list[str]:
    return [
        f"{'  ' * c.depth}{c.link.name}  —  vLLM {c.link.vllm.url}  ·  {c.link.ours.target}"
        for c in calls
    ]


def step_calls(run: X.RecordedSteps, step: int) -> list:
    """The functions that ran in ``step``, in call order (text.source_links.call_order)."""
    from paged_kv_lab.text.source_links import call_order

    if not 1 <= step <= len(run.records):
        raise X.ExplainError(f"step {step} is outside this run (1..{len(run.records)})")
    return list(call_order(run.records[step - 1].events, len(run.groups())))


def answer(
    run: X.RecordedSteps,
    *,
    request: Optional[str] = None,
    step: Optional[int] = None,
    vs: Optional[str] = None,
    block: Optional[int] = None,
    calls: bool = False,
    lang: str = "en",
) -> list[str]:
    """The CLI's answer, as lines: a request's hit (or two requests side by side with ``vs``),
    a block's life, or with ``calls`` the functions that ran in ``step``. ExplainError when the
    question does not fit the run."""
    from paged_kv_lab.why.explain_blocks import compare_requests, life_of_block

    out: list[str] = []
    if calls:
        if step is None:
            raise X.ExplainError("--calls needs --step N")
        out.append(
            _t(
                lang,
                "Step {s}, the functions that ran, in call order:",
                "第 {s} 步按调用顺序运行的函数：",
                s=step,
            )
        )
        out += call_lines(step_calls(run, step), lang)
    if block is not None:
        out += life_sentences(life_of_block(run, block), lang)
    if request is not None and vs is not None:
        out += comparison_sentences(compare_requests(run, request, vs), lang)
    elif request is not None:
        for x in X.explain_hit(run, request, step):
            out += hit_sentences(x, lang)
    if not out:
        raise X.ExplainError(
            "ask about something: --request ID [--step N] [--vs ID], --block N, or --calls --step N"
        )
    return out
