"""'Predict the next step': a question about a step before it is revealed.

The questions are data (``quiz.yaml``: which event kinds raise each, the order they are tried)
and their sentences are catalogue entries (``quiz.<id>.prompt`` / ``.explain…``). What stays here
is each question's computation, keyed by its id in ``ASK``: a pure function of (the snapshot now,
the record of the next step) whose answer is what the engine really did and whose explanation
names the rule that decided it (a ``Text`` per outcome).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from paged_kv_lab.content.datafile import fail, load
from paged_kv_lab.recording.events import EventKind
from paged_kv_lab.recording.snapshot import Snapshot, StepRecord
from paged_kv_lab.text.i18n import Text, catalogue, tr
from paged_kv_lab.why.sentences import short_hash

QUIZ_FILE = Path(__file__).with_name("quiz.yaml")


@dataclass(frozen=True)
class Prediction:
    """A question in one language: ``options[answer]`` is what the engine did."""

    kind: str  # the question's id: victim | hit | evict | alloc | free
    prompt: str
    options: tuple[str, ...]
    answer: int
    explain: str


@dataclass(frozen=True)
class Question:
    """A question in no language yet (an option is a plain value or a ``Text``)."""

    kind: str
    prompt: Text
    options: tuple[Union[str, Text], ...]
    answer: int
    explain: Text

    def render(self, lang: str) -> Prediction:
        opts = tuple(tr(o, lang) if isinstance(o, Text) else str(o) for o in self.options)
        return Prediction(
            self.kind, tr(self.prompt, lang), opts, self.answer, tr(self.explain, lang)
        )


# -- the quiz as data -----------------------------------------------------------------------


class QuestionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    asked_on: tuple[str, ...]


class Quiz(BaseModel):
    """``order``: the event kinds tried in turn; ``fallback``: the question asked when none of
    them gives one and the number of free blocks changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    order: tuple[str, ...] = Field(min_length=1)
    fallback: str
    questions: tuple[QuestionSpec, ...] = Field(min_length=1)

    @property
    def by_event(self) -> dict[str, str]:
        """Event kind -> the id of the question it raises."""
        return {kind: q.id for q in self.questions for kind in q.asked_on}


Ask = Callable[[Snapshot, StepRecord], Optional[Question]]
ASK: dict[str, Ask] = {}


def question(qid: str) -> Callable[[Ask], Ask]:
    """Register the computation of question ``qid``: ``(snapshot now, record of the next step)
    -> the question, or None where this step cannot ask it``."""

    def register(fn: Ask) -> Ask:
        ASK[qid] = fn
        return fn

    return register


def load_quiz(path: Path = QUIZ_FILE) -> Quiz:
    """The quiz of ``path``. Raises ValueError naming the file and field for a malformed file, an
    unknown event kind, an event kind raising two questions, and a question without its prompt
    in the catalogue or without its computation (or a computation without its question)."""
    quiz = load(path, Quiz)
    kinds = {k.value for k in EventKind}
    keys = catalogue()
    ids = [q.id for q in quiz.questions]
    seen: dict[str, str] = {}
    for i, q in enumerate(quiz.questions):
        if q.id in ids[:i]:
            raise fail(path, f"questions[{i}].id", f"{q.id!r} is repeated")
        if q.id not in ASK:
            raise fail(path, f"questions[{i}].id", f"no computation for {q.id!r} (lesson/quiz.py)")
        if f"quiz.{q.id}.prompt" not in keys:
            raise fail(path, f"questions[{i}].id", f"the catalogue has no 'quiz.{q.id}.prompt'")
        for j, kind in enumerate(q.asked_on):
            if kind not in kinds:
                raise fail(path, f"questions[{i}].asked_on[{j}]", f"{kind!r} is no event kind")
            if kind in seen:
                raise fail(
                    path, f"questions[{i}].asked_on[{j}]", f"{kind!r} already raises {seen[kind]!r}"
                )
            seen[kind] = q.id
    for j, kind in enumerate(quiz.order):
        if kind not in seen:
            raise fail(path, f"order[{j}]", f"{kind!r} raises no question")
    if quiz.fallback not in ids:
        raise fail(path, "fallback", f"{quiz.fallback!r} is no question")
    if set(ASK) - set(ids):
        raise fail(
            path, "questions", f"computations without a question: {sorted(set(ASK) - set(ids))}"
        )
    return quiz


