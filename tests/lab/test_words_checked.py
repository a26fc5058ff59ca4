"""Every word right, again (issue #46): the fact-check's findings stay corrected, and each claim
that rests on the engine's behaviour is pinned to a run of it: which states of a Mamba group get a
hash at ``prefix_cache_retention_interval`` 0, n and None, and where a shared-prefix junction is
kept; the two cases in which a block is copied (and none on an attention-only model); the key of
a prompt that ends inside a block at the last ``prefix_match_unit`` boundary at or below
``num_prompt_tokens - 1``; a hashed attention block its producer goes on writing; the step by
which vLLM raises a stated block size; the class pack's counts in docs/class-pack.md (generated:
``.venv/bin/python tests/lab/test_words_checked.py --write-pack-counts``) and the model its
index names.

Each engine run is model-free (NoModelRunner, prompt token ids), on the tiny hybrid layout: three
linear-attention layers and one full-attention layer, so groups 0-2 are state (Mamba) groups and
group 3 is attention."""

from __future__ import annotations

import re
import sys

if __name__ == "__main__":  # run as a script (--write-pack-counts): tests/ on sys.path
    from pathlib import Path

    # tests/ for the support helpers, the checkout itself before any installed copy
    sys.path[:0] = [str(Path(__file__).resolve().parents[i]) for i in (1, 2)]

import pytest

from kvcore.core.kv_cache_inspect import block_cache_keys
from kvcore.core.kv_cache_utils import get_group_id
from kvcore.platforms.interface import align_hybrid_block_size
from paged_kv_lab.text.i18n import languages, tr
from support.kv import make_engine, spec
from support.paths import ROOT

LAYERS = ("linear_attention",) * 3 + ("full_attention",)
STATE_GROUPS, ATTENTION = (0, 1, 2), 3

# The sentences the fact-check found wrong or over-absolute, as they were written; none may come
# back, in any language.
WRONG = (
    "one state per block boundary",
    "keeps a state per block boundary",
    "(one per block boundary in align mode",
    "a state kept at every block boundary",
    "copies a block in one case",
    "cached at its last such boundary",
    "cached at its last 4-token boundary",
    "A state exists only where a block or a prompt ended",
    "a block is keyed inside only where an earlier prompt ended",
    "Only with a KV connector is a block that already has a hash written again",
    "(its content hash and its offset from the block's start)",
    "(the step 16, as above)",
    "Every lesson, topic and casebook case of the app",
    "every lesson, topic and case as",
    "每个块边界只保留一个状态",
    "状态组每个块边界保留一个状态",
    "align 模式下每个块边界一个",
    "它最后一个这样的边界处被缓存",
    "它最后一个 4 token 边界处被缓存",
    "状态只存在于块或提示词结束的地方",
    "块内的登记只出现在之前某个提示词结束的地方",
    "只有配置了 KV 连接器时，已有哈希的块才会被再次写入",
    "（它的内容哈希，以及它相对块起点的偏移）",
    "应用里的每一课、每个专题和每个案例",
)


def shown_text_files() -> list:
    lab = ROOT / "paged_kv_lab"
    dirs = [lab / "content", lab / "text", lab / "why", ROOT / "docs"]
    files = [p for d in dirs for p in d.rglob("*") if p.suffix in {".py", ".json", ".md", ".yaml"}]
    return files + [ROOT / "README.md"]


def test_the_sentences_found_wrong_are_gone_everywhere():
    found = [
        (p.relative_to(ROOT).as_posix(), w)
        for p in shown_text_files()
        for w in WRONG
        if w in p.read_text(encoding="utf-8")
    ]
    assert not found, found


def hashed_states(eng) -> dict[int, list[int]]:
    """Group -> the token counts its cached blocks' keys cover (a state group: the position of
    the state), over the whole pool at the end of the run."""
    out: dict[int, list[int]] = {}
    for b in eng.kv_cache_manager.block_pool.blocks:
        if b.block_hash is not None:
            out.setdefault(get_group_id(b.block_hash), []).append(b.block_hash_num_tokens)
    return {g: sorted(v) for g, v in sorted(out.items())}


def one_prompt(retention, chunk: int):
    """A 13-token prompt in 4-token blocks, prefilled ``chunk`` tokens a step, then 8 tokens
    decoded (the states cross the boundaries at 16 and 20)."""
    eng = make_engine(
        [spec("a", range(1, 14), max_tokens=8)],
        block_size=4,
        num_gpu_blocks=60,
        layer_types=LAYERS,
        prefix_cache_retention_interval=retention,
        max_num_batched_tokens=chunk,
    )
    eng.run()
    return hashed_states(eng)


