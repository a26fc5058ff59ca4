"""Lessons as data: one folder per lesson (``<content>/lessons/<id>/``), validated on load.

The folder holds ``lesson.yaml`` (the settings, switches, moments, questions and class questions
below), ``scenario.json`` (the scenario it plays), ``text.json`` (its sentences, every language)
and ``golden.json`` (what the tests pin: its scenarios and its run). Its place, icon and URL are
its line in the page registry (content/registry.py), nowhere else.

A lesson is a scenario (a file named relative to its folder, with named changes), narration
and questions. Narration is tied to what really happens, not to step numbers: a ``Moment`` names
an event kind (and optionally a request and a predicate on the event) and its text is shown at the
first step where such an event occurs. Tests check that every key moment of every lesson occurs.

Every sentence lives in the catalogue (the folder's ``text.json``) under a key the
lesson's data implies (``lesson.<id>.intro``, ``lesson.<id>.moment.<n>``, ...; see ``_keys``);
the YAML holds no prose. A required key that is missing, a key the lesson never uses, a wrong
field or a wrong type is refused when the file is loaded, naming the file and the field.
docs/lessons.md ("Adding a lesson") describes both formats.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from typing_extensions import Annotated

from paged_kv_lab.content.datafile import DataFileError, load
from paged_kv_lab.content.quiz import class_questions
from paged_kv_lab.content.sources import Source
from paged_kv_lab.recording.events import (
    EVENT_KINDS,
    Allocated,
    Cached,
    CacheHit,
    Event,
    Freed,
    Scheduled,
    Touched,
)
from paged_kv_lab.recording.snapshot import StepRecord
from paged_kv_lab.run.scenario import LAYER_TYPES, EngineSettings, ScenarioError, load_scenario
from paged_kv_lab.text.i18n import content_dir

# the data file of each kind of content folder (<content>/<kind>/<id>/<file>)
LESSON_FILE = "lesson.yaml"
TOPIC_QUESTIONS_FILE = "questions.yaml"
# the panels a lesson page can add under the player (app/lesson_page.py)
PANELS = (
    "memory",
    "budget",
    "held",
    "myths",
    "cpu_tier",
    "designs",
    "pd",
    "hybrid",
    "fleet",
    "admission",
)
# engine settings a switch may set besides EngineSettings' fields (old names load_scenario reads)
LEGACY_SETTINGS = ("sliding_retention",)
# Switches that are no engine setting: the name a switch stores (in the URL, in overrides) ->
# the field of its options that says what choosing the option changes in the scenario.
OPTION_EFFECTS = {
    "layers": "layer_pattern",
    "spec_method": "spec_method",
    "failed_load": "fail_load",
    "router": "router",
}


LessonDataError = DataFileError  # a lesson or case file that cannot be loaded


# -- what the app plays: frozen, texts as catalogue keys ----------------------------------
@dataclass(frozen=True)
class Moment:
    kind: str  # event kind
    text: str  # catalogue key
    request: str | None = None  # only events of this request
    where: str | None = None  # name of a predicate in PREDICATES
    key: bool = True  # the lesson claims to show this (tests assert it happens)
    sources: tuple[Source, ...] = ()  # where the engine decides what the text says


@dataclass(frozen=True)
class Question:
    prompt: str  # catalogue keys
    options: tuple[str, ...]
    answer: int
    explain: str


@dataclass(frozen=True)
class FailLoad:
    """The first load of ``request`` fails (from the CPU tier, or a P/D decode replica's pull),
    handled by ``policy`` (vLLM's ``kv_load_failure_policy``)."""

    request: str
    policy: str


@dataclass(frozen=True)
class Option:
    """One choice of a switch: the value it stores and, for a switch that is no engine setting
    (OPTION_EFFECTS), what choosing it changes in the scenario."""

    value: Any
    label: str | None = None  # catalogue key; None: the value is its own label
    layer_pattern: tuple[str, ...] | None = None  # repeated over the model's layers
    spec_method: str | None = None  # the drafter of engine.speculative
    fail_load: FailLoad | None = None
    router: str | None = None  # the policy of engine.fleet's router

    def apply(self, eng: dict, num_layers: int | None) -> None:
        """Change the engine dict ``eng`` as this option says (a no-op where the scenario has
        nothing to change: no CPU tier or P/D pair, no speculative decoding, no sliding window)."""
        if self.fail_load is not None:
            failing = {
                "fail_loads": [self.fail_load.request],
                "kv_load_failure_policy": self.fail_load.policy,
            }
            if isinstance(eng.get("cpu_offload"), dict):
                eng["cpu_offload"] = {**eng["cpu_offload"], **failing}
            elif eng.get("kv_transfer") == "pd":
                eng["kv_transfer_config"] = {**(eng.get("kv_transfer_config") or {}), **failing}
        if self.router and isinstance(eng.get("fleet"), dict):
            eng["fleet"] = {**eng["fleet"], "router": self.router}
        if self.spec_method and isinstance(eng.get("speculative"), dict):
            eng["speculative"] = {**eng["speculative"], "method": self.spec_method}
        if self.layer_pattern and num_layers and eng.get("sliding_window"):
            pattern = self.layer_pattern
            eng["layer_types"] = [pattern[i % len(pattern)] for i in range(num_layers)]


@dataclass(frozen=True)
class Toggle:
    """A setting the lesson page offers as a switch: an engine setting, or one of
    OPTION_EFFECTS whose options say what they change."""

    setting: str
    label: str  # catalogue key
    choices: tuple[Option, ...]

    @property
    def options(self) -> tuple[Any, ...]:
        return tuple(o.value for o in self.choices)

    @property
    def option_labels(self) -> tuple[str, ...]:
        """The options' label keys, one per option; empty when the values are their own labels
        (the loader allows all or none)."""
        return tuple(o.label for o in self.choices if o.label is not None)

    def choice(self, value: Any) -> Optional[Option]:
        return next(
            (o for o in self.choices if o.value == value and type(o.value) is type(value)), None
        )


@dataclass(frozen=True)
class ClassQuestion:
    """A question prepared for a class (ui/class_panel.py): while the teacher shows step ``step``,
    the teacher's panel offers question ``ask`` (an id of lesson/quiz.py) about step ``step + 1``
    first. Its options and answer are computed from the recorded run, like the quiz's."""

    step: int
    ask: str


@dataclass(frozen=True)
class Lesson:
    """A lesson as the app plays it. Invariant: every text is a catalogue key that exists.
    ``number`` and ``icon`` are its page's (the registry's; 0 and "" until content/__init__.py
    places it)."""

    id: str
    number: int
    icon: str
    title: str
    summary: str | None
    scenario: dict
    intro: str
    moments: tuple[Moment, ...] = ()
    outro: str | None = None
    questions: tuple[Question, ...] = ()
    toggles: tuple[Toggle, ...] = ()
    focus: tuple[str, ...] = ("cache_hit",)  # event kinds offered first in "run until"
    panels: tuple[str, ...] = ()  # extra panels (PANELS)
    class_questions: tuple[ClassQuestion, ...] = ()
    # the model the lesson always plays on (its scenario's), whatever the sidebar loaded; None:
    # the sidebar's (a hybrid lesson needs a hybrid model)
    model: str | None = None

    def texts(self) -> tuple[str, ...]:
        """Every catalogue key the lesson shows."""
        keys = [self.title, self.summary, self.intro, self.outro, *(m.text for m in self.moments)]
        for q in self.questions:
            keys += [q.prompt, *q.options, q.explain]
        for t in self.toggles:
            keys += [t.label, *t.option_labels]
        return tuple(k for k in keys if k)

    def scenario_dict(self, num_layers: int | None = None, overrides: dict | None = None) -> dict:
        """The scenario in the engine's format, with settings overridden.

        ``overrides`` maps switch names to values: an engine setting is set as given; a switch
        of OPTION_EFFECTS applies the effect of this lesson's option with that value (``layers``
        repeats the option's layer pattern over ``num_layers``), and changes nothing where the
        lesson offers no such switch or option."""
        d = copy.deepcopy(self.scenario)
        eng = d.setdefault("engine", {})
        values = dict(overrides or {})
        chosen = [
            t.choice(values[t.setting])
            for t in self.toggles
            if t.setting in OPTION_EFFECTS and t.setting in values
        ]
        for name in OPTION_EFFECTS:
            values.pop(name, None)
        eng.update(values)
        for option in chosen:
            if option is not None:
                option.apply(eng, num_layers)
        return d


# -- the file format: pydantic, extra fields refused ---------------------------------------
class DataFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _one_of(values: Sequence[str], what: str) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v not in values:
            raise ValueError(f"unknown {what} {v!r}; one of: {', '.join(values)}")
        return str(v)

    return check


Kind = Annotated[StrictStr, BeforeValidator(_one_of([k.value for k in EVENT_KINDS], "event kind"))]
Scalar = Union[StrictBool, StrictInt, StrictFloat, StrictStr, None]


class MomentData(DataFile):
    kind: Kind
    request: Optional[StrictStr] = None
    where: Optional[StrictStr] = None
    key: StrictBool = True
    sources: list[Source] = Field(default_factory=list)

    @model_validator(mode="after")
    def _known_predicate(self) -> "MomentData":
        if self.where is not None and self.where not in PREDICATES:
            raise ValueError(
                f"where: unknown predicate {self.where!r}; one of: {', '.join(PREDICATES)}"
            )
        return self


class QuestionData(DataFile):
    options: Annotated[StrictInt, Field(ge=2)]  # how many options (texts: question.<n>.option.<m>)
    answer: Annotated[StrictInt, Field(ge=0)]  # the right option's index, from 0

    @model_validator(mode="after")
    def _answer_is_an_option(self) -> "QuestionData":
        if self.answer >= self.options:
            raise ValueError(f"answer: {self.answer} is not one of the {self.options} options")
        return self


def _quiz_id(v: Any) -> Any:
    return _one_of(list(class_questions()), "question")(v)


class ClassQuestionData(DataFile):
    step: Annotated[StrictInt, Field(ge=0)]  # asked while the player shows this step
    ask: Annotated[StrictStr, BeforeValidator(_quiz_id)]  # a question of lesson/quiz.py


class FailLoadData(DataFile):
    request: StrictStr
    policy: Literal["recompute", "fail"]


class OptionData(DataFile):
    value: Scalar
    layer_pattern: Optional[Annotated[list[Literal[LAYER_TYPES]], Field(min_length=1)]] = None
    spec_method: Optional[Literal["ngram", "draft_model"]] = None
    fail_load: Optional[FailLoadData] = None
    router: Optional[StrictStr] = None


def _option(v: Any) -> Any:
    return v if isinstance(v, dict) else {"value": v}


class ToggleData(DataFile):
    setting: StrictStr
    options: Annotated[list[Annotated[OptionData, BeforeValidator(_option)]], Field(min_length=2)]

    @model_validator(mode="after")
    def _setting_and_effects(self) -> "ToggleData":
        known = tuple(EngineSettings.__dataclass_fields__) + LEGACY_SETTINGS
        if self.setting not in known and self.setting not in OPTION_EFFECTS:
            raise ValueError(
                f"setting: {self.setting!r} is neither an engine setting nor one of "
                + ", ".join(OPTION_EFFECTS)
            )
        effect = OPTION_EFFECTS.get(self.setting)
        for i, o in enumerate(self.options):
            for name in OPTION_EFFECTS.values():
                if name != effect and getattr(o, name) is not None:
                    raise ValueError(f"options[{i}].{name}: not an effect of {self.setting!r}")
        values = [o.value for o in self.options]
        if len({json.dumps(v) for v in values}) != len(values):
            raise ValueError(f"options: values repeat ({values})")
        return self


class ScenarioChanges(DataFile):
    """Named changes to a scenario: settings merged into ``engine``; ``only_requests`` keeps
    those requests (in the file's order); ``request_fields`` sets fields on every request;
    ``requests`` replaces the whole list."""

    name: Optional[StrictStr] = None
    description: Optional[StrictStr] = None
    engine: dict[str, Any] = Field(default_factory=dict)
    only_requests: Optional[list[StrictStr]] = None
    request_fields: dict[str, Any] = Field(default_factory=dict)
    requests: Optional[list[dict[str, Any]]] = None

    def apply(self, scenario: dict) -> dict:
        d = copy.deepcopy(scenario)
        for k in ("name", "description"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        d.setdefault("engine", {}).update(copy.deepcopy(self.engine))
        if self.requests is not None:
            d["requests"] = copy.deepcopy(self.requests)
        if self.only_requests is not None:
            missing = set(self.only_requests) - {r.get("id") for r in d.get("requests", [])}
            if missing:
                raise ValueError(f"only_requests: no request {sorted(missing)} in the scenario")
            d["requests"] = [r for r in d["requests"] if r.get("id") in self.only_requests]
        for r in d.get("requests", []):
            r.update(copy.deepcopy(self.request_fields))
        return d


def file_ref(v: Any) -> Any:
    return {"file": v} if isinstance(v, str) else v


class ScenarioRef(ScenarioChanges):
    """A scenario file, with changes. ``file`` is relative to the folder of the file that names
    it (``scenario.json``: the lesson's own), and stays inside the content folder that holds it
    (``../../lessons/prefix/scenario.json``: another lesson's; ``../../examples/x.json``: a
    shared example)."""

    file: StrictStr

    def load(self, folder: Path) -> dict:
        """The scenario, for a data file in ``folder`` (``<content>/<kind>/<id>/``)."""
        root = folder.resolve().parent.parent
        path = (folder / self.file).resolve()
        if root not in path.parents or not path.is_file():
            raise ValueError(f"file: no scenario file {self.file!r} in {root}")
        try:
            scenario = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"file: {self.file!r} is not a JSON file ({e})") from None
        return self.apply(scenario)


Focus = Annotated[list[Kind], Field(min_length=1)]
Panel = Literal[PANELS]


class LessonData(DataFile):
    id: Annotated[StrictStr, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    scenario: Annotated[ScenarioRef, BeforeValidator(file_ref)]
    moments: list[MomentData] = Field(default_factory=list)
    questions: list[QuestionData] = Field(default_factory=list)
    toggles: list[ToggleData] = Field(default_factory=list)
    focus: Focus = ["cache_hit"]
    panels: list[Panel] = Field(default_factory=list)
    class_questions: list[ClassQuestionData] = Field(default_factory=list)
    own_model: StrictBool = False  # plays on its scenario's model, not the sidebar's


# -- loading -------------------------------------------------------------------------------
def read_data(path: Path, model: type[BaseModel]) -> Any:
    """``path`` (YAML) parsed into ``model``; its ``id`` must be its folder's name."""
    data = load(path, model)
    if data.id != path.parent.name:
        raise LessonDataError(
            path, [f"id: {data.id!r} must equal its folder's name {path.parent.name!r}"]
        )
    return data


class Texts:
    """The catalogue keys a file's data implies, checked as they are made: a missing required
    key and (at ``check``) a key under the file's prefix that nothing uses are problems."""

    def __init__(self, prefix: str, catalogue: Mapping[str, Any]) -> None:
        self.prefix, self.catalogue = prefix, catalogue
        self.used: set[str] = set()
        self.problems: list[str] = []

    def key(self, name: str, field: str, required: bool = True) -> Optional[str]:
        key = f"{self.prefix}.{name}"
        if key in self.catalogue:
            self.used.add(key)
            return key
        if required:
            self.problems.append(f"{field}: catalogue key {key!r} is missing")
        return None

    def check(self, path: Path) -> None:
        unused = sorted(
            k for k in self.catalogue if k.startswith(self.prefix + ".") and k not in self.used
        )
        self.problems += [f"catalogue key {k!r} belongs to no field of this file" for k in unused]
        if self.problems:
            raise LessonDataError(path, self.problems)


def build_moments(
    data: Sequence[MomentData], texts: Texts, name: str = "moment", field: str = "moments"
) -> tuple[Moment, ...]:
    return tuple(
        Moment(
            m.kind,
            texts.key(f"{name}.{i + 1}", f"{field}[{i}]") or "",
            request=m.request,
            where=m.where,
            key=m.key,
            sources=tuple(m.sources),
        )
        for i, m in enumerate(data)
    )


def _toggle(t: ToggleData, i: int, texts: Texts) -> Toggle:
    """The switch, its label key and, when the first option has one, every option's label key."""
    name = f"toggle.{t.setting}"
    labelled = f"{texts.prefix}.{name}.1" in texts.catalogue
    return Toggle(
        t.setting,
        texts.key(name, f"toggles[{i}]") or "",
        tuple(
            Option(
                o.value,
                texts.key(f"{name}.{j + 1}", f"toggles[{i}].options[{j}]", required=labelled),
                tuple(o.layer_pattern) if o.layer_pattern else None,
                o.spec_method,
                FailLoad(o.fail_load.request, o.fail_load.policy) if o.fail_load else None,
                o.router,
            )
            for j, o in enumerate(t.options)
        ),
    )


def _question(q: QuestionData, i: int, texts: Texts) -> Question:
    name, field = f"question.{i + 1}", f"questions[{i}]"
    return Question(
        texts.key(f"{name}.prompt", field) or "",
        tuple(
            texts.key(f"{name}.option.{j + 1}", f"{field}.options[{j}]") or ""
            for j in range(q.options)
        ),
        q.answer,
        texts.key(f"{name}.explain", field) or "",
    )


def scenario_problems(d: dict, field: str) -> list[str]:
    """What the engine's own loader refuses in the scenario ``d``, each under ``field``."""
    try:
        load_scenario(d)
    except ScenarioError as e:
        return [f"{field}: {p}" for p in e.problems]
    return []


def load_scenario_ref(ref: ScenarioRef, path: Path, field: str = "scenario") -> dict:
    """The scenario ``ref`` of the data file ``path`` names, checked by the engine's loader."""
    try:
        d = ref.load(path.parent)
    except (OSError, ValueError) as e:
        raise LessonDataError(path, [f"{field}.{e}"]) from None
    problems = scenario_problems(d, field)
    if problems:
        raise LessonDataError(path, problems)
    return d


def load_lesson(path: Path, catalogue: Mapping[str, Any]) -> Lesson:
    """One lesson file, its texts checked against ``catalogue`` (key -> {lang: text})."""
    data: LessonData = read_data(path, LessonData)
    scenario = load_scenario_ref(data.scenario, path)
    texts = Texts(f"lesson.{data.id}", catalogue)
    lesson = Lesson(
        id=data.id,
        number=0,
        icon="",
        title=texts.key("title", "title") or "",
        summary=texts.key("summary", "summary", required=False),
        scenario=scenario,
        intro=texts.key("intro", "intro") or "",
        moments=build_moments(data.moments, texts),
        outro=texts.key("outro", "outro", required=False),
        questions=tuple(_question(q, i, texts) for i, q in enumerate(data.questions)),
        toggles=tuple(_toggle(t, i, texts) for i, t in enumerate(data.toggles)),
        focus=tuple(data.focus),
        panels=tuple(data.panels),
        class_questions=tuple(ClassQuestion(q.step, q.ask) for q in data.class_questions),
        model=scenario.get("model") if data.own_model else None,
    )
    if data.own_model and not lesson.model:
        raise LessonDataError(path, ["own_model: the scenario names no model"])
    texts.check(path)
    problems = [
        p
        for i, t in enumerate(lesson.toggles)
        for j, value in enumerate(t.options)
        for p in scenario_problems(
            lesson.scenario_dict(None, {t.setting: value}), f"toggles[{i}].options[{j}]"
        )
    ]
    if problems:
        raise LessonDataError(path, problems)
    return lesson


def lessons_dir(root: Path | None = None) -> Path:
    """The lessons' folder of the content folder ``root`` (``content_dir()`` when None)."""
    return (content_dir() if root is None else root) / "lessons"


def load_lessons(
    folder: Path | None = None, catalogue: Mapping[str, Any] | None = None
) -> dict[str, Lesson]:
    """Every lesson folder in ``folder`` (``<content>/lessons``; the content folder's when None)
    by id, in the folders' order, their texts checked against ``catalogue`` (the whole catalogue
    when none is given)."""
    folder = lessons_dir() if folder is None else folder
    if catalogue is None:
        from paged_kv_lab.text.i18n import catalogue as read_catalogue

        catalogue = read_catalogue()
    return {
        p.parent.name: load_lesson(p, catalogue) for p in sorted(folder.glob(f"*/{LESSON_FILE}"))
    }


def load_topic_questions(
    folder: Path | None = None, catalogue: Mapping[str, Any] | None = None
) -> dict[str, tuple[Question, ...]]:
    """Topic page id -> its questions: each topic folder's ``questions.yaml``
    (``<content>/topics/<id>/``; the content folder's when ``folder`` is None), their texts
    checked against ``catalogue`` as a lesson's are (the whole catalogue when none is given)."""
    folder = (content_dir() / "topics") if folder is None else folder
    if catalogue is None:
        from paged_kv_lab.text.i18n import catalogue as read_catalogue

        catalogue = read_catalogue()
    out = {}
    for path in sorted(folder.glob(f"*/{TOPIC_QUESTIONS_FILE}")):
        page_id = path.parent.name
        questions = load(path, list[QuestionData])
        texts = Texts(f"topic.{page_id}.quiz", catalogue)
        out[page_id] = tuple(_question(q, i, texts) for i, q in enumerate(questions))
        texts.check(path)
    return out


# -- predicates on events: (event, record) -> bool -----------------------------------
# Each reads the fields of the one kind its moments name (record.events).
def _rescue(e: Touched, rec: StepRecord) -> bool:
    """A touch that pulled a free cached block out of the middle of the queue."""
    return any(p > 0 for p in e.queue_positions) and bool(e.from_queue)


def _shared(e: Touched, rec: StepRecord) -> bool:
    """A touch of blocks another running request still holds (ref_cnt becomes > 1)."""
    return len(e.from_queue) < len(e.block_ids)


def _evicts(e: Allocated, rec: StepRecord) -> bool:
    return bool(e.evicted_hashes)


def _to_head(e: Freed, rec: StepRecord) -> bool:
    return bool(e.to_head)


def _to_tail(e: Freed, rec: StepRecord) -> bool:
    return bool(e.to_tail)


def _self_hit(e: CacheHit, rec: StepRecord) -> bool:
    return e.preempted_before


def _chunk_with_decodes(e: Scheduled, rec: StepRecord) -> bool:
    phases = {x.phase for x in rec.events if isinstance(x, Scheduled)}
    return e.phase == "chunk" and "decode" in phases


def _reused_unhashed(e: Allocated, rec: StepRecord) -> bool:
    """Allocated blocks that were freed without a hash earlier (they sat at the head)."""
    return not e.evicted_hashes


def _still_used(e: Freed, rec: StepRecord) -> bool:
    return bool(e.still_used)


def _decode_alloc(e: Allocated, rec: StepRecord) -> bool:
    return any(
        isinstance(x, Scheduled) and x.request_id == e.request_id and x.phase == "decode"
        for x in rec.events
    )


def _with_drafts(e: Scheduled, rec: StepRecord) -> bool:
    """A decode that carries draft tokens after its last token (speculative decoding)."""
    return e.phase == "decode" and e.num_tokens > 1


def _lookahead_only(e: Allocated, rec: StepRecord) -> bool:
    """Blocks allocated where no token scheduled this step lands: only for lookahead slots (the
    draft model writes K/V there)."""
    sched = [x for x in rec.events if isinstance(x, Scheduled) and x.request_id == e.request_id]
    req = next((r for r in rec.snapshot.requests if r.request_id == e.request_id), None)
    if not sched or req is None or not req.block_tables:
        return False
    end = sched[0].start + sched[0].num_tokens
    table = req.block_tables[e.group or 0]
    bs = rec.snapshot.block_size
    return any(b in table and table.index(b) * bs >= end for b in e.block_ids)


def _after_verify(e: Event, rec: StepRecord) -> bool:
    """Blocks cached after the same request's drafts were accepted in this step."""
    accepted = [
        i
        for i, x in enumerate(rec.events)
        if x.kind == "draft_accepted" and x.request_id == e.request_id
    ]
    return bool(accepted) and rec.events.index(e) > accepted[0]


def _dup_hash(e: Cached, rec: StepRecord) -> bool:
    """Blocks cached under a hash that another block already held (BlockHashToBlockMap keeps
    both)."""
    hmap = rec.snapshot.hash_map
    return any(
        bid in ids and ids[0] != bid
        for bid, h in zip(e.block_ids, e.block_hashes)
        for ids in (hmap.get(f"{h}@{e.group or 0}", ()),)
    )


def _dup_decode(e: Cached, rec: StepRecord) -> bool:
    return _dup_hash(e, rec) and _decode_alloc(e, rec)


def gpu_copies(e: Event, rec: StepRecord) -> tuple[int, ...]:
    """The GPU blocks that still cache the hash a CPU eviction (``cpu_evicted``) dropped, at the
    end of the step: the CPU pool's ``get_new_blocks`` evicts only its own copy, and vLLM's
    ``SimpleCPUOffloadScheduler._process_store_completion`` frees the GPU original to its queue
    with its hash, so the GPU pool may hold it until its own eviction takes it."""
    return rec.snapshot.hash_map.get(f"{getattr(e, 'block_hash', '')}@{e.group or 0}", ())


def _request_view(e: Event, rec: StepRecord):
    return next((r for r in rec.snapshot.requests if r.request_id == e.request_id), None)


def _remote_kvs(e: Event, rec: StepRecord) -> bool:
    """The event's request waits for remote K/V at the end of the step and the step's connector
    pulled it (a P/D decode replica copied the prefill blocks into the blocks it allocated:
    StepRecord.pulls)."""
    r = _request_view(e, rec)
    return r is not None and r.status == "waiting_for_remote_kvs" and e.request_id in rec.pulls


def _kept_for_transfer(e: Event, rec: StepRecord) -> bool:
    """A request finished but still holds its blocks at the end of the step: its connector's
    ``request_finished`` delayed the free (a P/D prefill replica, until the pull is read)."""
    r = _request_view(e, rec)
    return r is not None and any(r.block_tables)


def _held_until_read(e: Freed, rec: StepRecord) -> bool:
    """Blocks of a request that had finished in an earlier step freed in a step that did not
    schedule it: the delayed free once the transfer was read (or its lease ran out)."""
    r = _request_view(e, rec)
    finished_now = any(x.kind == "finished" and x.request_id == e.request_id for x in rec.events)
    return (
        r is not None
        and r.status.startswith("finished")
        and e.request_id not in rec.scheduled
        and not finished_now
    )


def _after_load(e: Cached, rec: StepRecord) -> bool:
    """Blocks cached in the step where the request's asynchronous load landed, and did not fail
    (delayed caching: ``allocate_slots(..., delay_cache_blocks=True)`` left them uncached until
    then)."""
    return any(
        x.kind == "cpu_loaded" and x.request_id == e.request_id and not x.load_failed
        for x in rec.events
    )


def _reason(value: str) -> Callable[[Event, StepRecord], bool]:
    return lambda e, rec: getattr(e, "reason", None) == value


PREDICATES: dict[str, Callable[[Event, StepRecord], bool]] = {
    "rescue": _rescue,
    "shared": _shared,
    "evicts": _evicts,
    "to_head": _to_head,
    "to_tail": _to_tail,
    "self_hit": _self_hit,
    "chunk_with_decodes": _chunk_with_decodes,
    "reused_unhashed": _reused_unhashed,
    "still_used": _still_used,
    "decode_alloc": _decode_alloc,
    "with_drafts": _with_drafts,
    "lookahead_only": _lookahead_only,
    "after_verify": _after_verify,
    "dup_hash": _dup_hash,
    "dup_decode": _dup_decode,
    "preempted_reason": _reason("preempted"),
    "window_reason": _reason("window"),
    "after_preempt": _reason("preempted_this_step"),
    "budget_reason": _reason("token_budget"),
    "error_reason": _reason("error"),
    "load_ok": lambda e, rec: not getattr(e, "load_failed", False),
    "load_failed": lambda e, rec: bool(getattr(e, "load_failed", False)),
    "gpu_copy_cached": lambda e, rec: bool(gpu_copies(e, rec)),
    "gpu_copy_gone": lambda e, rec: not gpu_copies(e, rec),
    "remote_kvs": _remote_kvs,
    "kept_for_transfer": _kept_for_transfer,
    # finished without error and freed at once: nothing kept for a reader
    "freed_at_finish": lambda e, rec: not _kept_for_transfer(e, rec) and e.reason != "error",
    "held_until_read": _held_until_read,
    "after_load": _after_load,
    "partial_hit": _reason("partial_hit"),
    "keep_cached": _reason("keep_cached"),
    # which replica of a P/D pair made the decision (StepRecord.replica)
    "on_prefill": lambda e, rec: rec.replica == "prefill",
    "on_decode": lambda e, rec: rec.replica == "decode",
}


def moment_matches(m: Moment, e: Event, rec: StepRecord) -> bool:
    if e.kind != m.kind or (m.request is not None and e.request_id != m.request):
        return False
    return m.where is None or PREDICATES[m.where](e, rec)


def moment_steps(lesson: Lesson, records: Sequence[StepRecord]) -> dict[int, int]:
    """moment index -> the first step where it happens (moments that never happen are absent)."""
    found: dict[int, int] = {}
    for rec in records:
        for i, m in enumerate(lesson.moments):
            if i not in found and any(moment_matches(m, e, rec) for e in rec.events):
                found[i] = rec.step
    return found


def narration_for_step(lesson: Lesson, records: Sequence[StepRecord], step: int) -> list[Moment]:
    """The moments whose first occurrence is at ``step`` (records up to that step suffice)."""
    found = moment_steps(lesson, [r for r in records if r.step <= step])
    return [lesson.moments[i] for i, s in sorted(found.items()) if s == step]


def _ids(ids) -> str:
    return "[" + ", ".join(map(str, ids)) + "]"


def narration_fields(e: Event, rec: Optional[StepRecord] = None) -> dict[str, Any]:
    """The event's fields for a moment's text: ``{req}``, ``{blocks}`` and each field by name
    (``{num_tokens}``, ``{slots}``, ``{policy}``...); lists as "[1, 2]", dicts left out. With the
    step's record: ``{table}``, the request's block ids at the end of the step; a CPU eviction's
    ``{gpu_blocks}``, the GPU blocks still caching its hash at the end of the step
    (``gpu_copies``); a P/D pull's ``{pulled_from}`` and ``{pulled_into}``, the prefill and the
    decode block ids the step's connector copied for the request (StepRecord.pulls)."""
    out = {
        k: (_ids(v) if isinstance(v, list) else v)
        for k, v in e.to_dict().items()
        if not isinstance(v, dict)
    }
    out.update(req=e.request_id or "", blocks=_ids(e.block_ids))
    if rec is None:
        return out
    view = _request_view(e, rec)
    if view is not None:
        out["table"] = _ids(b for t in view.block_tables for b in t)
    if e.kind == "cpu_evicted":
        out["gpu_blocks"] = _ids(gpu_copies(e, rec))
    if e.request_id in rec.pulls:
        remote, local = rec.pulls[e.request_id]
        out.update(pulled_from=_ids(remote), pulled_into=_ids(local))
    return out