@lru_cache(maxsize=1)
def quiz() -> Quiz:
    return load_quiz()


# -- the questions --------------------------------------------------------------------------
def _first(rec: StepRecord, kind: str, pred=lambda e: True):
    return next((e for e in rec.events if e.kind == kind and pred(e)), None)


def _block(b: int) -> Text:
    return Text("quiz.option.block", {"block": b})


@question("victim")
def _victim(snap: Snapshot, rec: StepRecord) -> Question | None:
    e = _first(rec, "preempted")
    if e is None or e.request_id not in snap.running:
        return None
    opts = tuple(snap.running)
    policy = "fcfs" if e.policy == "fcfs" else "priority"
    why = Text(f"quiz.victim.why.{policy}")
    explain = Text("quiz.victim.explain", {"why": why, "request": e.request_id})
    return Question("victim", Text("quiz.victim.prompt"), opts, opts.index(e.request_id), explain)


@question("hit")
def _hit(snap: Snapshot, rec: StepRecord) -> Question | None:
    e = _first(rec, "cache_hit") or _first(rec, "cache_miss")
    if e is None or e.request_id is None:
        return None
    hit = e.kind == "cache_hit"
    explain = (
        Text("quiz.hit.explain.hit", {"blocks": e.num_blocks, "tokens": e.num_tokens})
        if hit
        else miss_why(snap)
    )
    return Question(
        "hit",
        Text("quiz.hit.prompt", {"req": e.request_id}),
        (Text("quiz.hit.yes"), Text("quiz.hit.no")),
        0 if hit else 1,
        explain,
    )


def miss_why(snap: Snapshot) -> Text:
    """Why a lookup found nothing, by how its KV cache groups are searched: a full-attention group
    from the left (the chained hashes end the hit at the first missing block), a sliding-window
    group from the right (it needs a run of cached blocks as long as its window); a model with
    both needs one hit length that holds in every group."""
    kinds = {g.get("kind") for g in snap.groups} or {"full"}
    case = "full" if kinds == {"full"} else ("every_group" if "full" in kinds else "sliding")
    why = Text(f"quiz.hit.miss.{case}", {"causes": Text("quiz.hit.miss.causes")})
    return Text("quiz.hit.explain.miss", {"why": why})


@question("evict")
def _evict(snap: Snapshot, rec: StepRecord) -> Question | None:
    e = _first(rec, "evicted", lambda e: e.reason == "reused from queue head")
    if e is None or not e.block_ids:
        return None
    blocks = {b.block_id: b for b in snap.blocks}
    cached = [bid for bid in snap.free_queue if blocks.get(bid) and blocks[bid].block_hash]
    ans = e.block_ids[0]
    if ans not in cached:
        return None
    opts = cached[:4] if ans in cached[:4] else cached[:3] + [ans]
    if len(opts) < 2:
        return None
    explain = Text("quiz.evict.explain", {"block": ans, "hash": short_hash(e.block_hash)})
    return Question(
        "evict",
        Text("quiz.evict.prompt"),
        tuple(_block(b) for b in opts),
        opts.index(ans),
        explain,
    )