@pytest.mark.parametrize("chunk", [4, 256], ids=["chunked", "one-chunk"])
def test_at_retention_0_a_state_group_hashes_only_the_prompts_last_boundary(chunk):
    """vLLM's default: the state at the last block boundary at or below 13 - 1 = 12 tokens, where
    a resend stops; attention hashes every full block whatever the interval."""
    got = one_prompt(0, chunk)
    assert all(got[g] == [12] for g in STATE_GROUPS), got
    assert got[ATTENTION] == [4, 8, 12, 16, 20]


def test_at_retention_none_every_state_a_step_leaves_on_a_boundary_gets_a_hash():
    """None is not "a state per block boundary": a state exists only where a step stopped, so
    a prefill done in one chunk leaves none at 4 and 8 (vLLM's align mode writes a state at
    each chunk's end); the states decoding crosses (16, 20) are hashed too."""
    assert all(s == [4, 8, 12, 16, 20] for g, s in one_prompt(None, 4).items())
    got = one_prompt(None, 256)
    assert all(got[g] == [12, 16, 20] for g in STATE_GROUPS), got


def test_a_positive_interval_adds_one_state_every_that_many_tokens():
    got = one_prompt(8, 4)
    assert all(got[g] == [8, 12, 16] for g in STATE_GROUPS), got


def test_at_retention_0_a_shared_prefix_junction_is_kept_on_a_block_boundary():
    """b shares a's first 8 tokens: its lookup finds attention blocks up to 8 but no state there
    (retention 0 kept only a's state at 12), so it misses and records the junction; its prefill
    stops at 8 and keeps that state, and c, sharing the same 8 tokens, hits them."""
    a = list(range(1, 14))
    reqs = [
        spec("a", a, max_tokens=2),
        spec("b", a[:8] + list(range(100, 105)), max_tokens=2, arrival_step=4),
        spec("c", a[:8] + list(range(200, 206)), max_tokens=2, arrival_step=8),
    ]
    eng = make_engine(reqs, block_size=4, num_gpu_blocks=60, layer_types=LAYERS)
    hits = [
        (e.request_id, e.num_tokens) for r in eng.run() for e in r.events if e.kind == "cache_hit"
    ]
    assert hits == [("c", 8)]
    assert all(8 in hashed_states(eng)[g] for g in STATE_GROUPS)


def continued_chat(**kw):
    """A's 13-token prompt, 6 tokens decoded; B (arriving later) is A's prompt and more."""
    a = list(range(1, 14))
    reqs = [
        spec("A", a, max_tokens=6),
        spec("B", a + list(range(50, 56)), max_tokens=2, arrival_step=5),
    ]
    return make_engine(reqs, block_size=8, num_gpu_blocks=60, **kw)


def test_vllm_copies_a_block_in_two_cases_and_never_on_an_attention_only_model():
    """The running producer whose state was just keyed inside the block it keeps writing: the
    entry moves to a copy, in each state group (``keep_cached``: MambaManager.allocate_new_blocks,
    move_block_hashes); the request whose hit ends inside a block: a private copy of it, in every
    group (``partial_hit``: _apply_cow)."""
    eng = continued_chat(layer_types=LAYERS, prefix_match_unit=2)
    copied = [e for r in eng.run() for e in r.events if e.kind == "copied"]
    groups = {}
    for e in copied:
        groups.setdefault((e.request_id, e.reason), set()).add(e.group)
    assert {reason for _, reason in groups} == {"keep_cached", "partial_hit"}
    assert groups[("A", "keep_cached")] == set(STATE_GROUPS)  # A's own entry, moved
    assert groups[("B", "partial_hit")] == {0, 1, 2, ATTENTION}  # B's hit, copied
    plain = continued_chat()
    assert not [e for r in plain.run() for e in r.events if e.kind == "copied"]


@pytest.mark.parametrize("n, key", [(20, 16), (24, 20), (25, 24), (31, 28), (33, None), (40, 36)])
def test_a_prompt_ending_inside_a_block_is_keyed_at_the_last_unit_boundary_below_its_length(n, key):
    """prefix_match_unit 4 in 32-token blocks: the partial entry covers the last multiple of 4 at
    or below n - 1 (a resend's hit stops there: its last token is computed again), in every group;
    none where that boundary is a whole block (33: 32). A 24-token prompt, as case 1's A, at 20."""
    eng = make_engine(
        [spec("A", range(1, n + 1), max_tokens=2)],
        block_size=32,
        num_gpu_blocks=60,
        layer_types=LAYERS,
        prefix_match_unit=4,
    )
    keyed = {
        (e.group, e.num_tokens) for r in eng.run() for e in r.events if e.kind == "cached_partial"
    }
    assert keyed == (set() if key is None else {(g, key) for g in range(4)})
    assert key is None or key == (n - 1) // 4 * 4


