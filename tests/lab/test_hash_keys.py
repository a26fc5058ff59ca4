"""The topic page 'What else is in a block's hash' (issue #33): one prompt under two LoRA adapters,
an image at a chosen offset, prompt embeddings and a cache salt, hashed by kvcore and looked up on
kvcore's own KVCacheManager (no model), and the page that shows it (AppTest, tiny model).

The study is checked three ways: against the rule each extra key follows (written out here),
against its own hash table (a second request hits exactly the leading blocks whose hashes it
shares), and against vLLM 0.34.0's own Request, block hasher and KVCacheManager (skipped without
the vLLM scratch environment, ``VLLM_VENV``, default /tmp/vllm034-venv). The myth it answers is
checked live on a run."""

import hashlib
import random
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.kv_cache_utils import frontend_block_hashes
from kvcore.engine import EngineCoreRequest
from kvcore.kv_cache_interface import KVCacheConfig, full_attention
from kvcore.lora.request import LoRARequest
from kvcore.utils.hashing import HASH_ALGOS
from paged_kv_lab.content import TOPIC_QUESTIONS
from paged_kv_lab.content import myths as M
from paged_kv_lab.content.topics import (
    HASH_KEYS_BLOCK_SIZE as BS,
)
from paged_kv_lab.content.topics import (
    HASH_KEYS_PROMPT,
    HASH_VARIANTS,
    IMAGE_ID,
    IMAGE_LENGTH,
    LORAS,
    SALT,
    hash_keys_request,
    hash_keys_study,
    max_image_offset,
)
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import load_scenario
from paged_kv_lab.text.i18n import tr
from support.app import APP, TIMEOUT, app, open_page
from support.kv import VLLM_VENV_034 as VENV
from support.kv import ask_vllm, make_engine, spec
from support.paths import ROOT
from support.pseudo import explore, page_leftovers

# the app tests here run the app on the tiny model (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_model_env")

TOKENS = tuple(range(1000, 1087))  # 87 tokens: 5 full blocks of 16 and 7 tokens over


