"""The casebook: "Why is my hit rate ...?", questions users asked on vLLM's issue tracker, each
reproduced as a scenario on the real model.

A ``Case`` is data, like a lesson: one folder per case (``<content>/cases/<id>/``) holding
``case.yaml`` with the issue it comes from, the scenario (its own ``scenario.json``, or a lesson's
such as ``../../lessons/prefix/scenario.json``, with named changes), its narration, and the "try
the fix" switch (``Fix``: the same scenario with some settings or requests changed); ``text.json``
with its sentences (the question as it was asked, the answer in vLLM's behaviour, in the releases
its ``holds_for`` names, which ours follows) under ``case.<id>.*``; ``golden.json``, the scenarios
the tests pin. The scenario is played as a ``Lesson``, so the lesson page's player, narration
and "why?" panel play it unchanged. The tests hold each case's claim as a check over the two
recorded runs (tests/support/casebook_claims.py), so what the page says is what the engine does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

from pydantic import BeforeValidator, Field, StrictBool, StrictInt, StrictStr
from typing_extensions import Annotated

from paged_kv_lab.content.catalog import (
    DataFile,
    Focus,
    Lesson,
    LessonDataError,
    Moment,
    MomentData,
    Panel,
    ScenarioChanges,
    ScenarioRef,
    Texts,
    build_moments,
    file_ref,
    load_scenario_ref,
    read_data,
    scenario_problems,
)
from paged_kv_lab.content.sources import Source
from paged_kv_lab.recording.snapshot import Snapshot
from paged_kv_lab.text.i18n import content_dir

CASE_FILE = "case.yaml"  # each case folder's data file (<content>/cases/<id>/case.yaml)


def issue_url(ref: str) -> str:
    """ "owner/repo#n" -> the issue's address on GitHub."""
    repo, n = ref.split("#")
    return f"https://github.com/{repo}/issues/{int(n)}"


@dataclass(frozen=True)
class Fix:
    """The switch "try the fix": ``changes`` to the case's scenario, and the fixed run's
    narration. Texts are catalogue keys."""

    label: str
    explain: str
    changes: ScenarioChanges
    moments: tuple[Moment, ...] = ()  # narration of the fixed run


@dataclass(frozen=True)
class Case:
    """One question and its reproduction. Invariant (tests/lab/test_casebook.py): every key moment
    of ``lesson`` and of the fixed run happens, and the case's claim
    (tests/support/casebook_claims.py)
    holds over the two runs. Texts are catalogue keys."""

    id: str
    number: int
    icon: str
    title: str  # the question, as users put it
    issue: str  # "owner/repo#n": the thread the question comes from
    asked: str  # what was asked, in a few sentences
    answer: str  # why, in vLLM (the releases holds_for names) and here
    lesson: Lesson  # the scenario, its narration and "run until" kinds
    fix: Optional[Fix] = None
    figure: str = "hit_rate"  # the number the before/after figure compares (NUMBERS, a fleet's
    # FLEET_NUMBERS too: run_numbers)
    related: tuple[str, ...] = ()  # more threads asking the same ("owner/repo#n")
    sources: tuple[Source, ...] = ()  # where vLLM 0.34.0 decides what the answer says
    where: str = "engine"  # where the question arises (WHERE): the casebook page groups by it
    holds_for: tuple[str, ...] = ()  # the vLLM releases whose source the answer was checked in

    @property
    def url(self) -> str:
        return issue_url(self.issue)

    def texts(self) -> tuple[str, ...]:
        """Every catalogue key the case shows (its scenario's and its fix's included)."""
        keys = [self.title, self.asked, self.answer, *self.lesson.texts()]
        if self.fix is not None:
            keys += [self.fix.label, self.fix.explain, *(m.text for m in self.fix.moments)]
        return tuple(keys)

    def fixed_lesson(self) -> Optional[Lesson]:
        """The case's scenario with the fix applied, as a lesson of its own (its own id, so the
        page keeps the two runs apart)."""
        if self.fix is None:
            return None
        scenario = self.fix.changes.apply(self.lesson.scenario)
        scenario["name"] = scenario.get("name", self.id) + "-fixed"
        return dataclasses.replace(
            self.lesson, id=self.lesson.id + "-fixed", scenario=scenario, moments=self.fix.moments
        )