@question("alloc")
def _alloc(snap: Snapshot, rec: StepRecord) -> Question | None:
    e = _first(rec, "allocated")
    if e is None or not e.block_ids or len(snap.free_queue) < 2:
        return None
    ans = e.block_ids[0]
    q = list(snap.free_queue)
    cands = q[:3] + [q[-1]]
    if ans not in cands:
        cands = q[:2] + [ans] + [q[-1]]
    opts = list(dict.fromkeys(cands))
    if ans not in opts or len(opts) < 2:
        return None
    touched_first = any(
        x.kind == "touched" and x.from_queue
        for x in rec.events
        if rec.events.index(x) < rec.events.index(e)
    )
    explain = Text(
        "quiz.alloc.explain",
        {"block": ans, "touched": Text("quiz.alloc.touched_first") if touched_first else ""},
    )
    return Question(
        "alloc",
        Text("quiz.alloc.prompt"),
        tuple(_block(b) for b in opts),
        opts.index(ans),
        explain,
    )


@question("free")
def _free(snap: Snapshot, rec: StepRecord) -> Question | None:
    after = rec.snapshot.num_free_blocks
    now = snap.num_free_blocks
    if after == now and not any(e.kind == "freed" for e in rec.events):
        return None
    opts = sorted(
        {after, now, max(0, after - 1), after + 1} | ({after + 2} if after + 2 != now else set())
    )[:4]
    if after not in opts:
        opts = opts[:3] + [after]
    fields = {
        "now": now,
        "allocated": sum(len(e.block_ids) for e in rec.events if e.kind == "allocated"),
        "taken": sum(len(e.from_queue) for e in rec.events if e.kind == "touched"),
        "back": sum(len(e.to_head) + len(e.to_tail) for e in rec.events if e.kind == "freed"),
        "after": after,
    }
    return Question(
        "free",
        Text("quiz.free.prompt"),
        tuple(str(o) for o in opts),
        opts.index(after),
        Text("quiz.free.explain", fields),
    )


# Questions only a teacher asks a class (ui/class_panel.py), never the quiz mode's hold: by id.
CLASS_ASK: dict[str, Ask] = {}


def _hit_blocks(snap: Snapshot, rec: StepRecord) -> Question | None:
    """How many blocks the first request looked up in the next step finds in the prefix cache."""
    e = _first(rec, "cache_hit") or _first(rec, "cache_miss")
    if e is None or e.request_id is None:
        return None
    n = e.num_blocks if e.kind == "cache_hit" else 0
    opts = sorted({0, n, n + 1, max(0, n - 1), n + 2})[:4]
    if n not in opts:
        opts = opts[:3] + [n]
    explain = (
        Text("quiz.hit.explain.hit", {"blocks": n, "tokens": e.num_tokens})
        if e.kind == "cache_hit"
        else miss_why(snap)
    )
    prompt = Text("quiz.hit_blocks.prompt", {"req": e.request_id})
    return Question("hit_blocks", prompt, tuple(str(o) for o in opts), opts.index(n), explain)


CLASS_ASK["hit_blocks"] = _hit_blocks


def class_questions() -> dict[str, Ask]:
    """Every question a teacher can ask a class, by id: the quiz's and ``CLASS_ASK``."""
    return {**ASK, **CLASS_ASK}


def next_question(snap: Snapshot, rec: StepRecord, prefer: tuple[str, ...] = ()) -> Question | None:
    """The most instructive question about ``rec``, in no language yet: the first of the event
    kinds ``prefer`` names, then ``quiz.yaml``'s order, that gives one; else the fallback. None
    only for a step where nothing changes."""
    q = quiz()
    by_event = q.by_event
    for kind in list(prefer) + list(q.order):
        qid = by_event.get(kind)
        if qid is not None:
            found = ASK[qid](snap, rec)
            if found is not None:
                return found
    return ASK[q.fallback](snap, rec)


def make_prediction(
    snap: Snapshot, rec: StepRecord, lang: str = "en", prefer: tuple[str, ...] = ()
) -> Prediction | None:
    """``next_question`` in ``lang``."""
    found = next_question(snap, rec, prefer)
    return found.render(lang) if found is not None else None
