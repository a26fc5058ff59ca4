"""The answers of why.explain / why.explain_blocks as sentences, from the catalogue (why.json).

Plain text, shared by the CLI and the app; token text only ever comes from the caller's
decoder and is quoted, never formatted as markup. Each answer ends with the code that made
the decision (paged_kv_lab.why.source_links): the vLLM permalink, into the tag that
``source_links.VLLM_TAG`` names, and our function.
"""

from __future__ import annotations

from typing import Optional, Sequence

from paged_kv_lab.text.i18n import Text, tr
from paged_kv_lab.why import explain as X
from paged_kv_lab.why.explain_blocks import BlockLife, BlockMoment, Comparison
from paged_kv_lab.why.sentences import reason as reason_words
from paged_kv_lab.why.sentences import short_hash
from paged_kv_lab.why.source_links import FUNCTIONS, Call, CodeLink


def _quote(text: Optional[str], ids: Sequence[int]) -> str:
    if text is not None:
        return repr(text)
    return "[" + ", ".join(str(i) for i in ids) + "]"


def _salt_words(s: Optional[str], lang: str) -> str:
    return f"cache_salt {s!r}" if s else tr("why.salt.none", lang)


def _keys_words(keys: Optional[str], lang: str) -> str:
    return keys if keys else tr("why.keys.none", lang)


def code_line(link: CodeLink, lang: str = "en") -> str:
    return tr("why.code_line", lang, q=link.vllm.qualname, u=link.vllm.url, o=link.ours.target)


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
        u=x.unit,
        c=", ".join(str(b) for b in x.copy_blocks) or "-",
    )
    if x.resumed:
        out = [tr("why.hit.resumed", lang, **kw)]
    else:
        out = [tr("why.hit.admitted", lang, **kw)]
    stop = tr("why.hit.stop", lang, **kw)
    r = x.reason
    if r in (X.EVICTED, X.RESET):
        who = (
            tr("why.hit.computed_by", lang, **kw)
            if x.other_request
            else tr("why.hit.cached_before_start", lang, **kw)
        )
        if r == X.RESET:
            lost = tr("why.hit.lost.reset", lang, **kw)
        elif x.lost_reason == "evict_blocks":
            lost = tr("why.hit.lost.evict_blocks", lang, **kw)
        else:
            lost = tr("why.hit.lost.evicted", lang, **kw)
        out.append(stop + tr("why.hit.lost", lang, who=who, lost=lost))
    elif r == X.SALT:
        o, m = _salt_words(x.other_salt, lang), _salt_words(x.salt, lang)
        out.append(stop + tr("why.hit.salt", lang, o=o, m=m, **kw))
    elif r == X.EXTRA_KEYS:
        o, m = _keys_words(x.other_extra_keys, lang), _keys_words(x.extra_keys, lang)
        out.append(stop + tr("why.hit.extra_keys", lang, o=o, m=m, **kw))
    elif r == X.TOKENS_DIFFER:
        out.append(stop + tr("why.hit.tokens_differ", lang, **kw))
        here = _quote(x.text_here, x.ids_here)
        other = _quote(x.text_other, x.ids_other)
        if x.ids_before:
            out.append(tr("why.hit.shared_before", lang, t=_quote(x.text_before, x.ids_before)))
        out.append(tr("why.hit.texts", lang, here=here, other=other, **kw))
    elif r in X.MISS_REASONS + X.RULE_REASONS:  # one sentence per reason: why.hit.<reason>
        line = tr(
            f"why.hit.{r}",
            lang,
            kept=", ".join(str(k) for k in x.kept_blocks) or "-",
            rest=x.num_tokens - x.hit_tokens,
            **kw,
        )
        out.append(stop + line if r == X.NEVER_COMPUTED else line)
    if r == X.SKIP_READING_PREFIX_CACHE:
        out.append(code_line(FUNCTIONS["prefix_cache_lookup_enabled"], lang))
    out.append(code_line(FUNCTIONS["get_computed_blocks"], lang))
    if r == X.PARTIAL_HIT:  # who keyed the block inside, and who hands out the copy
        out.append(code_line(FUNCTIONS["cache_partial_block"], lang))
        out.append(code_line(FUNCTIONS["take_kv_cache_block_copies"], lang))
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
    head = tr("why.life.step", lang, **kw)
    if m.kind == "allocated":
        return head + tr("why.life.allocated", lang, **kw)
    if m.kind == "freed" and m.reason == "copied":
        return head + tr("why.life.copy_released", lang, **kw)
    if m.kind in ("touched", "freed") and m.request_id is None:
        return head + (
            tr("why.life.cpu_pinned", lang, **kw)
            if m.kind == "touched"
            else tr("why.life.cpu_released", lang, **kw)
        )
    if m.kind == "touched":
        rescued = tr("why.life.rescued", lang, **kw) if m.queue_pos is not None else ""
        return head + tr("why.life.touched", lang, **kw) + rescued
    if m.kind == "cached":
        text = tr("why.life.prefix", lang, t=repr(m.prefix_text[-60:])) if m.prefix_text else ""
        return head + tr("why.life.cached", lang, toks=list(m.token_ids), **kw) + text
    if m.kind == "evicted":
        if m.reason == "evict_blocks":
            return head + tr("why.life.evict_blocks", lang, **kw)
        if m.reason == "rekeyed":
            return head + tr("why.life.rekeyed", lang, **kw)
        return head + tr("why.life.evicted", lang, **kw)
    if m.kind == "reset":
        return head + tr("why.life.reset", lang, **kw)
    if m.kind == "freed":
        where = {
            "head": tr("why.life.joined_head", lang),
            "tail": tr("why.life.joined_tail", lang),
        }.get(m.joined, "")
        return head + tr("why.life.freed", lang, why=reason_words(m.reason, lang), **kw) + where
    if m.kind == "window_skipped":
        return head + tr("why.life.window_skipped", lang, **kw)
    if m.kind == "cached_partial":
        kw["h"] = short_hash(m.entry_hash)
        return head + tr("why.life.cached_partial", lang, n=m.num_tokens, **kw)
    if m.kind == "copied":
        return head + tr(f"why.life.copied.{m.reason}", lang, src=m.source_block_id, **kw)
    if m.kind == "copy_source":
        return head + tr(f"why.life.copy_source.{m.reason}", lang, dst=m.copy_block_id, **kw)
    return head + m.kind


