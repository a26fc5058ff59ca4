"""The topic pages measured live on the loaded model: block size, hash collisions, what a hit buys,
what else is in a block's hash (its study is model-free but for the tokenizer, so only the prompt's
token ids are computed ahead; the variants are hashed and looked up on each run of the page).

Each study (lessons/topics.py) runs real engines on the model every session shares, so it runs
under the engine lock, once per model per server process, and every session reads the result;
"Measure again" (time to first token) replaces it. Token text goes into dataframes (shown as
text), never into Markdown or HTML.
"""

from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from paged_kv_lab.content import lesson, topic_questions
from paged_kv_lab.content.memory_math import dims_from_config, formula, human_bytes
from paged_kv_lab.content.registry import page
from paged_kv_lab.content.topics import (
    HASH_BITS,
    HASH_KEYS_BLOCK_SIZE,
    HASH_VARIANTS,
    IMAGE_LENGTH,
    SALT,
    block_size_study,
    collision_probability,
    hash_keys_prompt,
    hash_keys_study,
    hash_study,
    hashes_for_probability,
    max_image_offset,
    ttft_study,
)
from paged_kv_lab.store.server_cache import Shared, stop_point
from paged_kv_lab.text.i18n import Text, tr
from paged_kv_lab.ui.lesson_page import current_lang, current_model
from paged_kv_lab.ui.panels import painted_grid, questions_box
from paged_kv_lab.ui.widgets import ready_or_placeholder

STUDIES: Shared[Any] = Shared("topics")  # study key -> its result, for every session
ODDS = 1e-9  # the "how many hashes for this chance" column
# "Measure again" holds the engine lock for a few seconds on a CPU: one fresh measurement per
# this many seconds for everyone, so clicks cannot keep the other sessions' runs waiting.
AGAIN_AFTER_S = 30.0


def _model_key(model) -> tuple:
    return (model.name, str(model.device), str(model.dtype))


def _locked(compute: Callable[[], Any]) -> Callable[[], Any]:
    """A study steps the model every session shares: it runs under the engine lock (and not at
    all once the process is exiting: server_cache.stop_point)."""

    def run() -> Any:
        from paged_kv_lab.store.run_store import ENGINE_LOCK

        with ENGINE_LOCK:
            stop_point()
            return compute()

    return run


def topic_studies(model) -> dict[tuple, Callable[[], Any]]:
    """Every study the topic pages show, by key (the page's choices included): what
    ``prepare_studies`` measures ahead, and what the pages read."""
    mk = _model_key(model)
    scenario = lesson("prefix").scenario_dict(model.num_layers)
    return {
        ("blocksize", *mk): lambda: block_size_study(model),
        ("collisions", "sha256", *mk): lambda: hash_study(model, scenario, "sha256"),
        ("collisions", "xxhash", *mk): lambda: hash_study(model, scenario, "xxhash"),
        ("ttft", *mk): lambda: ttft_study(model),
        ("hashkeys", *mk): lambda: _hash_keys_ahead(model),
    }


def _hash_keys_ahead(model) -> tuple[int, ...]:
    """The hash-keys page's prompt, tokenized; and pandas' Styler made ready, which its grids use:
    its first use in a process imports and compiles its templates (half a second on a busy
    machine), which the page's first visitor would otherwise wait for."""
    painted_grid([["0"]], [["x"]], {"x": ("#ffffff", "#000000")}, ["0"]).to_html()
    return hash_keys_prompt(model)


def prepare_studies(model) -> None:
    """Measure every study now, one after another (the server's warm-up thread calls this)."""
    for key, compute in topic_studies(model).items():
        STUDIES.get(key, _locked(compute))


def measured(model, key: tuple, lang: str, again: bool = False) -> Any:
    """The study ``key`` (of topic_studies) on ``model``: ready, or None while it is measured in
    the background behind a note that fills in; ``again`` measures anew now if the last
    measurement is older than AGAIN_AFTER_S."""
    key = (*key, *_model_key(model))
    compute = _locked(topic_studies(model)[key])
    if again:
        with st.spinner(tr("topic.measuring", lang)):
            return STUDIES.get(key, compute, again_after=AGAIN_AFTER_S)
    return ready_or_placeholder(STUDIES, key, compute, tr("topic.measuring", lang))