# -- the numbers a case shows, from a run's last snapshot ----------------------------------
# numbers()' keys: what a case's before/after figure may compare (``figure``)
NUMBERS = (
    "hits",
    "queries",
    "hit_rate",
    "preempted_hits",
    "preempted_queries",
    "hit_rate_with_preempted",
    "usage",
    "cached_blocks",
    "preemptions",
)


def numbers(snap: Snapshot) -> dict[str, float]:
    """Hit counters as vLLM 0.33.0 and 0.34.0 keep them (PrefixCacheStats since the last reset), the
    rate as it was counted before vLLM #25787 (resumed requests' hits included), and the
    preemptions of the run (what vLLM's counter ``vllm:num_preemptions`` adds up: one per
    request preempted, finished requests included)."""
    pc = snap.prefix_cache
    hits, queries = int(pc.get("hits", 0)), int(pc.get("queries", 0))
    p_hits, p_queries = int(pc.get("preempted_hits", 0)), int(pc.get("preempted_queries", 0))
    return {
        "hits": hits,
        "queries": queries,
        "hit_rate": hits / queries if queries else 0.0,
        "preempted_hits": p_hits,
        "preempted_queries": p_queries,
        "hit_rate_with_preempted": (
            (hits + p_hits) / (queries + p_queries) if queries + p_queries else 0.0
        ),
        "usage": snap.usage,
        "cached_blocks": sum(1 for b in snap.blocks if b.block_hash is not None),
        "preemptions": sum(r.num_preemptions for r in snap.requests),
    }


# what a fleet case's figure may compare besides NUMBERS (run_numbers of a fleet's run)
FLEET_NUMBERS = ("router_hit_rate", "router_mean_hit_rate", "busiest_share")
# the numbers that are fractions (shown in %); the others are counts
RATES = ("hit_rate", "hit_rate_with_preempted", "usage", *FLEET_NUMBERS)