def first_difference(a, b) -> int:
    """The first block where two hash lists differ (their length if none does)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def hashes(study, variant: str) -> list[str]:
    return [b.block_hash for b in study.by_id(variant).blocks]


# -- the study ------------------------------------------------------------------------------------
def test_each_variant_keeps_the_token_ids_and_hashes_every_full_block():
    s = hash_keys_study(TOKENS, 40)
    assert [v.variant for v in s.variants] == list(HASH_VARIANTS)
    assert s.num_blocks == len(TOKENS) // BS == 5
    assert all(len(v.blocks) == s.num_blocks for v in s.variants)
    assert all(b.extra_keys is None for b in s.by_id("plain").blocks)
    # no two variants share a hash from their first differing block on: 7 variants, each hash
    # of block 4 distinct
    assert len({v.blocks[-1].block_hash for v in s.variants}) == len(HASH_VARIANTS)


def test_a_lora_adapter_is_in_every_block_and_shares_nothing():
    s = hash_keys_study(TOKENS, 40)
    for v in ("lora_sql", "lora_chat"):
        name, _, path = LORAS[v]
        assert all(b.extra_keys == (("lora", name, path),) for b in s.by_id(v).blocks)
        assert first_difference(hashes(s, v), hashes(s, "plain")) == 0
    sql, chat = s.by_id("lora_sql"), s.by_id("lora_chat")
    assert (sql.hit_after_plain, sql.hit_after_itself) == (0, s.num_blocks)
    assert chat.neighbour == "lora_sql" and chat.hit_after_neighbour == 0


@pytest.mark.parametrize("offset", [0, 5, 16, 20, 40, 47, 63])
def test_an_image_touches_the_blocks_of_its_placeholders_with_their_offsets(offset):
    s = hash_keys_study(TOKENS, offset)
    end = offset + IMAGE_LENGTH
    touched = [i for i in range(s.num_blocks) if i * BS < end and offset < (i + 1) * BS]
    assert list(s.touched) == touched
    image = s.by_id("image")
    for i, b in enumerate(image.blocks):
        # vLLM's key: ("mm", the item's identifier, its offset from the block's start)
        assert b.extra_keys == ((("mm", IMAGE_ID, offset - i * BS),) if i in touched else None)
    # the plain prompt's hashes up to the first touched block, none after it (the chain)
    first = touched[0]
    assert first_difference(hashes(s, "image"), hashes(s, "plain")) == first
    assert all(a != b for a, b in zip(hashes(s, "image")[first:], hashes(s, "plain")[first:]))
    assert image.hit_after_plain == first and image.hit_after_itself == s.num_blocks


def test_the_offset_counts_not_only_the_blocks_touched():
    """At offsets 20 and 21 the image touches blocks 1 and 2 both times; block 1's key differs
    only by the offset, so its hash does: a study that dropped the offset would fail here."""
    a, b = hash_keys_study(TOKENS, 20), hash_keys_study(TOKENS, 21)
    assert a.touched == b.touched == (1, 2)
    assert hashes(a, "image")[0] == hashes(b, "image")[0]
    assert hashes(a, "image")[1] != hashes(b, "image")[1]
    assert a.by_id("image").hit_after_plain == b.by_id("image").hit_after_plain == 1


def test_the_slider_range_keeps_the_image_inside_the_prompt():
    assert max_image_offset(len(TOKENS)) == len(TOKENS) - IMAGE_LENGTH
    s = hash_keys_study(TOKENS, 10_000)
    assert s.image_offset == len(TOKENS) - IMAGE_LENGTH
    assert hash_keys_study(TOKENS, -3).image_offset == 0


def test_a_salt_is_in_block_0_only_and_changes_every_hash():
    s = hash_keys_study(TOKENS, 40)
    salt = s.by_id("salt")
    assert salt.blocks[0].extra_keys == (("cache_salt", SALT),)
    assert all(b.extra_keys is None for b in salt.blocks[1:])
    assert all(x != y for x, y in zip(hashes(s, "salt"), hashes(s, "plain")))
    assert (salt.hit_after_plain, salt.hit_after_itself) == (0, s.num_blocks)


def test_prompt_embeddings_count_by_the_digest_of_each_blocks_rows():
    s = hash_keys_study(TOKENS, 40)
    a = hash_keys_request("embeds_a", "a", TOKENS, 40, s.embeds_row)
    for i, b in enumerate(s.by_id("embeds_a").blocks):
        rows = a.prompt_embeds[i * BS : (i + 1) * BS]
        assert b.extra_keys == (("prompt_embeds", hashlib.sha256(b"".join(rows)).digest()),)
    changed = s.embeds_row // BS
    eb = s.by_id("embeds_b")
    assert first_difference(hashes(s, "embeds_a"), hashes(s, "embeds_b")) == changed
    assert eb.neighbour == "embeds_a" and eb.hit_after_neighbour == changed
    assert s.by_id("embeds_a").hit_after_plain == 0


def test_every_hit_is_the_leading_blocks_whose_hashes_agree():
    """The KVCacheManager's hits agree with the hash table: a second request hits the leading
    blocks its hashes share with the first's (all of them after itself; the prompt's last
    token is always computed, which a partial last block leaves out of the full blocks)."""
    for offset in (0, 30, 63):
        s = hash_keys_study(TOKENS, offset)
        plain = hashes(s, "plain")
        for v in s.variants:
            assert v.hit_after_plain == first_difference(hashes(s, v.variant), plain)
            assert v.hit_after_itself == s.num_blocks
            if v.neighbour:
                assert v.hit_after_neighbour == first_difference(
                    hashes(s, v.variant), hashes(s, v.neighbour)
                )


# -- against vLLM 0.33.0's own code ---------------------------------------------------------------
def vllm_spec(token_ids, offset: int, embeds_row: int) -> dict:
    """The variants as plain data (what kvcore's requests carry), and the pairs the page runs."""
    variants = {}
    for v in HASH_VARIANTS:
        r = hash_keys_request(v, v, token_ids, offset, embeds_row)
        lora = r.lora_request
        variants[v] = {
            "lora": [lora.lora_name, lora.lora_int_id, lora.lora_path] if lora else None,
            "salt": r.cache_salt,
            "mm": [
                [f.identifier, f.mm_position.offset, f.mm_position.length] for f in r.mm_features
            ],
            "embeds": [list(struct.unpack("<2f", row)) for row in r.prompt_embeds]
            if r.prompt_embeds
            else None,
        }
    pairs = [("plain", v) for v in HASH_VARIANTS] + [(v, v) for v in HASH_VARIANTS]
    pairs += [("lora_sql", "lora_chat"), ("embeds_a", "embeds_b")]
    return {"block_size": BS, "token_ids": list(token_ids), "variants": variants, "pairs": pairs}


def plain_keys(keys):
    if keys is None:
        return None
    return [[k.hex() if isinstance(k, bytes) else k for k in key] for key in keys]


def vllm_says(spec):
    """What tests/support/reference/vllm_hash_keys.py answers for ``spec`` (for a list of specs,
    a list of answers; NONE_HASH by vLLM's rule for sha256: no PYTHONHASHSEED)."""
    return ask_vllm("vllm_hash_keys.py", spec, hash_seed=False, venv=VENV)


OFFSETS_VS_VLLM = (20, 21, 40)


def frontend_cases(n: int = 320, seed: int = 3400) -> list[dict]:
    """Requests that arrive with a frontend's prompt hashes (vLLM 0.34): every hash algorithm,
    block sizes 1 to 64, lookahead tokens 0 or more, PYTHONHASHSEED set or not (sha256 only:
    the xxhash algorithms' seed is random without it), salts and LoRA adapters, engines that do
    not hash at all, and hash lists of the right count (made-up bytes: taken as sent), of a
    wrong count, or none."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        algo = HASH_ALGOS[i % len(HASH_ALGOS)]
        bs = rng.choice((1, 4, 16, 64))
        lookahead = rng.choice((0, 0, 1, 3))
        prompt = [rng.randrange(1, 50_000) for _ in range(rng.randrange(1, 4 * bs + 8))]
        fits = max(len(prompt) - lookahead, 0) // bs  # what frontend_block_hashes accepts
        count = rng.choice((None, fits, fits, fits, fits + 1, max(fits - 1, 0), fits + 3))
        width = 16 if algo.startswith("xxhash") else 32
        seed_env = "0" if algo.startswith("xxhash") else rng.choice((None, "0", "lab"))
        cases.append(
            {
                "hash_algo": algo,
                "hash_block_size": bs,
                "lookahead": lookahead,
                "pythonhashseed": seed_env,
                "engine_hashes": rng.random() > 0.1,
                "prompt": prompt,
                "salt": rng.choice((None, None, "", "tenant-a")),
                "lora": rng.choice((None, None, ["sql", 1, "/adapters/sql"])),
                "block_hashes": None
                if count is None
                else [rng.randbytes(width).hex() for _ in range(count)],
                "outputs": [rng.randrange(1, 50_000) for _ in range(rng.randrange(0, 2 * bs + 2))],
            }
        )
    return cases


FRONTEND_CASES = frontend_cases()


@pytest.fixture(scope="module")
def vllm_studies():
    """vLLM's answers for the study at each of OFFSETS_VS_VLLM and for FRONTEND_CASES (key
    "frontend"), from one vLLM interpreter."""
    specs = []
    for offset in OFFSETS_VS_VLLM:
        s = hash_keys_study(TOKENS, offset)
        specs.append(vllm_spec(TOKENS, s.image_offset, s.embeds_row))
    specs.append({"frontend": FRONTEND_CASES})
    return dict(zip(OFFSETS_VS_VLLM + ("frontend",), vllm_says(specs)))


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
@pytest.mark.xdist_group("vllm-hash-keys")  # one worker: the module fixture's one interpreter
@pytest.mark.parametrize("offset", OFFSETS_VS_VLLM)
def test_vllms_own_code_gives_the_same_hashes_keys_and_hits(offset, vllm_studies):
    s = hash_keys_study(TOKENS, offset)
    theirs = vllm_studies[offset]
    for v in s.variants:
        assert hashes(s, v.variant) == theirs["hashes"][v.variant], v.variant
        assert [plain_keys(b.extra_keys) for b in v.blocks] == theirs["keys"][v.variant]
        assert v.hit_after_plain == theirs["hits"][f"plain>{v.variant}"], v.variant
        assert v.hit_after_itself == theirs["hits"][f"{v.variant}>{v.variant}"], v.variant
        if v.neighbour:
            assert v.hit_after_neighbour == theirs["hits"][f"{v.neighbour}>{v.variant}"]


def kvcore_frontend_case(case: dict, engines: dict, monkeypatch) -> dict:
    """kvcore's answer for a frontend case: the lab's engine (its seed resolved from
    PYTHONHASHSEED as vLLM resolves it) builds the PrefixHashConfig and takes the request in
    (``EngineCore.preprocess_add_request``). kvcore does not hash with lookahead tokens, so with
    them only the config's root and ``frontend_block_hashes``' answer are compared."""
    if case["pythonhashseed"] is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", case["pythonhashseed"])
    algo, bs, caching = case["hash_algo"], case["hash_block_size"], case["engine_hashes"]
    key = (algo, bs, caching, case["pythonhashseed"])
    if key not in engines:
        engines[key] = make_engine(
            block_size=bs, hash_algo=algo, hash_seed=None, enable_prefix_caching=caching
        ).engine_core
    core = engines[key]
    lora = case["lora"]
    sent = case["block_hashes"]
    request = EngineCoreRequest(
        "r",
        list(case["prompt"]),
        max_tokens=1 + len(case["outputs"]),
        cache_salt=case["salt"],
        lora_request=None if lora is None else LoRARequest(*lora),
        block_hashes=None if sent is None else [bytes.fromhex(h) for h in sent],
    )
    config = core.prefix_hash_config
    if config is not None and case["lookahead"]:
        config = replace(config, num_lookahead_tokens=case["lookahead"])
    taken = frontend_block_hashes(request, config)
    out = {
        "none_hash": None if config is None else config.none_hash.hex(),
        "taken": None if taken is None else [h.hex() for h in taken],
    }
    if case["lookahead"]:
        return out
    req = core.preprocess_add_request(request)
    if case["outputs"]:
        req.append_output_token_ids(case["outputs"])
    out["hashes"] = [h.hex() for h in req.block_hashes]
    return out


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
@pytest.mark.xdist_group("vllm-hash-keys")  # one worker: the module fixture's one interpreter
def test_frontend_block_hashes_are_taken_and_continued_as_vllms(vllm_studies, monkeypatch):
    """vLLM 0.34.0's EngineCore against kvcore's on FRONTEND_CASES: the same NONE_HASH in the
    PrefixHashConfig, the same frontend hashes taken (or the same None), and the same block
    hashes once the request's outputs are appended (the engine's hasher goes on after the
    frontend's hashes, or hashes the whole prompt when it refused them)."""
    theirs = vllm_studies["frontend"]
    engines: dict = {}
    outcomes = set()
    for i, case in enumerate(FRONTEND_CASES):
        ours = kvcore_frontend_case(case, engines, monkeypatch)
        want = {k: v for k, v in theirs[i].items() if k in ours}
        assert ours == want, (i, case)
        outcomes.add((case["lookahead"] > 0, ours["taken"] is not None))
    # every kind of answer came up, with and without lookahead tokens
    assert outcomes == {(False, False), (False, True), (True, False), (True, True)}


