"""Answers to "why?" (why.explain, why.explain_blocks, why.explain_text): one run per
reason a hit stops where it does, the life of a block against every recorded snapshot (random
runs), two requests side by side, and the ``explain`` subcommand."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from paged_kv_lab.cli.main import main
from paged_kv_lab.recording import events as E
from paged_kv_lab.run import trace_file as trace
from paged_kv_lab.run.scenario import Scenario, scenario_to_dict
from paged_kv_lab.why import explain as X
from paged_kv_lab.why.explain import CacheHistory, RecordedSteps, explain_hit
from paged_kv_lab.why.explain_blocks import compare_requests, life_of_block
from paged_kv_lab.why.explain_text import hit_sentences
from support.event_runs import every_kind_runs
from support.kv import make_engine, spec, vllm_chain

# the app tests here run the app on the tiny model (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("tiny_model_env")

VLLM_BLOB = "https://github.com/vllm-project/vllm/blob/v0.34.0/"  # the tag the links point into
A = list(range(100, 108))  # two blocks of 4


def record(requests, decode=None, **kw) -> RecordedSteps:
    eng = make_engine(requests, **kw)
    initial = eng.snapshot()
    return RecordedSteps(initial, tuple(eng.run()), eng.settings, decode)


def why(run, rid, step=None) -> X.HitExplanation:
    out = explain_hit(run, rid, step)
    assert len(out) == 1
    return out[0]


def words(ids) -> str:
    return " ".join(f"w{i}" for i in ids)


# -- 1. why this hit length: one run per reason ----------------------------------------------
def test_never_computed_names_the_first_missing_block():
    run = record(
        [
            spec("A", A[:6], max_tokens=1),
            spec("B", A[:6] + [1, 2, 3, 4, 5, 6], max_tokens=1, arrival_step=3),
        ]
    )
    x = why(run, "B")
    assert (x.reason, x.step, x.hit_tokens, x.block_index) == (X.NEVER_COMPUTED, 4, 4, 1)
    # hashed independently
    assert x.block_hash == vllm_chain(A[:6] + [1, 2, 3, 4, 5, 6], run.block_size())[1].hex()


def test_evicted_names_who_computed_it_and_who_took_the_block():
    run = record(
        [
            spec("A", A, max_tokens=1),
            spec("B", range(200, 216), max_tokens=1, arrival_step=2),
            spec("C", A, max_tokens=1, arrival_step=4),
        ],
        num_gpu_blocks=6,
    )
    x = why(run, "C")
    assert x.reason == X.EVICTED and x.block_index == 1 and x.hit_tokens == 4
    assert (x.other_request, x.cached_step, x.lost_step, x.evicted_for) == ("A", 1, 3, "B")
    # the block named is the one the Evicted event of that step names, with that hash
    ev = [e for e in run.records[2].events if e.kind == E.EVICTED and e.block_hash == x.block_hash]
    assert ev and ev[0].block_ids == (x.cached_block,) and ev[0].request_id == "B"
    assert "evicted at step 3" in " ".join(hit_sentences(x)) and "B" in hit_sentences(x)[1]


def test_reset_prefix_cache():
    eng = make_engine([spec("A", A, max_tokens=1)])
    initial = eng.snapshot()
    recs = eng.run()
    assert eng.reset_prefix_cache()
    eng.add_request(spec("C", A, max_tokens=1))
    recs += eng.run()
    x = why(RecordedSteps(initial, tuple(recs), eng.settings), "C")
    assert (x.reason, x.block_index, x.other_request, x.cached_step, x.lost_step) == (
        X.RESET,
        0,
        "A",
        1,
        2,
    )


def test_a_different_cache_salt():
    run = record(
        [
            spec("A", A, max_tokens=1, cache_salt="alice"),
            spec("B", A, max_tokens=1, arrival_step=3, cache_salt="bob"),
        ]
    )
    x = why(run, "B")
    assert (x.reason, x.block_index, x.other_request, x.salt, x.other_salt) == (
        X.SALT,
        0,
        "A",
        "bob",
        "alice",
    )
    assert "'alice'" in hit_sentences(x)[1]


def test_tokens_differ_at_a_position_with_both_texts():
    date_a = [7, 7, 1, 2] + A  # a "date" at the front of a system prompt
    date_b = [7, 7, 3, 4] + A
    run = record(
        [spec("A", date_a, max_tokens=1), spec("B", date_b, max_tokens=1, arrival_step=3)],
        decode=words,
    )
    x = why(run, "B")
    assert (x.reason, x.block_index, x.token_position, x.other_request) == (
        X.TOKENS_DIFFER,
        0,
        2,
        "A",
    )
    assert (
        x.text_before == "w7 w7"
        and x.text_here.startswith("w3 w4")
        and x.text_other.startswith("w1 w2")
    )
    zh = " ".join(hit_sentences(x, "zh"))
    assert "第 2 个 token" in zh and "'w3 w4" in zh


def test_tokens_differ_later_in_the_chain():
    run = record(
        [
            spec("A", A + [9, 9, 9, 9], max_tokens=1),
            spec("B", A[:6] + [5, 5, 5, 5, 5, 5], max_tokens=1, arrival_step=3),
        ]
    )
    x = why(run, "B")
    assert (x.reason, x.block_index, x.token_position, x.hit_tokens) == (X.TOKENS_DIFFER, 1, 6, 4)


@pytest.mark.parametrize(
    "tokens,reason,hit,block",
    [
        (A, X.CAPPED_LAST_TOKEN, 4, 1),  # both blocks cached; the last token is recomputed
        (A + [1], X.PARTIAL_BLOCK, 8, 2),  # every full block hit; the rest is a partial block
    ],
)
def test_rules_after_a_full_prefix(tokens, reason, hit, block):
    run = record(
        [spec("A", A + [1, 2, 3], max_tokens=1), spec("B", tokens, max_tokens=1, arrival_step=3)]
    )
    x = why(run, "B")
    assert (x.reason, x.hit_tokens, x.block_index) == (reason, hit, block)


def test_capped_at_num_tokens_minus_one_when_the_prompt_is_whole_blocks():
    run = record([spec("A", A, max_tokens=1), spec("B", A, max_tokens=1, arrival_step=3)])
    x = why(run, "B")
    assert (x.reason, x.hit_tokens, x.cap, x.block_index) == (X.CAPPED_LAST_TOKEN, 4, 7, 1)


def test_other_rules():
    same = [spec("A", A, max_tokens=1), spec("B", A, max_tokens=1, arrival_step=3)]
    assert why(record(same, max_cache_hit_length=3), "B").reason == X.MAX_CACHE_HIT_LENGTH
    assert why(record(same, enable_prefix_caching=False), "B").reason == X.CACHING_OFF
    assert why(record([spec("A", A[:3], max_tokens=1)]), "A").reason == X.SHORTER_THAN_BLOCK


def test_hybrid_groups_must_agree_and_a_window_hits_only_where_it_kept_blocks():
    reqs = [spec("A", A, max_tokens=1), spec("B", A + [1, 2, 3, 4], max_tokens=1, arrival_step=3)]
    hybrid = why(
        record(
            reqs,
            block_size=2,
            sliding_window=4,
            layer_types=("full_attention", "sliding_attention"),
        ),
        "B",
    )
    assert (hybrid.reason, hybrid.hit_tokens, hybrid.block_index, hybrid.kept_blocks) == (
        X.GROUPS_DISAGREE,
        6,
        3,
        (1, 2),
    )
    alone = why(record(reqs, block_size=2, sliding_window=4), "B")
    assert (alone.reason, alone.hit_tokens, alone.kept_blocks) == (X.SLIDING_WINDOW, 6, (1, 2))


def test_resumption_after_preemption_is_explained_too():
    recs = dict(every_kind_runs())["preemption"]
    eng = make_engine([], num_gpu_blocks=6)
    run = RecordedSteps(None, recs, eng.settings)
    resumed = [(r.step, e) for r in recs for e in r.events if e.kind == E.RESUMED]
    assert resumed
    step, ev = resumed[0]
    out = explain_hit(run, ev.request_id, step)
    assert out[0].resumed and out[0].step == step and out[0].hit_tokens == ev.num_cached_tokens
    assert "resumed" in hit_sentences(out[0])[0]


def test_a_random_none_hash_seed_is_explained_from_the_hashes_the_engine_kept(monkeypatch):
    """The snapshot carries the engine's own block hashes, so even a random NONE_HASH seed
    (xxhash, hash_seed null: nobody could recompute them) is explained: B hits A's block."""
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    run = record(
        [spec("A", A, max_tokens=1), spec("B", A, max_tokens=1, arrival_step=3)],
        hash_algo="xxhash",
        hash_seed=None,
    )
    x = why(run, "B")
    assert x.reason != X.CANNOT_REHASH and x.hit_tokens == 4