def _header(topic: str, summary: Text, lang: str):
    shown = page(topic)
    st.title(f"{shown.icon} {tr(shown.title, lang)}")
    st.caption(tr(summary, lang))
    ms = current_model()
    if ms.model is None:
        st.error(tr("model_failed", lang, model=ms.name, device=ms.device, error=ms.error))
        st.info(tr("model_hint", lang))
    return ms.model


def _md(text: Text, lang: str, **fields) -> None:
    st.markdown(tr(text, lang, **fields))


def _slash(values) -> str:
    return " / ".join(str(v) for v in values)


# -- block size -----------------------------------------------------------------------------
def render_block_size() -> None:
    lang = current_lang()
    model = _header("blocksize", Text("topic.blocksize.summary"), lang)
    if model is None:
        return
    rows = measured(model, ("blocksize",), lang)
    if rows is None:
        return
    shared = rows[0].shared_prefix
    _md(Text("topic.blocksize.intro"), lang, model=model.name, shared=shared)
    st.caption(tr("topic.blocksize.table", lang))
    cols = tr("topic.bs_cols", lang)
    table = []
    for r in rows:
        a, b = r.requests
        table.append(
            dict(
                zip(
                    cols,
                    (
                        r.block_size,
                        f"{a.table_len} · {a.empty}",
                        f"{b.table_len} · {b.empty}",
                        f"{r.hit_tokens} ({r.hit_blocks})",
                        human_bytes(r.bytes_per_block),
                    ),
                )
            )
        )
    st.dataframe(table, hide_index=True, key="topic_bs_table")
    a_empty = _slash(r.requests[0].empty for r in rows)
    _md(Text("topic.blocksize.waste"), lang, a=a_empty)
    _md(Text("topic.blocksize.table_len"), lang, lens=_slash(r.requests[0].table_len for r in rows))
    _md(Text("topic.blocksize.hits"), lang, shared=shared, hits=_slash(r.hit_tokens for r in rows))
    dims = dims_from_config(model.config)
    dtype = str(model.dtype).removeprefix("torch.")
    _md(
        Text("topic.blocksize.bytes"),
        lang,
        layers=dims.layers,
        kv_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        dtype=dtype,
    )
    st.code("\n".join(formula(r.block_size, dims, dtype) for r in rows), language=None)
    _md(
        Text("topic.blocksize.per_layer"),
        lang,
        layers=dims.layers,
        pages=_slash(human_bytes(r.bytes_per_layer) for r in rows),
    )


# -- hash collisions ------------------------------------------------------------------------
def render_collisions() -> None:
    lang = current_lang()
    model = _header("collisions", Text("topic.collisions.summary"), lang)
    _md(Text("topic.collisions.bet"), lang)
    _md(Text("topic.collisions.nano"), lang)
    _md(Text("topic.collisions.seed"), lang)
    if model is None:
        return
    algo = st.radio(
        tr("topic.hash_algo", lang),
        ("sha256", "xxhash"),
        horizontal=True,
        key="topic_hash_algo",
    )
    study = measured(model, ("collisions", algo), lang)
    if study is None:
        return
    _md(
        Text("topic.collisions.live"),
        lang,
        model=model.name,
        algo=algo,
        blocks=len(study.blocks),
        distinct=study.distinct,
        bits=study.digest_bytes * 8,
        seed=f"`{study.none_hash_seed}`",
        none_hash=f"`{study.none_hash[:16]}…`",
    )
    if study.distinct < len(study.blocks):
        st.caption(
            tr("topic.collisions.twins", lang, blocks=len(study.blocks), distinct=study.distinct)
        )
    _md(Text("topic.collisions.odds"), lang, distinct=study.distinct)
    cols = tr("topic.odds_cols", lang, odds=f"{ODDS:g}")
    st.dataframe(
        [
            dict(
                zip(
                    cols,
                    (
                        name,
                        bits,
                        f"{collision_probability(study.distinct, bits):.3g}",
                        f"{hashes_for_probability(ODDS, bits):.3g}",
                    ),
                )
            )
            for name, bits in HASH_BITS.items()
        ],
        hide_index=True,
        key="topic_odds",
    )
    decode = model.decode
    cols = tr("topic.hash_cols", lang)
    st.dataframe(
        [
            dict(
                zip(
                    cols,
                    (
                        b.step,
                        b.request_id,
                        b.block_id,
                        b.block_hash,
                        b.num_tokens,
                        _text(decode, b.token_ids),
                    ),
                )
            )
            for b in study.blocks
        ],
        hide_index=True,
        key="topic_hashes",
    )