def admissions(requests, block_size: int) -> list[int]:
    """The tokens each request hits when they are admitted one after the other on one fresh
    kvcore KVCacheManager, each freed (its full blocks cached) before the next."""
    kvm = KVCacheManager(KVCacheConfig(4096, (full_attention(block_size),)))
    out = []
    for req in requests:
        blocks, n, _ = kvm.get_computed_blocks(req)
        kvm.allocate_slots(req, req.num_tokens - n, n, blocks)
        kvm.free(req)
        out.append(n)
    return out


@pytest.mark.skipif(
    not (Path(VENV) / "bin" / "python").exists(),
    reason=f"no vLLM 0.34.0 scratch environment at {VENV} (bash scripts/vllm_env.sh builds it)",
)
def test_the_example_scenarios_requests_hash_and_hit_as_vllms(tiny_model):
    """paged_kv_lab/content/examples/prompt_embeds.json's requests as the engine builds them (the
    tiny
    model's rows, sha256): vLLM's Request (an embeddings prompt without token ids, the items'
    identifiers), block hasher and KVCacheManager give the same hashes and the same hits."""
    scenario = load_scenario(ROOT / "paged_kv_lab" / "content" / "examples" / "prompt_embeds.json")
    engine = replace(scenario.engine, hash_algo="sha256", hash_seed="vllm-none-hash")
    scenario = replace(scenario, model="tiny-random", device="cpu", engine=engine)
    eng = Engine(scenario, model=tiny_model)
    for request in scenario.requests:
        eng.add_request(request)
    requests = list(eng.requests.values())
    sent = [
        {
            "id": r.request_id,
            "token_ids": None if r.prompt_embeds is not None else r.prompt_token_ids,
            "embeds": [row.hex() for row in r.prompt_embeds] if r.prompt_embeds else None,
            "mm": [
                [f.identifier, f.mm_position.offset, f.mm_position.length] for f in r.mm_features
            ],
            "salt": r.cache_salt,
        }
        for r in requests
    ]
    theirs = vllm_says({"block_size": engine.block_size, "requests": sent})
    assert [[h.hex() for h in r.block_hashes] for r in requests] == theirs["hashes"]
    ours = admissions(requests, engine.block_size)
    assert ours == theirs["hits"]
    hit = dict(zip((r.request_id for r in requests), ours))
    assert hit["embeds"] == 0 and hit["noisy"] == 0 and hit["image-b"] == 8
    assert hit["noisy-again"] == (requests[3].num_tokens - 1) // 4 * 4