def test_a_recording_without_block_hashes_says_it_cannot_name_the_missing_block():
    import dataclasses

    run = record([spec("A", A, max_tokens=1), spec("B", A, max_tokens=1, arrival_step=3)])

    def strip(snap):
        return dataclasses.replace(
            snap, requests=tuple(dataclasses.replace(r, block_hashes=()) for r in snap.requests)
        )

    run = dataclasses.replace(
        run,
        initial=strip(run.initial),
        records=tuple(dataclasses.replace(r, snapshot=strip(r.snapshot)) for r in run.records),
    )
    x = why(run, "B")
    assert x.reason == X.CANNOT_REHASH
    assert "kept no block hashes" in hit_sentences(x)[1]


def test_unknown_request_or_step_is_a_clear_error():
    run = record([spec("A", A, max_tokens=1, arrival_step=2)])
    with pytest.raises(X.ExplainError, match="no request 'Z'"):
        explain_hit(run, "Z")
    with pytest.raises(X.ExplainError, match="not admitted by step 1"):
        explain_hit(run, "A", 1)
    full = record([spec("A", A, max_tokens=3), spec("B", A, max_tokens=1)], max_num_seqs=1)
    with pytest.raises(
        X.ExplainError, match=r"not admitted by step 1 \(last held back at step 1: max_num_seqs\)"
    ):
        explain_hit(full, "B", 1)
    with pytest.raises(X.ExplainError, match="outside the pool"):
        life_of_block(run, 99)


