"""The Python-side panels under the player (memory math, myths, questions), the words and settings
of the panels the player draws itself (requests table, charts over steps), and the lesson narration
the player is sent."""

from __future__ import annotations

import re
from typing import Sequence

import streamlit as st

from kvcore.structured_output.utils import strip_speculative_padding
from paged_kv_lab.content.catalog import (
    Lesson,
    Question,
    moment_matches,
    narration_fields,
    narration_for_step,
)
from paged_kv_lab.content.memory_math import (
    DTYPES,
    blocks_in_budget,
    bytes_per_block,
    dims_from_config,
    formula,
    human_bytes,
)
from paged_kv_lab.content.myths import myth_sections_at
from paged_kv_lab.recording.snapshot import Snapshot
from paged_kv_lab.store.timeline import Timeline
from paged_kv_lab.text.i18n import Text, tr
from paged_kv_lab.ui.how_many_blocks import show_how_many_blocks

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|>~<$])")


def md_escape(s: str) -> str:
    return _MD_SPECIAL.sub(r"\\\1", s).replace("\n", "⏎ ")


def fmt_fields(snap: Snapshot, run) -> dict:
    """Fields a lesson's text may name; ``run`` is anything with the scenario (a Timeline, a
    RecordedRun)."""
    eng = run.scenario.engine
    return {
        "block_size": snap.block_size,
        "num_gpu_blocks": snap.num_gpu_blocks,
        "sliding_window": eng.sliding_window,
        "max_num_batched_tokens": eng.max_num_batched_tokens,
        "max_num_seqs": eng.max_num_seqs,
        "prefix_match_unit": eng.prefix_match_unit or snap.block_size,
        "step": snap.step,
        **(spec_fields(run.records, snap.step) if eng.speculative is not None else {}),
    }


def spec_fields(records, step: int) -> dict:
    """Speculative decoding measured up to ``step``: drafts verified, accepted and rejected, the
    acceptance rate, and the tokens a request gains per target forward (1 without drafts)."""
    accepted = rejected = gained = forwards = 0
    for rec in records[:step]:
        for e in rec.events:
            if e.kind == "draft_accepted":
                accepted += len(e.accepted_token_ids)
            elif e.kind == "draft_rejected":  # a padded admission's placeholders are no drafts
                rejected += len(strip_speculative_padding(list(e.rejected_token_ids)))
        for toks in rec.new_tokens.values():
            if toks:
                gained += len(toks)
                forwards += 1
    verified = accepted + rejected
    return {
        "spec_verified": verified,
        "spec_accepted": accepted,
        "spec_rejected": rejected,
        "acceptance_rate": f"{accepted / verified:.0%}" if verified else "—",
        "tokens_per_forward": f"{gained / forwards:.2f}" if forwards else "—",
    }


class _Safe(dict):
    """A lesson text's fields. The text is Markdown (the player draws it with text.js md, a page
    with st.markdown); a value filled in (a request id, a block list) is escaped so it shows as
    written, never as formatting. Numbers stay numbers, for format specs."""

    def __init__(self, fields: dict) -> None:
        super().__init__({k: md_escape(v) if isinstance(v, str) else v for k, v in fields.items()})

    def __missing__(self, key):
        return "{" + key + "}"


def _moment_texts(lesson: Lesson, moments, rec, base: dict, lang: str) -> list[str]:
    """The step's narration: which replica made it (a P/D pair's run), then its moments."""
    texts = []
    if rec.replica is not None:
        texts.append(
            tr("pd.step.by", lang, step=rec.step, replica=Text(f"pd.replica.{rec.replica}"))
        )
    for m in moments:
        e = next(e for e in rec.events if moment_matches(m, e, rec))
        texts.append(tr(m.text, lang).format_map(_Safe({**base, **narration_fields(e, rec)})))
    return texts


def intro_text(lesson: Lesson, run: Timeline, lang: str) -> str:
    return tr(lesson.intro, lang).format_map(_Safe(fmt_fields(run.initial, run)))


def outro_text(lesson: Lesson, run: Timeline, lang: str) -> str:
    return (
        tr(lesson.outro, lang).format_map(_Safe(fmt_fields(run.initial, run)))
        if lesson.outro
        else ""
    )