# -- the myth, live -------------------------------------------------------------------------------
@pytest.mark.parametrize("salts, outcome", [(("a", "b"), "differ"), (("a", "a"), "same")])
def test_the_myth_names_two_requests_that_share_their_first_tokens(salts, outcome):
    eng = make_engine(
        [spec("A", range(9), max_tokens=1, cache_salt=salts[0])]
        + [spec("B", range(9), max_tokens=1, cache_salt=salts[1], arrival_step=3)]
    )
    eng.run()
    snaps = [rec.snapshot for rec in eng.history]
    (said,) = M.LIVE["token_ids_only"](snaps, None)
    assert said.key == f"myth.token_ids_only.live.{outcome}"
    text = tr(said, "en")
    assert "A and B start with the same block of tokens" in text
    if outcome == "differ":
        assert "their cache salts: a and b" in text


def test_the_myth_says_so_when_no_two_requests_share_a_first_block():
    eng = make_engine([spec("A", range(9), max_tokens=1), spec("B", range(50, 59), max_tokens=1)])
    eng.run()
    (said,) = M.LIVE["token_ids_only"]([rec.snapshot for rec in eng.history], None)
    assert said.key == "myth.token_ids_only.live.none"


# -- the page -------------------------------------------------------------------------------------
def shown(at) -> dict:
    hashes_, keys, hits = (d.value for d in at.dataframe)
    return {"hashes": hashes_, "keys": keys, "hits": hits}