# -- random runs: every answer agrees with the recorded steps ------------------------------------
@st.composite
def small_runs(draw):
    bs = draw(st.sampled_from([2, 4]))
    n = draw(st.integers(1, 4))
    prefix = draw(st.lists(st.integers(0, 3), min_size=0, max_size=8))
    reqs = []
    for i in range(n):
        tail = draw(st.lists(st.integers(0, 3), min_size=1, max_size=8))
        reqs.append(
            spec(
                f"R{i}",
                (prefix if draw(st.booleans()) else []) + tail,
                max_tokens=draw(st.integers(1, 4)),
                arrival_step=draw(st.integers(0, 4)),
                cache_salt=draw(st.sampled_from([None, None, "s"])),
            )
        )
    kw = dict(block_size=bs, num_gpu_blocks=draw(st.integers(5, 12)))
    if draw(st.booleans()):
        kw.update(sliding_window=bs * 2, layer_types=("full_attention", "sliding_attention"))
    return reqs, kw


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_runs())
def test_answers_agree_with_the_recorded_snapshots(case):
    reqs, kw = case
    try:
        run = record(reqs, **kw)
    except ValueError:  # a prompt that never fits this pool
        assume(False)
    # the life of every block equals what each snapshot says about it
    for b in range(len(run.initial.blocks)):
        life = life_of_block(run, b)
        for state in life.states[1:]:
            view = run.records[state.step - 1].snapshot.blocks[b]
            if view.is_null:
                continue
            assert (state.ref_cnt, state.block_hash, state.owners) == (
                view.ref_cnt,
                view.block_hash,
                tuple(sorted(view.owners)),
            ), (b, state.step)
            assert (state.queue_pos is None) == (state.ref_cnt > 0)
    # every admission: the hit is the recorded one, a missing block really was missing then
    history = CacheHistory(run)
    for r in reqs:
        for step, _, ev in X.admissions(run, r.id):
            x = explain_hit(run, r.id, step)[0]
            assert x.hit_tokens == ev.num_cached_tokens
            assert x.reason in X.MISS_REASONS + X.RULE_REASONS
            if x.is_miss:
                assert x.block_index == x.hit_blocks
                lookup = max(
                    i
                    for i, e in enumerate(run.records[step - 1].events)
                    if e.kind in (E.CACHE_HIT, E.CACHE_MISS) and e.request_id == r.id
                )
                assert not history.present(f"{x.block_hash}@{x.group}", (step, lookup))
            assert hit_sentences(x, "zh") and hit_sentences(x, "en")