def run_numbers(records) -> dict[str, float]:
    """The numbers a run ends with. One engine's: its last snapshot's (``numbers``). A fleet's
    (records naming their replica, paged_kv_lab/fleet/model_fleet.py): vLLM's counters summed
    over every replica's last snapshot, as a dashboard sums the replicas' metrics; the router's
    hit rate, the prompt tokens its index showed on the replicas it chose over the prompt tokens
    routed (a ratio of sums, as the engines' is), and the same as the mean of each request's
    ratio of blocks (how Dynamo's ``router_kv_hit_rate`` histogram averages, ai-dynamo/dynamo
    #14903); and the busiest replica's share of the requests. ``usage`` is the fullest pool's."""
    last: dict[int, Snapshot] = {}
    for rec in records:
        if isinstance(rec.replica, int):
            last[rec.replica] = rec.snapshot
    if not last:
        return numbers(records[-1].snapshot)
    per = [numbers(s) for s in last.values()]
    out: dict[str, float] = {
        k: sum(p[k] for p in per)
        for k in (
            "hits",
            "queries",
            "preempted_hits",
            "preempted_queries",
            "cached_blocks",
            "preemptions",
        )
    }
    q, pq = out["queries"], out["queries"] + out["preempted_queries"]
    out["hit_rate"] = out["hits"] / q if q else 0.0
    out["hit_rate_with_preempted"] = (out["hits"] + out["preempted_hits"]) / pq if pq else 0.0
    out["usage"] = max(p["usage"] for p in per)
    routed = [r for rec in records for r in rec.routed]
    prompt = sum(r.num_prompt_tokens for r in routed)
    out["router_hit_rate"] = sum(r.predicted_tokens for r in routed) / prompt if prompt else 0.0
    ratios = [
        r.decision.overlap_blocks[r.replica] / -(-r.num_prompt_tokens // r.block_size)
        for r in routed
    ]
    out["router_mean_hit_rate"] = sum(ratios) / len(ratios) if ratios else 0.0
    counts: dict[int, int] = {}
    for r in routed:
        counts[r.replica] = counts.get(r.replica, 0) + 1
    out["busiest_share"] = max(counts.values()) / len(routed) if routed else 0.0
    return out


# -- the file format -------------------------------------------------------------------------
# where a case's question arises; the casebook page groups the cases in this order
WHERE = ("engine", "hybrid", "fleet", "disaggregation")
Issue = Annotated[StrictStr, Field(pattern=r"^[\w.-]+/[\w.-]+#[0-9]+$")]


class FixData(ScenarioChanges):
    moments: list[MomentData] = Field(default_factory=list)


class CaseData(DataFile):
    id: Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    number: Annotated[StrictInt, Field(ge=1)]
    icon: StrictStr
    issue: Issue
    related: list[Issue] = Field(default_factory=list)
    sources: list[Source] = Field(min_length=1)
    figure: Literal[NUMBERS + FLEET_NUMBERS] = "hit_rate"
    scenario: Annotated[ScenarioRef, BeforeValidator(file_ref)]
    moments: list[MomentData] = Field(default_factory=list)
    focus: Focus = ["cache_hit"]
    panels: list[Panel] = Field(default_factory=list)
    fix: Optional[FixData] = None
    own_model: StrictBool = False  # plays on its scenario's model, not the sidebar's
    where: Literal[WHERE]
    holds_for: list[Annotated[StrictStr, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]] = Field(
        min_length=1
    )


def load_case(path: Path, catalogue: Mapping[str, Any]) -> Case:
    """One case file, its texts checked against ``catalogue`` (key -> {lang: text})."""
    data: CaseData = read_data(path, CaseData)
    scenario = load_scenario_ref(data.scenario, path)
    texts = Texts(f"case.{data.id}", catalogue)
    title = texts.key("lesson_title", "lesson_title") or ""
    lesson = Lesson(
        id=f"case-{data.id}",
        number=0,
        icon=data.icon,
        title=title,
        summary=title,
        scenario=scenario,
        intro=texts.key("intro", "intro") or "",
        moments=build_moments(data.moments, texts),
        focus=tuple(data.focus),
        panels=tuple(data.panels),
        model=scenario.get("model") if data.own_model else None,
    )
    fix = None
    if data.fix is not None:
        changes = ScenarioChanges(**data.fix.model_dump(exclude={"moments"}, exclude_unset=True))
        fix = Fix(
            label=texts.key("fix.label", "fix") or "",
            explain=texts.key("fix.explain", "fix") or "",
            changes=changes,
            moments=build_moments(data.fix.moments, texts, "fix.moment", "fix.moments"),
        )
    case = Case(
        id=data.id,
        number=data.number,
        icon=data.icon,
        title=texts.key("title", "title") or "",
        issue=data.issue,
        asked=texts.key("asked", "asked") or "",
        answer=texts.key("answer", "answer") or "",
        lesson=lesson,
        fix=fix,
        figure=data.figure,
        related=tuple(data.related),
        sources=tuple(data.sources),
        where=data.where,
        holds_for=tuple(data.holds_for),
    )
    texts.check(path)
    if fix is not None:
        try:
            fixed = case.fixed_lesson()
        except ValueError as e:
            raise LessonDataError(path, [f"fix.{e}"]) from None
        problems = scenario_problems(fixed.scenario, "fix")
        if problems:
            raise LessonDataError(path, problems)
    return case


def cases_dir(root: Path | None = None) -> Path:
    """The cases' folder of the content folder ``root`` (``content_dir()`` when None)."""
    return (content_dir() if root is None else root) / "cases"


def load_cases(
    folder: Path | None = None, catalogue: Mapping[str, Any] | None = None
) -> tuple[Case, ...]:
    """Every case folder in ``folder`` (``<content>/cases``; the content folder's when None), by
    number (the whole catalogue when no ``catalogue`` is given)."""
    folder = cases_dir() if folder is None else folder
    if catalogue is None:
        from paged_kv_lab.text.i18n import catalogue as read_catalogue

        catalogue = read_catalogue()
    cases = sorted(
        (load_case(p, catalogue) for p in folder.glob(f"*/{CASE_FILE}")), key=lambda c: c.number
    )
    numbers_seen = [c.number for c in cases]
    if len(set(numbers_seen)) != len(numbers_seen):
        raise ValueError(f"{folder}: two cases share a number ({numbers_seen})")
    return tuple(cases)


@lru_cache(maxsize=4)
def _cases(root: Path) -> tuple[Case, ...]:
    return load_cases(cases_dir(root))


def cases() -> tuple[Case, ...]:
    """Every case of the content folder in use, by number (read and checked once per folder)."""
    return _cases(content_dir())


def cases_by_id() -> dict[str, Case]:
    return {c.id: c for c in cases()}


def __getattr__(name: str):
    # the old module-level names, read from the content folder in use when asked for
    if name == "CASES":
        return cases()
    if name == "CASES_BY_ID":
        return cases_by_id()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