def prepared(at):
    from paged_kv_lab.ui.topic_pages import prepare_studies

    prepare_studies(at.session_state["_model_state"].model)
    return at.run()


def test_the_page_shows_the_study_and_follows_the_slider():
    at = prepared(app("hashkeys"))
    assert not at.exception, [e.value for e in at.exception]
    from paged_kv_lab.ui.topic_pages import STUDIES, _model_key

    model = at.session_state["_model_state"].model
    ids = STUDIES.peek(("hashkeys", *_model_key(model)))
    assert list(ids) == list(model.encode_prompt(HASH_KEYS_PROMPT, True))
    slider = at.slider(key="topic_image_offset")
    s = hash_keys_study(ids, slider.value)
    grids = shown(at)
    keys = grids["keys"]
    image_row = keys.iloc[list(HASH_VARIANTS).index("image"), 1:]
    assert [i for i, cell in enumerate(image_row) if "'mm'" in cell] == list(s.touched)
    hash_row = grids["hashes"].iloc[list(HASH_VARIANTS).index("salt"), 1:]
    assert list(hash_row) == [h[:8] for h in hashes(s, "salt")]
    before = list(s.touched)
    slider.set_value(0).run()
    assert not at.exception
    moved = shown(at)["keys"].iloc[list(HASH_VARIANTS).index("image"), 1:]
    after = [i for i, cell in enumerate(moved) if "'mm'" in cell]
    assert after == [0, 1] != before
    text = " ".join(m.value for m in at.markdown)
    assert "touch blocks 0 / 1" in text and "(+0 / -16:" in text


def test_the_page_in_chinese_and_its_questions():
    at = prepared(app("hashkeys"))
    at.session_state["lang"] = "zh"
    at.session_state["_prefs"] = {**at.session_state["_prefs"], "lang": "zh"}
    at.run()
    assert not at.exception
    assert any("额外键" in m.value for m in at.markdown)
    questions = TOPIC_QUESTIONS["hashkeys"]
    assert len(questions) == 4
    at.session_state["questions_open:hashkeys"] = True
    at.run()
    first = at.radio(key="cq:hashkeys:0")
    first.set_value(tr(questions[0].options[questions[0].answer], "zh")).run()
    assert at.success and not at.error


def test_the_page_in_a_pseudo_language_says_only_catalogue_sentences(pseudo_language):  # noqa: F811
    """The pseudo-language walk (test_pseudo_language.py) meets this page before its prompt is
    tokenized, behind the note; here the page is read with its tables, sentences and questions."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    prepared(at)
    open_page(at, "hashkeys")
    at.session_state["lang"] = "xx"
    at.session_state["questions_open:hashkeys"] = True
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.dataframe) == 3 and len(at.radio) == len(TOPIC_QUESTIONS["hashkeys"])
    texts = explore(at)
    assert not page_leftovers(texts), page_leftovers(texts)