class LessonNarrator:
    """Narration of each step for the player: the moments that first happen at that step.

    It reads the run's records in order once (``found``: moment -> first step, complete up to
    ``upto``), so narrating a whole run costs one pass, not one pass per step. It keeps the
    records list and the scenario, not the run, so a cache keyed by the run can hold it."""

    def __init__(self, lesson: Lesson, run, lang: str) -> None:
        self.lesson, self.lang = lesson, lang
        self.records, self.scenario = run.records, run.scenario
        self.found: dict[int, int] = {}
        self.upto = 0

    def __call__(self, rec) -> list[str]:
        while self.upto < rec.step and self.upto < len(self.records):
            r = self.records[self.upto]
            for i, m in enumerate(self.lesson.moments):
                if i not in self.found and any(moment_matches(m, e, r) for e in r.events):
                    self.found[i] = r.step
            self.upto += 1
        moments = [self.lesson.moments[i] for i, s in sorted(self.found.items()) if s == rec.step]
        return _moment_texts(self.lesson, moments, rec, fmt_fields(rec.snapshot, self), self.lang)


def narration(lesson: Lesson, run: Timeline, lang: str) -> list[str]:
    """Narration for the shown step: intro at step 0, moments that first happen now, outro at the
    end."""
    snap, rec = run.snapshot, run.record
    base = fmt_fields(snap, run)
    texts = []
    if rec is None:
        texts.append(tr(lesson.intro, lang).format_map(_Safe(base)))
        return texts
    texts += _moment_texts(
        lesson, narration_for_step(lesson, run.shown_records(), rec.step), rec, base, lang
    )
    if run.finished and lesson.outro:
        texts.append("🏁 " + tr(lesson.outro, lang).format_map(_Safe(base)))
    return texts


# The panels the player draws from its recorded steps, below its own pictures, in this order.
PLAYER_PANELS = ("requests", "metrics", "budget", "held")


def player_panels(panels: Sequence[str], run, lang: str) -> dict:
    """The head's ``meta`` for the player's panels: which to draw (``panels`` filtered to those the
    player draws), the token budget line, and their words in ``lang`` (over the player's own).
    ``run`` is anything with the scenario; a trace without its header has no budget."""
    eng = run.scenario.engine if getattr(run, "scenario", None) is not None else None
    words = {
        "requests": tr("requests", lang),
        "over_time": tr("metrics", lang),
        "budget": tr("budget", lang),
        "held": tr("held", lang),
        "req_cols": list(tr("req_table_cols", lang)),
    }
    if eng is not None and eng.free_order == "legacy":  # the queue's caption states the run's rule
        words["queue_caption"] = tr("queue_caption_legacy", lang)
    return {
        "panels": [p for p in PLAYER_PANELS if p in panels],
        "budget": eng.max_num_batched_tokens if eng is not None else None,
        "words": words,
    }


def show_memory(run: Timeline, lang: str, model, key: str) -> None:
    with st.expander(tr("memory", lang), expanded=True):
        dims = dims_from_config(model.config)
        model_dtype = str(getattr(model, "dtype", "float32")).replace("torch.", "")
        c1, c2, c3 = st.columns(3)
        bs = c1.select_slider(
            "block_size", options=[1, 2, 4, 8, 16, 32, 64, 128], value=16, key=f"mem_bs:{key}"
        )
        dtype = c2.selectbox(
            "dtype",
            DTYPES,
            index=DTYPES.index(model_dtype) if model_dtype in DTYPES else 0,
            key=f"mem_dt:{key}",
        )
        gib = c3.slider(tr("memory.gib", lang), 0.25, 80.0, 8.0, 0.25, key=f"mem_gb:{key}")
        bpb = bytes_per_block(bs, dims, dtype)
        n = blocks_in_budget(int(gib * 1024**3), bpb)
        st.markdown(
            tr(
                "memory.math",
                lang,
                model=model.name,
                layers=dims.layers,
                kv_heads=dims.kv_heads,
                head_dim=dims.head_dim,
                formula=formula(bs, dims, dtype),
                block_bytes=human_bytes(bpb),
                gib=gib,
                blocks=n,
                tokens=n * bs,
            )
        )
        eng = run.scenario.engine
        pool = bytes_per_block(eng.block_size, dims, model_dtype) * eng.num_gpu_blocks
        st.caption(
            tr(
                "memory.pool",
                lang,
                blocks=eng.num_gpu_blocks,
                block_size=eng.block_size,
                bytes=human_bytes(pool),
            )
        )
        show_how_many_blocks(model, lang, key)