def _text(decode, ids) -> str:
    try:
        return decode(list(ids))
    except Exception:  # a tokenizer that cannot read these ids: show the ids
        return str(list(ids))


# -- time to first token --------------------------------------------------------------------
def render_ttft() -> None:
    lang = current_lang()
    model = _header("hitttft", Text("topic.ttft.summary"), lang)
    if model is None:
        return
    again = st.button(tr("topic.measure_again", lang), key="topic_ttft_again")
    s = measured(model, ("ttft",), lang, again=again)
    if s is None:
        return
    _md(
        Text("topic.ttft.intro"),
        lang,
        tokens=s.prompt_tokens,
        model=s.model,
        device=s.device,
        block_size=s.block_size,
        hit=s.hit_tokens,
        computed=s.computed_with_hit,
        rounds=len(s.rounds),
    )
    c1, c2, c3 = st.columns(3)
    c1.metric(tr("topic.ttft_cold", lang), tr("topic.ttft.ms", lang, ms=s.cold_s * 1000))
    c2.metric(tr("topic.ttft_hit", lang), tr("topic.ttft.ms", lang, ms=s.hit_s * 1000))
    c3.metric(tr("topic.ttft_speedup", lang), f"{s.speedup:.1f}×")
    cols = tr("topic.ttft_cols", lang)
    st.dataframe(
        [
            dict(
                zip(cols, (i + 1, f"{r.cold_s * 1000:.1f}", f"{r.hit_s * 1000:.1f}", r.hit_tokens))
            )
            for i, r in enumerate(s.rounds)
        ],
        hide_index=True,
        key="topic_ttft_rounds",
    )
    st.caption(tr("topic.ttft.note", lang))


# -- what else is in a block's hash ---------------------------------------------------------
# a hash cell's colour: the same hash as the plain prompt's block, or another one
HASH_COLORS = {"same": ("#d9f2d9", "#14421a"), "other": ("#fde2c8", "#5a2a00")}
# an extra-keys cell's colour: the image's placeholders touch the block, or other keys
KEY_COLORS = {"mm": ("#dbe8fb", "#0b2e5c"), "keys": ("#f0f0f0", "#222222")}


def _short_key(key: tuple) -> tuple:
    """One extra key as vLLM builds it, with the digests cut to their first hex digits."""
    tag = key[0]
    if tag == "mm":
        return (tag, f"{key[1][:8]}…", key[2])
    if tag == "prompt_embeds":
        return (tag, f"{key[1].hex()[:8]}…")
    return key


def _keys_text(keys) -> str:
    return "—" if keys is None else ", ".join(repr(_short_key(k)) for k in keys)


def _variant_grid(study, names, columns, cell, kind, colors, key: str) -> None:
    """One row per variant (its name, then one cell per block): ``cell(variant, i, block)`` is
    the text, ``kind(variant, i, block)`` the cell's colour key in ``colors``."""
    rows = [(v, list(enumerate(v.blocks))) for v in study.variants]
    st.dataframe(
        painted_grid(
            [[name, *(cell(v, i, b) for i, b in blocks)] for name, (v, blocks) in zip(names, rows)],
            [["", *(kind(v, i, b) for i, b in blocks)] for v, blocks in rows],
            colors,
            columns,
        ),
        hide_index=True,
        key=key,
    )


def _blocks_label(n: int, total: int, lang: str) -> str:
    return tr("topic.hashkeys.hit_cell", lang, n=n, total=total)


