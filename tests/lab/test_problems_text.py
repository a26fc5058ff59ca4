"""A refused scenario, trace file or workload trace says each problem in the reader's language.

Each problem is a catalogue sentence whose fields are the data (a field's path, the value found):
``str(e)`` and ``e.problems`` stay English (the CLI, logs and other tests read them), the app
shows ``e.lines(lang)`` / ``said(e, lang)``; a language added from data alone reaches them too.
Unit-level and cheap: no model, no page.
"""

from __future__ import annotations

import pytest
from pydantic_core import PydanticKnownError

from paged_kv_lab.run.scenario import (
    _PYDANTIC_TYPES,
    ScenarioError,
    load_scenario,
    pydantic_said,
)
from paged_kv_lab.run.trace_file import TraceError, read_trace
from paged_kv_lab.text import i18n
from paged_kv_lab.text.i18n import said, tr
from paged_kv_lab.workloads.trace_formats import TraceError as WorkloadTraceError
from paged_kv_lab.workloads.trace_formats import parse_trace
from support.pseudo import CJK, leftovers

BAD_SCENARIO = {
    "engine": {"block_size": "x", "blk": 1, "prefix_match_unit": 5},
    "requests": [{"id": "a", "prompt": "hi"}, {"id": "a"}],
}
BAD_TRACE = '{"step": 1}\n{"outputs": {"r": {"token_ids": "ab"}}}\n[1]\n'
BAD_WORKLOAD = [b'{"timestamp": 0, "input_length": 2, "output_length": 1, "hash_ids": [-1]}']


def refusals():
    with pytest.raises(ScenarioError) as s:
        load_scenario(BAD_SCENARIO)
    with pytest.raises(TraceError) as t:
        read_trace(BAD_TRACE)
    with pytest.raises(WorkloadTraceError) as w:
        parse_trace(BAD_WORKLOAD, "t.jsonl")
    return s.value, t.value, w.value


def test_problems_are_english_in_str_and_chinese_in_zh():
    s, t, w = refusals()
    assert s.problems == s.lines("en") and str(s) == said(s, "en")
    assert "engine.block_size: must be an integer >= 1; got 'x'" in s.problems
    assert "requests[1].id: duplicate id 'a'" in s.problems
    zh = s.lines("zh")
    assert len(zh) == len(s.problems) >= 4 and all(CJK.search(line) for line in zh)
    assert "engine.block_size：应为 >= 1 的整数；实际为 'x'" in zh  # path and value unchanged
    assert said(s, "zh").startswith("场景无效：\n  - ") and "'x'" in said(s, "zh")

    assert 'line 2: outputs must map request ids to {"token_ids"' in str(t)
    assert all(CJK.search(line) for line in t.lines("zh")) and "第 3 行：" in said(t, "zh")

    assert str(w) == "t.jsonl line 1: hash_ids must hold integers >= 0; got -1"
    assert said(w, "zh") == "t.jsonl 第 1 行：hash_ids 只能包含 >= 0 的整数；实际为 -1"


def test_the_engines_refusals_are_catalogue_sentences():
    from paged_kv_lab.run.engine import EngineRefused

    e = EngineRefused("request.max_model_len", id="'A'", tokens=9, max_model_len=8)
    assert str(e) == "request 'A': prompt of 9 tokens reaches max_model_len 8"
    assert said(e, "zh") == "请求 'A'：9 个 token 的提示词达到了 max_model_len 8"


def test_a_language_from_data_reaches_every_problem(pseudo_language):  # noqa: F811
    lines = []
    for e in refusals():
        lines += e.lines("xx") if hasattr(e, "lines") else []
        lines.append(said(e, "xx"))
    for line in lines:
        assert line.startswith(tr("refusal.invalid_scenario", "xx")[:1]), line
        assert not leftovers(line), (line, leftovers(line))
    assert "xx" in i18n.languages()


def test_pydantic_sentences_are_pydantics_english():
    """Each pydantic error type the schema meets has a catalogue sentence whose English is
    pydantic's own message, so a problem reads in English as pydantic wrote it."""
    ctx = {"ge": 1, "gt": 0, "le": 5, "lt": 1, "expected": "'a' or 'b'", "field_type": "List"}
    ctx |= {"actual_length": 0, "class_name": "X", "tag": "x", "discriminator": "'kind'"}
    ctx |= {"expected_tags": "'a', 'b'"}
    for kind, names in _PYDANTIC_TYPES.items():
        for count in (1, 2):
            c = {k: {**ctx, "min_length": count, "max_length": count}[k] for k in names}
            msg = PydanticKnownError(kind, c or None).message()
            text = pydantic_said({"type": kind, "ctx": c, "msg": msg})
            assert text.key != "pydantic.said" and tr(text, "en") == msg, kind
            assert CJK.search(tr(text, "zh")), kind
    unknown = pydantic_said({"type": "uuid_type", "msg": "Input should be a valid UUID"})
    assert tr(unknown, "zh") == "Input should be a valid UUID"  # the last resort, named as such