def show_hybrid_pages(run: Timeline, lang: str, model) -> None:
    """The page arithmetic of the loaded hybrid model and of real ones (lesson/hybrid_pages.py):
    why the block grows to hundreds of tokens, and what a cached state costs."""
    from paged_kv_lab.content.hybrid_pages import hybrid_rows

    rows = hybrid_rows(model.name, model.config, model.dtype)
    with st.expander(tr("hybrid_pages", lang), expanded=True):
        cols = tr("hybrid_pages.cols", lang)
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in rows:
            z = r.sizes
            cells = (
                f"`{r.name}`",  # a name, shown as it is
                f"{z.attn_bytes_per_token:,}",
                f"{z.conv_state_bytes:,} + {z.recurrent_state_bytes:,} = {z.state_bytes:,}",
                f"{z.block_size:,}",
                f"{z.page_bytes:,} ({human_bytes(z.page_bytes)})",
                f"{z.padding_bytes:,}",
                f"{r.linear_layers} × {human_bytes(z.page_bytes)} = "
                f"{human_bytes(r.cached_state_bytes)}",
            )
            lines.append("| " + " | ".join(cells) + " |")
        st.markdown("\n".join(lines))
        here = rows[0].sizes
        st.caption(
            tr(
                "hybrid_pages.note",
                lang,
                model=rows[0].name,
                block_size=here.block_size,
                played=run.scenario.engine.block_size,
            )
        )


def show_myths(run: Timeline, lang: str, key: str, expanded: bool = False) -> None:
    """Each myth, what vLLM does, and the live pool at the player's step: one markdown element for
    all of them (this panel reruns with every cursor report, and each element is a message), and
    nothing while the expander is closed."""
    box = st.expander(
        tr("myths", lang), expanded=expanded, key=f"myths_open:{key}", on_change="rerun"
    )
    if not box.open:
        return
    live = tr("myths_live", lang)
    sections = myth_sections_at(run.run.key, run.cursor, run.snapshots, lang, run.shown_records)
    with box:
        st.markdown(
            "\n\n---\n\n".join(
                f"❌ {myth}\n\n✅ {fact}\n\n:green-background[**{live}:** {now}]"
                for myth, fact, now in sections
            )
        )


def show_questions(lesson: Lesson, lang: str) -> None:
    questions_box(lesson.id, lesson.questions, lang)


def questions_box(owner: str, questions: Sequence[Question], lang: str) -> None:
    """'Check yourself': ``questions`` of a lesson or a topic page (``owner``: its id), each a radio
    that says right or wrong with the explanation once an option is chosen."""
    if not questions:
        return
    box = st.expander(tr("check_yourself", lang), key=f"questions_open:{owner}", on_change="rerun")
    if not box.open:  # drawn only when opened (its radios would load and draw on every page load)
        return
    with box:
        for i, q in enumerate(questions):
            opts = [tr(o, lang) for o in q.options]
            choice = st.radio(tr(q.prompt, lang), opts, index=None, key=f"cq:{owner}:{i}")
            if choice is not None:
                if opts.index(choice) == q.answer:
                    st.success(tr("quiz_right", lang) + " " + tr(q.explain, lang))
                else:
                    st.error(
                        tr("quiz_wrong", lang, answer=opts[q.answer]) + " " + tr(q.explain, lang)
                    )


def painted_grid(
    cells: Sequence[Sequence[str]],
    kinds: Sequence[Sequence[str]],
    colors: dict[str, tuple[str, str]],
    columns: Sequence[str],
):
    """A table for ``st.dataframe`` whose cells are coloured by kind: ``kinds`` has the shape of
    ``cells``; a kind in ``colors`` gives (background, text colour), any other kind no colour. A
    styled table, not a chart: a chart library kept every element of a page from showing until it
    had loaded, and the browser loads the grid anyway."""
    import pandas as pd

    grid = pd.DataFrame([list(r) for r in cells], columns=list(columns))
    kind = pd.DataFrame([list(r) for r in kinds], columns=grid.columns)

    def paint(_):
        return kind.map(
            lambda k: (
                f"background-color: {colors[k][0]}; color: {colors[k][1]}" if k in colors else ""
            )
        )

    return grid.style.apply(paint, axis=None)