def life_sentences(life: BlockLife, lang: str = "en") -> list[str]:
    if life.is_null:
        return [tr("why.life.null_block", lang, b=life.block_id)]
    if not life.moments:
        return [tr("why.life.never_used", lang, b=life.block_id)]
    out = [tr("why.life.title", lang, b=life.block_id)]
    out += [moment_sentence(m, lang) for m in life.moments]
    last = life.states[-1]
    if last.queue_pos is not None:
        out.append(tr("why.life.end_free", lang, s=last.step, p=last.queue_pos))
    return out


# -- two requests side by side --------------------------------------------------------------------
def comparison_sentences(c: Comparison, lang: str = "en") -> list[str]:
    same = sum(1 for r in c.rows if r.same)
    out = [tr("why.compare.same", lang, a=c.a, b=c.b, n=same)]
    if c.reason == X.SALT:
        out.append(
            tr(
                "why.compare.salt",
                lang,
                d=c.diverge_index,
                x=_salt_words(c.salt_a, lang),
                y=_salt_words(c.salt_b, lang),
            )
        )
    elif c.reason == X.EXTRA_KEYS:
        x, y = _keys_words(c.keys_a, lang), _keys_words(c.keys_b, lang)
        out.append(tr("why.compare.extra_keys", lang, d=c.diverge_index, x=x, y=y))
    elif c.reason == X.TOKENS_DIFFER:
        out.append(tr("why.compare.tokens_differ", lang, d=c.diverge_index, p=c.token_position))
        if c.text_a is not None or c.text_b is not None:
            out.append(
                tr(
                    "why.compare.texts",
                    lang,
                    p=c.token_position,
                    a=c.a,
                    b=c.b,
                    x=repr(c.text_a),
                    y=repr(c.text_b),
                )
            )
    else:
        out.append(tr("why.compare.never_diverge", lang))
    for sp in c.shared:
        out.append(
            tr(
                "why.compare.shared",
                lang,
                k=sp.block_id,
                i=sp.index,
                f=sp.first_step,
                l=sp.last_step,
            )
        )
    for r in c.rows:
        if r.same and not r.shared:
            lost = (
                tr("why.compare.lost", lang, s=", ".join(map(str, r.lost_steps)))
                if r.lost_steps
                else ""
            )
            both = sorted(set(r.blocks_a) & set(r.blocks_b))
            if both:
                out.append(tr("why.compare.same_block", lang, i=r.index, k=both[0], x=lost))
            else:
                out.append(
                    tr(
                        "why.compare.different_blocks",
                        lang,
                        i=r.index,
                        ka=list(r.blocks_a),
                        kb=list(r.blocks_b),
                        x=lost,
                    )
                )
    if not c.shared:
        out.append(tr("why.compare.never_together", lang))
    return out


# -- the code behind a step ------------------------------------------------------------------------
def call_lines(calls: Sequence[Call], lang: str = "en") -> list[str]:
    return [
        f"{'  ' * c.depth}{c.link.name}  —  vLLM {c.link.vllm.url}  ·  {c.link.ours.target}"
        for c in calls
    ]


def step_calls(run: X.RecordedSteps, step: int) -> list:
    """The functions that ran in ``step``, in call order (why.source_links.call_order)."""
    from paged_kv_lab.why.source_links import call_order

    if not 1 <= step <= len(run.records):
        raise X.ExplainError(Text("why.error.no_step", {"step": step, "last": len(run.records)}))
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
            raise X.ExplainError(Text("why.error.calls_need_step"))
        out.append(tr("why.calls_title", lang, s=step))
        out += call_lines(step_calls(run, step), lang)
    if block is not None:
        out += life_sentences(life_of_block(run, block), lang)
    if request is not None and vs is not None:
        out += comparison_sentences(compare_requests(run, request, vs), lang)
    elif request is not None:
        for x in X.explain_hit(run, request, step):
            out += hit_sentences(x, lang)
    if not out:
        raise X.ExplainError(Text("why.error.no_question"))
    return out
