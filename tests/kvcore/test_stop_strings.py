"""Stop strings as vLLM 0.33 handles them (v1/engine/detokenizer.py, output_processor.py): the
output processor detokenizes each step's new tokens and searches the new text; on a match the
text is cut (before the string, or after it with include_stop_str_in_output), the tokens after
the one completing it are dropped, and the engine core finishes the request
(``EngineCore.abort_requests``: FINISHED_ABORTED in the scheduler, which frees its blocks); the
output says finish reason "stop" with the string as its stop_reason."""

import pytest

from kvcore.engine.detokenizer import IncrementalDetokenizer, check_stop_strings
from kvcore.request import RequestStatus
from paged_kv_lab.run.engine import Engine, EngineRefused
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario, SpeculativeConfig
from support.kv import events_of, make_engine, spec


@pytest.mark.parametrize(
    "text, new, stop, include, expected",
    [
        ("abcdef", 2, ["ef"], False, ("ef", 4)),
        ("abcdef", 2, ["ef"], True, ("ef", -1)),  # it ends the text: nothing to cut
        ("abcdefg", 2, ["ef"], True, ("ef", 6)),
        ("abcdef", 1, ["cd"], False, None),  # it ended before the new text
        ("abcdef", 3, ["de"], False, ("de", 3)),  # it ends inside the new text
        ("abcdef", 4, ["ef", "cd"], False, ("cd", 2)),  # the one that ends first
        ("abcdef", 4, ["cdef", "def"], False, ("cdef", 2)),  # same end: the first listed
        ("abc", 0, ["c"], False, None),
        ("abc", 3, [], False, None),
    ],
)
def test_check_stop_strings(text, new, stop, include, expected):
    assert check_stop_strings(text, new, stop, include) == expected


def letters(ids):
    return "".join(chr(ord("a") + i) for i in ids)


def test_tokens_after_the_one_completing_the_string_are_dropped():
    d = IncrementalDetokenizer(letters, ["cd"])
    assert d.update([0, 1], False) is None and d.output_text == "ab"
    # one step brings c, d, e, f (drafts accepted): d completes the string, e and f go
    assert d.update([2, 3, 4, 5], False) == "cd"
    assert (d.output_text, d.token_ids, d.stop_reason) == ("ab", [0, 1, 2, 3], "cd")
    kept = IncrementalDetokenizer(letters, ["cd"], include_stop_str_in_output=True)
    kept.update([0, 1, 2, 3, 4, 5], False)
    assert (kept.output_text, kept.token_ids) == ("abcd", [0, 1, 2, 3])


def test_a_stop_token_adds_no_text_unless_kept():
    d = IncrementalDetokenizer(letters, ["zz"])
    d.update([0, 2], stop_terminated=True)
    assert (d.output_text, d.token_ids) == ("a", [0, 2])


def test_an_unfinished_character_waits_for_its_next_token():
    pieces = {0: b"a", 1: b"\xe4\xb8", 2: b"\xad", 3: b"b"}

    def decode(ids):
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    d = IncrementalDetokenizer(decode, ["中b"])
    assert d.update([0, 1], False) is None and d.output_text == "a"
    assert d.update([2], False) is None and d.output_text == "a中"
    assert d.update([3], False) == "中b" and d.output_text == "a"


def run(loaded, stop=(), include=False, speculative=None, max_tokens=30):
    sc = Scenario(
        model=loaded.name,
        device=loaded.device.type,
        engine=EngineSettings(block_size=4, num_gpu_blocks=32, speculative=speculative),
        requests=(
            RequestSpec(
                "a",
                prompt="Hello there, how are",
                max_tokens=max_tokens,
                ignore_eos=True,
                stop=tuple(stop),
                include_stop_str_in_output=include,
            ),
        ),
    )
    eng = Engine(sc, model=loaded, debug=True)
    return eng, eng.run()


@pytest.fixture(scope="module")
def free_run(tiny_model):
    eng, _ = run(tiny_model)
    out = eng.outputs()["a"]
    return out["token_ids"], tiny_model.decode(out["token_ids"], skip_special_tokens=True)


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("speculative", [None, SpeculativeConfig(num_speculative_tokens=3)])
def test_the_text_is_the_free_runs_cut_at_the_stop_string(
    tiny_model, free_run, include, speculative
):
    tokens, text = free_run
    # a string the free run's text holds past its start, made of two different tokens' text
    words = text.split(" ")
    stop = next(f"{a} {b}"[-5:] for a, b in zip(words[1:], words[2:]) if a != b)
    at = text.index(stop)
    assert 0 < at and at + len(stop) < len(text)
    eng, recs = run(tiny_model, [stop, "never in the text"], include, speculative)
    out = eng.outputs()["a"]
    assert out["text"] == text[: at + len(stop) if include else at]
    assert (out["finish_reason"], out["stop_reason"]) == ("finished_stopped", stop)
    # the kept tokens: the free run's, up to the one whose text completes the string
    n = next(k for k in range(1, len(tokens) + 1) if stop in tiny_model.decode(tokens[:k]))
    assert out["token_ids"] == tokens[:n]
    # the scheduler was told by an abort, in the step that sampled that token, and freed it
    req = eng.requests["a"]
    assert req.status == RequestStatus.FINISHED_ABORTED and "a" not in eng.scheduler.requests
    (finished,) = events_of(recs, "finished", "a")
    assert finished.reason == "aborted" and events_of(recs[-1], "finished", "a")
    assert req.num_output_tokens >= n and req.num_output_tokens < len(tokens)
    pool = eng.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def test_a_stop_string_that_never_shows_changes_nothing(tiny_model, free_run):
    eng, _ = run(tiny_model, ["never in the text"])
    out = eng.outputs()["a"]
    assert out["token_ids"] == free_run[0] and out["text"] == free_run[1]
    assert out["finish_reason"] == "finished_length" and "stop_reason" not in out


def test_stop_strings_need_a_tokenizer():
    with pytest.raises(EngineRefused, match="stop"):
        make_engine([spec("a", [1, 2, 3], stop=("x",))])


def test_the_scenario_refuses_an_empty_stop_string():
    from paged_kv_lab.run.scenario import ScenarioError, load_scenario

    req = {"id": "a", "prompt": "hi", "stop": ["x", ""]}
    with pytest.raises(ScenarioError, match="stop"):
        load_scenario({"requests": [req]})
    req["stop"] = ["x", "yz"]
    assert load_scenario({"requests": [req]}).requests[0].stop == ("x", "yz")


def test_drafts_accepted_past_the_stop_string_are_dropped_from_the_output(tiny_model, free_run):
    tokens, _ = free_run
    stop = tiny_model.decode(tokens[:7])[1:]  # its first match ends with the 7th token
    eng, recs = run(tiny_model, [stop], True, SpeculativeConfig(num_speculative_tokens=3))
    out = eng.outputs()["a"]
    assert out["token_ids"] == tokens[:7] and out["text"] == tiny_model.decode(tokens[:7])
    # the step that completed it brought more tokens: the scheduler has them, the output not
    assert eng.requests["a"].num_output_tokens > 7
    assert max(len(t) for r in recs for t in r.new_tokens.values()) > 1


def test_a_trace_keeps_the_stop_reason(tiny_model, free_run):
    from paged_kv_lab.run.trace_file import Trace, read_trace

    stop = tiny_model.decode(free_run[0][:3])[1:]
    eng, recs = run(tiny_model, [stop])
    written = Trace(None, None, tuple(recs), eng.outputs())
    back = read_trace(written.to_jsonl())
    assert back.outputs == eng.outputs() and back.outputs["a"]["stop_reason"] == stop