def test_the_producer_goes_on_writing_a_hashed_attention_block():
    """myth.swap.truth: on a hybrid model with a finer prefix_match_unit, A goes on writing K/V
    into the attention block that carries its prompt's partial key (12 tokens; block 1 of its
    table holds tokens 8..15), after the tokens the key covers; its state blocks are copied
    first (keep_cached), the attention block is not."""
    eng = continued_chat(layer_types=LAYERS, prefix_match_unit=2)
    pool = eng.kv_cache_manager.block_pool
    for _ in range(20):
        rec = eng.step()
        copied = [e for e in rec.events if e.kind == "copied" and e.request_id == "A"]
        if copied:
            break
    assert copied and {e.group for e in copied} == set(STATE_GROUPS)
    block = eng.kv_cache_manager.get_block_ids("A")[ATTENTION][1]
    assert eng.scheduler.requests["A"].num_computed_tokens > 12  # written past the key
    keys = block_cache_keys(pool, block)
    assert keys and get_group_id(keys[0]) == ATTENTION


@pytest.mark.parametrize("stated, step", [(16, 16), (40, 40), (4, 16)])
def test_a_stated_block_size_is_raised_in_steps_of_max_16_and_itself(stated, step):
    """docs/scenario.md: vLLM's kernel_block_alignment_size is max(smallest kernel block, the
    stated block_size), then a multiple of 16. Qwen3-Next's page numbers from the lab's data."""
    from paged_kv_lab.content.hybrid_pages import real_models

    qwen3_next = next(r.sizes for r in real_models() if r.name.startswith("Qwen3-Next"))
    attn, state = qwen3_next.attn_bytes_per_token, qwen3_next.state_bytes
    tokens = -(-state // attn)  # a state's bytes in attention tokens (536)
    want = -(-(step * -(-state // (step * attn))) // 16) * 16
    assert align_hybrid_block_size(stated, attn, state)[0] == max(stated, want)
    if stated == 40:
        assert want == 560 and tokens == 536  # not the 544 of a 16-token step
        text = (ROOT / "docs" / "scenario.md").read_text(encoding="utf-8")
        assert "at 560 (14 steps of 40), not 544" in text


# -- the class pack ------------------------------------------------------------------------------
PACK_START = (
    "<!-- pack-counts:start"
    " (generated: python tests/lab/test_words_checked.py --write-pack-counts) -->"
)
PACK_END = "<!-- pack-counts:end -->"
PACK_DOC = ROOT / "docs" / "class-pack.md"


def pack_counts() -> str:
    """What ``pack --lessons all`` packs today, from the pack's own entry list."""
    from paged_kv_lab.ui.class_pack import QUIZ_PER_RUN, pack_items

    items = pack_items()
    lessons = [i for i in items if i.case is None and i.page.lesson is not None]
    cases = [i for i in items if i.case is not None]
    topics = [i for i in lessons if i.page.section == "topics"]
    lessons = [i for i in lessons if i.page.section != "topics"]
    runs = sum(len(i.runs()) for i in items)
    langs = len(languages())
    own = sum(len(i.lesson.questions) for i in items)
    return (
        f"`pack --lessons all` packs {len(items)} entries: {len(lessons)} lessons, {len(cases)}"
        f" casebook cases (each with its fixed run) and {len(topics)} topics, {runs} runs. It"
        f" writes {runs * langs + langs + 1} files: {runs} players and the quiz in each of"
        f" {langs} languages, and the index. The quiz asks the lessons' own {own} questions and"
        f' up to {QUIZ_PER_RUN} "what will the next step do?" questions from each entry\'s run'
        f" (how many depends on the runs: at most {own + QUIZ_PER_RUN * len(items)})."
    )


def pack_block() -> str:
    return f"{PACK_START}\n{pack_counts()}\n{PACK_END}"


def test_the_class_packs_counts_in_the_docs_are_todays():
    text = PACK_DOC.read_text(encoding="utf-8")
    got = re.search(re.escape(PACK_START) + r".*?" + re.escape(PACK_END), text, re.S)
    assert got, "docs/class-pack.md has no generated counts"
    assert " ".join(got.group(0).split()) == " ".join(pack_block().split()), (
        "regenerate: .venv/bin/python tests/lab/test_words_checked.py --write-pack-counts"
    )


def test_the_pack_index_names_the_model_of_each_entry_that_plays_on_its_own():
    """pack.index.intro: recorded on the chosen model, except an entry whose intro names the model
    it plays on; every such entry's intro does, in every language."""
    from paged_kv_lab.ui.class_pack import pack_items

    own = [i for i in pack_items() if i.lesson.model is not None]
    assert own  # lesson 13 and case 1 play on tiny-hybrid
    for item in own:
        for lang in languages():
            assert item.lesson.model in tr(item.lesson.intro, lang, **_intro_fields()), (
                item.id,
                lang,
            )


def _intro_fields() -> dict:
    """Values for the placeholders an intro may hold (the check reads the model's name only)."""
    return {"block_size": 32, "prefix_match_unit": 4, "sliding_window": 8, "num_gpu_blocks": 16}


def write_pack_counts() -> None:
    text = PACK_DOC.read_text(encoding="utf-8")
    pattern = re.escape(PACK_START) + r".*?" + re.escape(PACK_END)
    assert re.search(pattern, text, re.S), "docs/class-pack.md has no pack-counts markers"
    PACK_DOC.write_text(re.sub(pattern, lambda _: pack_block(), text, flags=re.S), encoding="utf-8")


@pytest.mark.parametrize("retention", [0, 32, None], ids=["0", "32", "None"])
def test_case_1_a_prefix_shorter_than_the_block_misses_at_every_retention(retention):
    """Case 1's central sentence, model-free at its shape: 32-token blocks, A's 24-token prompt;
    B continues A's chat, C shares only A's first 12 tokens. With no finer unit nobody hits, at
    any retention (no block boundary lies inside the shared part); with prefix_match_unit 4, B
    hits A's key at 20 and C still misses."""
    a = list(range(1, 25))
    reqs = [
        spec("A", a, max_tokens=4),
        spec("B", a + list(range(60, 70)), max_tokens=2, arrival_step=6),
        spec("C", a[:12] + list(range(80, 92)), max_tokens=2, arrival_step=6),
    ]

    def hits(**kw):
        eng = make_engine(
            reqs,
            block_size=32,
            num_gpu_blocks=60,
            layer_types=LAYERS,
            prefix_cache_retention_interval=retention,
            **kw,
        )
        return [
            (e.request_id, e.num_tokens)
            for r in eng.run()
            for e in r.events
            if e.kind == "cache_hit"
        ]

    assert hits() == []
    assert hits(prefix_match_unit=4) == [("B", 20)]


def test_the_raised_block_size_sentence_names_the_step_it_took():
    """block_size.raised (the CLI's and the lesson page's sentence) says the step vLLM took for a
    stated size on tiny-hybrid: max(16, 40) = 40, one step, rounded up to 48."""
    from paged_kv_lab.run.scenario import block_size_note, load_scenario

    note = block_size_note(load_scenario({"model": "tiny-hybrid", "engine": {"block_size": 40}}))
    assert note.key == "block_size.raised" and note.fields["vllm"] == 48
    assert "max(16, 40)" in tr(note, "en") and "max(16, 40)" in tr(note, "zh")


def test_the_topics_count_in_docs_is_the_registrys():
    """docs/lessons.md's "## Topics" opens with how many topic pages there are, in words."""
    from paged_kv_lab.content.registry import sections

    n = len(next(s for s in sections() if s.id == "topics").pages)
    words = "zero one two three four five six seven eight nine ten eleven twelve".split()
    text = (ROOT / "docs" / "lessons.md").read_text(encoding="utf-8")
    assert f"## Topics\n\n{words[n].capitalize()} questions the seed articles raise" in text


def test_an_items_key_is_its_identifier_not_its_content():
    """topic.hashkeys.intro: a block touched by a multimodal item carries the item's
    ``identifier`` (vLLM's content hash, or the request's ``multi_modal_uuids`` entry for it):
    the same identifier over other content keys alike, another identifier over the same content
    keys apart."""
    from kvcore.core.kv_cache_utils import get_request_block_hasher
    from kvcore.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from kvcore.request import Request
    from kvcore.utils.hashing import get_hash_fn_by_name

    def hashes(identifier, data):
        item = MultiModalFeatureSpec(identifier, PlaceholderRange(2, 4), data=data)
        hasher = get_request_block_hasher(4, get_hash_fn_by_name("sha256"))
        return Request("r", list(range(8)), 4, block_hasher=hasher, mm_features=[item]).block_hashes

    assert hashes("uuid-1", b"cat pixels") == hashes("uuid-1", b"dog pixels")
    assert hashes("uuid-1", b"cat pixels") != hashes("uuid-2", b"cat pixels")


if __name__ == "__main__":  # .venv/bin/python tests/lab/test_words_checked.py --write-pack-counts
    if sys.argv[1:] != ["--write-pack-counts"]:
        sys.exit("usage: tests/lab/test_words_checked.py --write-pack-counts")
    write_pack_counts()