# -- 3. side by side -----------------------------------------------------------------------------
def test_two_requests_side_by_side():
    run = record(
        [
            spec("A", A + [1, 2, 3, 4], max_tokens=3),
            spec("B", A + [5, 6, 7, 8], max_tokens=3, arrival_step=1),
        ]
    )
    c = compare_requests(run, "A", "B")
    assert (c.diverge_index, c.reason, c.token_position) == (2, X.TOKENS_DIFFER, 8)
    assert [r.same for r in c.rows[:3]] == [True, True, False]
    # they shared blocks 0 and 1 from B's admission (step 2) while both ran
    assert [(s.index, s.first_step) for s in c.shared] == [(0, 2), (1, 2)]
    for s in c.shared:
        for step in range(s.first_step, s.last_step + 1):
            assert {"A", "B"} <= set(run.records[step - 1].snapshot.blocks[s.block_id].owners)
    salted = record(
        [spec("A", A, max_tokens=1, cache_salt="x"), spec("B", A, max_tokens=1, arrival_step=3)]
    )
    c = compare_requests(salted, "A", "B")
    assert (c.diverge_index, c.reason, c.salt_a, c.salt_b, c.shared) == (0, X.SALT, "x", None, ())


# -- the CLI ---------------------------------------------------------------------------------------
@pytest.fixture
def trace_file(tmp_path):
    reqs = [
        spec("A", A, max_tokens=1),
        spec("B", range(200, 216), max_tokens=1, arrival_step=2),
        spec("C", A, max_tokens=1, arrival_step=4),
    ]
    eng = make_engine(reqs, num_gpu_blocks=6)
    scen = Scenario(name="t", model="tiny-random", engine=eng.settings, requests=tuple(reqs))
    lines = [trace.header_line(scenario_to_dict(scen), eng.snapshot())]
    lines += [trace.step_line(r) for r in eng.run()]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_cli_explains_a_trace(trace_file, capsys):
    assert main(["explain", "--trace", str(trace_file), "--request", "C"]) == 0
    out = capsys.readouterr().out
    assert "evicted at step 3" in out and VLLM_BLOB in out
    assert main(["explain", "--trace", str(trace_file), "--block", "2", "--lang", "zh"]) == 0
    out = capsys.readouterr().out
    assert "块 2 的一生" in out and "被驱逐" in out
    assert main(["explain", "--trace", str(trace_file), "--request", "A", "--vs", "C"]) == 0
    assert "A and C" in capsys.readouterr().out
    assert main(["explain", "--trace", str(trace_file), "--calls", "--step", "3"]) == 0
    out = capsys.readouterr().out
    assert (
        out.index("get_computed_blocks") < out.index("allocate_slots") < out.index("get_new_blocks")
    )


def test_cli_refuses_bad_questions(trace_file, capsys):
    assert main(["explain", "--trace", str(trace_file), "--request", "Z"]) == 2
    assert "no request 'Z'" in capsys.readouterr().err
    assert main(["explain", "--trace", str(trace_file)]) == 2
    assert main(["explain", "--trace", str(trace_file) + ".missing", "--block", "1"]) == 2
    assert main(["explain", "--request", "A"]) == 2


def test_cli_runs_a_scenario_first(tmp_path, capsys, tiny_model):
    path = tmp_path / "s.json"
    path.write_text(
        '{"model": "tiny-random", "device": "cpu", "engine": {"block_size": 4, '
        '"num_gpu_blocks": 16}, "requests": [{"id": "A", "prompt_token_ids": [5, 6, '
        '7, 8, 9, 10, 11, 12], "max_tokens": 1}, {"id": "B", "prompt_token_ids": '
        '[5, 6, 7, 8, 9, 10, 11, 12], "max_tokens": 1, "arrival_step": 3}]}'
    )
    assert main(["explain", str(path), "--request", "B"]) == 0
    assert "num_tokens − 1 = 7" in capsys.readouterr().out