def render_hash_keys() -> None:
    lang = current_lang()
    model = _header("hashkeys", Text("topic.hashkeys.summary"), lang)
    _md(Text("topic.hashkeys.intro"), lang)
    if model is None:
        return
    ids = measured(model, ("hashkeys",), lang)
    if ids is None:
        return
    bs = HASH_KEYS_BLOCK_SIZE
    offset = st.slider(
        tr("topic.hashkeys.offset", lang, length=IMAGE_LENGTH),
        0,
        max_image_offset(len(ids)),
        min(2 * bs + bs // 2, max_image_offset(len(ids))),
        key="topic_image_offset",
    )
    s = hash_keys_study(ids, offset)
    n = s.num_blocks
    _md(
        Text("topic.hashkeys.prompt"),
        lang,
        model=model.name,
        tokens=len(ids),
        block_size=bs,
        blocks=n,
    )
    names = {v: tr(f"topic.hashkeys.variant.{v}", lang) for v in HASH_VARIANTS}
    block_cols = [tr("topic.hashkeys.block_col", lang, i=i) for i in range(n)]
    cols = [tr("topic.hashkeys.variant_col", lang), *block_cols]
    plain = s.by_id("plain")
    st.caption(tr("topic.hashkeys.hashes", lang))
    _variant_grid(
        s,
        [names[v.variant] for v in s.variants],
        cols,
        lambda v, i, b: b.block_hash[:8],
        lambda v, i, b: "same" if b.block_hash == plain.blocks[i].block_hash else "other",
        HASH_COLORS,
        "topic_hashkeys_hashes",
    )
    st.caption(tr("topic.hashkeys.keys", lang))
    _variant_grid(
        s,
        [names[v.variant] for v in s.variants],
        cols,
        lambda v, i, b: _keys_text(b.extra_keys),
        lambda v, i, b: (
            ("mm" if v.variant == "image" and i in s.touched else "keys") if b.extra_keys else ""
        ),
        KEY_COLORS,
        "topic_hashkeys_keys",
    )
    st.caption(tr("topic.hashkeys.hits", lang))
    hit_cols = tr("topic.hashkeys.hit_cols", lang)
    st.dataframe(
        [
            dict(
                zip(
                    hit_cols,
                    (
                        names[v.variant],
                        _blocks_label(v.hit_after_plain, n, lang),
                        _blocks_label(v.hit_after_itself, n, lang),
                        "—"
                        if v.neighbour is None
                        else f"{names[v.neighbour]}: "
                        + _blocks_label(v.hit_after_neighbour or 0, n, lang),
                    ),
                )
            )
            for v in s.variants
        ],
        hide_index=True,
        key="topic_hashkeys_hits",
    )
    image, lora, other_lora = s.by_id("image"), s.by_id("lora_sql"), s.by_id("lora_chat")
    touched = s.touched
    offsets = {
        i: k[2] for i, b in enumerate(image.blocks) for k in (b.extra_keys or ()) if k[0] == "mm"
    }
    _md(
        Text("topic.hashkeys.lora"),
        lang,
        plain=lora.hit_after_plain,
        itself=lora.hit_after_itself,
        other=other_lora.hit_after_neighbour,
        blocks=n,
    )
    _md(
        Text("topic.hashkeys.image"),
        lang,
        offset=s.image_offset,
        end=s.image_offset + s.image_length - 1,
        length=s.image_length,
        touched=_slash(touched) if touched else "—",
        offsets=_slash(f"{offsets[i]:+d}" for i in touched) if touched else "—",
        first=touched[0] if touched else n,
        plain=image.hit_after_plain,
        itself=image.hit_after_itself,
        blocks=n,
    )
    embeds_a, embeds_b = s.by_id("embeds_a"), s.by_id("embeds_b")
    _md(
        Text("topic.hashkeys.embeds"),
        lang,
        row=s.embeds_row,
        block=s.embeds_row // bs,
        plain=embeds_a.hit_after_plain,
        itself=embeds_a.hit_after_itself,
        neighbour=embeds_b.hit_after_neighbour,
        blocks=n,
    )
    salt = s.by_id("salt")
    _md(Text("topic.hashkeys.salt"), lang, plain=salt.hit_after_plain, blocks=n, salt=f"`{SALT}`")
    _md(Text("topic.hashkeys.honest"), lang)
    questions_box("hashkeys", topic_questions()["hashkeys"], lang)
