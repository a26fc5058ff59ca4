"""The code behind each decision (text.source_links): every vLLM permalink points into a file of
the v0.33.0 tag within its recorded length, every kvcore link is a real function, every event
kind has a chain, and a step's calls come out in call order."""

from __future__ import annotations

import inspect
import re

import pytest

from paged_kv_lab.recording import events as E
from paged_kv_lab.why.source_links import (
    FUNCTIONS,
    VLLM_FILE_LINES,
    VLLM_TAG,
    call_order,
    decision_link,
    event_calls,
)
from support.event_runs import every_kind_events, every_kind_runs

PERMALINK = re.compile(
    r"^https://github\.com/vllm-project/vllm/blob/v0\.33\.0/(vllm/[\w/]+\.py)#L(\d+)-L(\d+)$"
)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_vllm_permalinks_lie_in_the_tag_files(name):
    link = FUNCTIONS[name].vllm
    assert VLLM_TAG == "v0.33.0"
    m = PERMALINK.match(link.url)
    assert m, link.url
    path, start, end = m.group(1), int(m.group(2)), int(m.group(3))
    assert path == link.path and path in VLLM_FILE_LINES
    assert 1 <= start < end <= VLLM_FILE_LINES[path]
    # the vLLM function and ours carry the same method name (the house rule: vLLM's names)
    assert (
        link.qualname.split(".")[-1] == FUNCTIONS[name].ours.qualname.split(".")[-1]
        or name == "sample"
    )


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_kvcore_links_resolve_to_real_functions(name):
    ours = FUNCTIONS[name].ours
    fn = ours.resolve()
    assert inspect.isfunction(fn)
    assert fn.__qualname__ == ours.qualname and fn.__module__ == ours.module
    assert f"def {fn.__name__}(" in ours.source()


def test_every_event_kind_has_a_decision_link():
    seen = set()
    for ev in every_kind_events():
        chain = event_calls(ev, 2)
        assert chain and all(n in FUNCTIONS for n in chain)
        assert decision_link(ev, 2) is FUNCTIONS[chain[-1]]
        seen.add(ev.kind)
    assert seen == set(E.EVENT_KINDS)


def test_a_steps_calls_come_in_call_order():
    recs = dict(every_kind_runs())["preemption"]
    step = next(r for r in recs if any(e.kind == E.ALLOCATED for e in r.events))
    calls = call_order(step.events)
    names = [c.link.name for c in calls]
    assert (
        names.index("schedule")
        < names.index("get_computed_blocks")
        < names.index("allocate_slots")
        < names.index("get_new_blocks")
    )
    depth = {c.link.name: c.depth for c in calls}
    assert (depth["schedule"], depth["allocate_slots"], depth["get_new_blocks"]) == (0, 1, 3)