# -- the app's why-panel ---------------------------------------------------------------------------
def _why_page():
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    import streamlit as st

    sys.path.insert(0, str(Path("tests").resolve()))
    from paged_kv_lab.ui.why_panel import why_panel
    from support.kv import make_engine, spec

    A = list(range(100, 108))
    eng = make_engine(
        [
            spec("A", A, max_tokens=1),
            spec("B", range(200, 216), max_tokens=1, arrival_step=2),
            spec("C", A, max_tokens=1, arrival_step=4),
        ],
        num_gpu_blocks=6,
    )
    initial = eng.snapshot()
    # what the panel reads of a Timeline: the scenario, the state before step 1, the records
    run = SimpleNamespace(scenario=eng.scenario, initial=initial, records=eng.run(), trace=None)
    why_panel(run, st.session_state.get("lang", "en"), "t")


def test_why_panel_shows_a_request_and_a_block_in_both_languages():
    from streamlit.testing.v1 import AppTest

    for lang, hit, life in (
        ("en", "evicted at step 3", "The life of block 2"),
        ("zh", "被驱逐", "块 2 的一生"),
    ):
        at = AppTest.from_function(_why_page, default_timeout=60)
        at.session_state["lang"] = lang
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert not at.selectbox  # closed: nothing computed
        at.toggle(key="why_open:t").set_value(True).run()
        at.selectbox(key="why_req:t").set_value("C").run()
        text = " ".join(m.value for m in at.markdown)
        assert "C" in text and hit.replace(" ", "") in text.replace(" ", "").replace("\\", "")
        at.radio(key="why_mode:t").set_value("block").run()
        at.selectbox(key="why_block:t").set_value(2).run()
        assert not at.exception, [e.value for e in at.exception]
        text = " ".join(m.value for m in at.markdown)
        assert life.replace(" ", "") in text.replace(" ", "").replace("\\", "")
        assert len(at.dataframe) == 1
        for mode in ("two", "calls"):
            at.radio(key="why_mode:t").set_value(mode).run()
            assert not at.exception and len(at.dataframe) == 1, mode
        # the calls' vLLM column is named after the tag its permalinks point into
        urls = list(at.dataframe[0].value["vLLM 0.34.0"])
        assert urls and all(VLLM_BLOB in u for u in urls)
        at.selectbox(key="why_src:t").set_value("get_new_blocks").run()
        # our source, read at run time
        assert any("def get_new_blocks(" in c.value for c in at.code)
        assert any(VLLM_BLOB + "vllm/v1/core/block_pool.py#L" in m.value for m in at.markdown)


def test_why_panel_on_a_lesson_page_follows_the_player():
    from support.app import Browser, app

    at = app("prefix")
    at.toggle(key="why_open:prefix").set_value(True).run()
    # at step 0 there is nothing to ask
    assert "why_req:prefix" not in [s.key for s in at.selectbox]
    b = Browser(at, "prefix").until_recorded(1 << 20)
    b.show(len(b.steps))
    sb = at.selectbox(key="why_req:prefix")
    assert sb.options == ["A", "B", "C", "D"]
    sb.set_value("D").run()
    text = " ".join(m.value for m in at.markdown).replace("\\", "")
    assert "D was admitted at step" in text and "cache_salt 'user-2'" in text


@pytest.mark.parametrize("lesson_id", ["pd", "hybrid", "prefix", "secondtier", "specdec"])
def test_every_admission_of_a_lessons_run_is_explained(lesson_id, tiny_model):
    """Why? for every request of the lesson's run, in both languages: an answer for each admission
    (or the catalogue's refusal), never a crash. The P/D decode replica's admission counts the
    pulled tokens in its hit, which ends inside a block on a run whose hashes are per block."""
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.store.timeline import lesson_run

    run = lesson_run(BY_ID[lesson_id], tiny_model)
    run.run_to_end(timeout=300)
    steps = RecordedSteps(run.initial, tuple(run.records), run.scenario.engine)
    answered = 0
    for rid in steps.request_views():
        try:
            found = explain_hit(steps, rid)
        except X.ExplainError:
            continue
        for x in found:
            for lang in ("en", "zh"):
                assert hit_sentences(x, lang)
        answered += len(found)
    assert answered
