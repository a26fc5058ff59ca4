"""The class pack: every lesson, topic and casebook case the app plays, each as the offline player
of its recorded run, with an index (the app's sections, in its order) and the quiz, in every
language asked for. ``python -m paged_kv_lab pack`` (cli/pack_command.py) writes it to a folder;
the home page's
button offers it as a zip. classroom/pack_site.py lays the pages out; this module says what goes in.

Each run is the app's own shared run (store/run_store.py, opened as a lesson page opens it), so a
run
some session already recorded is not computed again, and a pack's player shows what the app's
player shows: the same narration, intro, outro and panels (lesson_page.lesson_player), exported by
the same code as the lesson page's "Download this run" (player_component.export_html).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from paged_kv_lab.classroom.pack_site import (
    INDEX,
    QUIZ,
    IndexEntry,
    IndexPage,
    IndexSection,
    PackRefused,
    index_html,
    quiz_html,
)
from paged_kv_lab.content import lessons
from paged_kv_lab.content.casebook import Case, cases
from paged_kv_lab.content.catalog import Lesson
from paged_kv_lab.content.registry import Page, nav_title, sections
from paged_kv_lab.text.i18n import Text, languages, tr

ALL = "all"
CASEBOOK_PAGE = "casebook"  # the registry page whose entries in the pack are the cases
QUIZ_PER_RUN = 2  # "predict the next step" questions drawn from each lesson's or case's run
RUN_WAIT = 1800.0  # seconds a pack waits for one run to be recorded to its end, at most


@dataclass(frozen=True)
class PackItem:
    """One entry of the pack: a lesson or topic page's lesson, or a casebook case (``case``; its
    run with the fix is a second player). ``id`` is what ``--lessons`` names and the player's file
    name; ``page`` is the registry page it sits under (its section and place)."""

    id: str
    page: Page
    lesson: Lesson
    case: Optional[Case] = None

    def runs(self) -> tuple[tuple[str, Lesson], ...]:
        """(file stem, lesson) of each player of the entry."""
        fixed = self.case.fixed_lesson() if self.case is not None else None
        return ((self.id, self.lesson),) + (((fixed.id, fixed),) if fixed is not None else ())


def pack_items() -> tuple[PackItem, ...]:
    """Every player the app has, in the sidebar's order: each page that plays a lesson, and the
    casebook's cases where the casebook page is."""
    out, by_id = [], lessons().by_id
    for section in sections():
        for page in section.pages:
            if page.lesson is not None and page.lesson in by_id:
                out.append(PackItem(page.lesson, page, by_id[page.lesson]))
            elif page.id == CASEBOOK_PAGE:
                out += [PackItem(c.lesson.id, page, c.lesson, c) for c in cases()]
    return tuple(out)


def select_items(spec: str) -> tuple[PackItem, ...]:
    """``all`` or a comma-separated list of ids, in the app's order. Raises PackRefused naming the
    unknown ids and the valid ones."""
    items = pack_items()
    asked = [s.strip() for s in spec.split(",") if s.strip()]
    if asked == [ALL]:
        return items
    valid = [i.id for i in items]
    unknown = [a for a in asked if a not in valid]
    if unknown or not asked:
        raise PackRefused(
            Text(
                "pack.refused.unknown",
                {"ids": ", ".join(unknown) or spec, "valid": ", ".join([ALL, *valid])},
            )
        )
    return tuple(i for i in items if i.id in asked)


def select_langs(spec: Optional[str]) -> tuple[str, ...]:
    """A comma-separated list of catalogue languages (None: all of them, in menu order)."""
    known = tuple(languages())
    if spec is None:
        return known
    asked = tuple(dict.fromkeys(s.strip() for s in spec.split(",") if s.strip()))
    unknown = [a for a in asked if a not in known]
    if unknown or not asked:
        raise PackRefused(
            Text(
                "pack.refused.lang", {"langs": ", ".join(unknown) or spec, "valid": ",".join(known)}
            )
        )
    return asked


# -- building ---------------------------------------------------------------------------------
Opener = Callable[[Lesson], Any]  # a lesson -> a Timeline over its shared run
Progress = Callable[[int, int, str], None]  # (item number, items, the player's file stem)


def app_opener(ms) -> Opener:
    """Open a lesson's run as its page does (app/state.py), on the loaded model ``ms``: the same
    scenario and model key, so the store's recorded run is the one the app's sessions play."""
    from paged_kv_lab.ui.modelstate import played_model_state
    from paged_kv_lab.ui.state import build_scenario, open_run

    def opener(lesson):
        lms = played_model_state(lesson, ms)  # a lesson's own model (hybrid), as its page has it
        return open_run(build_scenario(lesson, lesson.scenario, {}, lms), lms)

    return opener


def recorded(timeline, background: bool = True, timeout: float = RUN_WAIT) -> None:
    """Wait until the run under ``timeline`` is done, or ``timeout`` s pass (the pack then holds
    what was recorded, and its player says the run goes on). ``background``: as the store's
    background work, so the app's sessions' clicks go first; else each step is asked for as the
    next one, which the store computes at once (the command line, where nobody else waits)."""
    run, end = timeline.run, time.monotonic() + timeout
    run.want(1 << 30)
    if background:
        run.wait(1 << 30, timeout, urgent=False)
    while not run.done and time.monotonic() < end:
        run.wait(len(run.records) + 1, end - time.monotonic(), urgent=True)


@dataclass(frozen=True)
class _Shown:
    """What lesson_player reads of a page's state: the cursor over the run."""

    run: Any


def _player(item: PackItem, lesson: Lesson, timeline, ms, lang: str) -> str:
    from paged_kv_lab.ui.lesson_page import lesson_player
    from paged_kv_lab.ui.player_component import export_html

    kw = lesson_player(_Shown(timeline), lesson, ms, lang)
    if item.case is not None:  # a case ends on its answer, as its page does under the player
        kw["outro"] = tr(item.case.answer, lang)
    return export_html(
        timeline,
        lang,
        f"Paged KV Lab · {tr(lesson.title, lang)}",
        focus=lesson.focus,
        back=(tr("pack.back", lang), f"../{INDEX}#{lang}"),
        **kw,
    )


def _title(item: PackItem, lang: str) -> str:
    if item.case is not None:
        return tr(
            "page.lesson_title", lang, number=item.case.number, title=tr(item.case.title, lang)
        )
    return nav_title(item.page, lang)


def _summary(item: PackItem, lang: str) -> str:
    return tr(item.case.asked if item.case is not None else item.page.summary, lang)


def _step_questions(item: PackItem, timeline) -> list[tuple[int, Any]]:
    """Up to QUIZ_PER_RUN "predict the next step" questions of the run, each of another kind,
    earliest first; (step, question in no language yet)."""
    from paged_kv_lab.content.quiz import next_question

    records, found, kinds = timeline.records, [], set()
    snaps = [timeline.initial] + [r.snapshot for r in records]
    for rec, before in zip(records, snaps):
        if before is None:
            continue
        q = next_question(before, rec, tuple(item.lesson.focus))
        if q is not None and q.kind not in kinds and q.kind != "free":
            kinds.add(q.kind)
            found.append((rec.step, q))
            if len(found) == QUIZ_PER_RUN:
                break
    return found


def _quiz_questions(items, steps: dict, lang: str) -> list[dict]:
    out = []
    for item in items:
        title, href = _title(item, lang), f"{item.id}.html"
        for q in item.lesson.questions:  # the lesson's own "check yourself"
            opts = [tr(o, lang) for o in q.options]
            out.append(
                {
                    "where": title,
                    "href": href,
                    "link": tr("pack.quiz.open", lang),
                    "prompt": tr(q.prompt, lang),
                    "options": opts,
                    "answer": q.answer,
                    "wrong": tr("quiz_wrong", lang, answer=opts[q.answer]),
                    "explain": tr(q.explain, lang),
                }
            )
        for step, q in steps.get(item.id, ()):
            p = q.render(lang)
            out.append(
                {
                    "where": tr("pack.quiz.where", lang, title=title, step=step),
                    "href": f"{href}#step={step - 1}",
                    "link": tr("pack.quiz.look", lang),
                    "prompt": p.prompt,
                    "options": list(p.options),
                    "answer": p.answer,
                    "wrong": tr("quiz_wrong", lang, answer=p.options[p.answer]),
                    "explain": p.explain,
                }
            )
    return out


def _index(items: Sequence[PackItem], langs: Sequence[str], model: str) -> str:
    pages = []
    for lang in langs:
        secs = []
        for section in sections():
            for page in section.pages:
                mine = [i for i in items if i.page.id == page.id]
                if not mine:
                    continue
                entries = tuple(
                    IndexEntry(
                        f"{i.id}.html",
                        i.case.icon if i.case is not None else page.icon,
                        _title(i, lang),
                        _summary(i, lang),
                        tuple((tr(i.case.fix.label, lang), f"{s}.html") for s, _ in i.runs()[1:]),
                    )
                    for i in mine
                )
                title = (
                    nav_title(page, lang) if page.id == CASEBOOK_PAGE else tr(section.title, lang)
                )
                if secs and secs[-1].title == title:
                    secs[-1] = IndexSection(title, secs[-1].entries + entries)
                else:
                    secs.append(IndexSection(title, entries))
        quiz = IndexEntry(QUIZ, "🎓", tr("quiz_title", lang), tr("pack.index.quiz", lang))
        pages.append(
            IndexPage(
                lang,
                languages()[lang],
                tr("pack.index.title", lang),
                tr("pack.index.intro", lang, model=model),
                tuple(secs),
                quiz,
            )
        )
    return index_html(pages)


def build_pack(
    items: Sequence[PackItem],
    langs: Sequence[str],
    ms,
    opener: Optional[Opener] = None,
    progress: Optional[Progress] = None,
    background: bool = True,
) -> dict[str, str]:
    """The pack's files (relative path -> text): every item's players in every language, the
    quiz per language and the index. ``ms`` is the loaded model (app/modelstate.ModelState);
    ``opener`` opens a lesson's run (default: as the app does, from the shared store);
    ``background``: runs still to record wait behind the sessions' clicks (``recorded``)."""
    opener = opener or app_opener(ms)
    files: dict[str, str] = {}
    steps: dict[str, list] = {}
    for n, item in enumerate(items, 1):
        for stem, lesson in item.runs():
            if progress is not None:
                progress(n, len(items), stem)
            timeline = opener(lesson)
            recorded(timeline, background)
            if stem == item.id:
                steps[item.id] = _step_questions(item, timeline)
            for lang in langs:
                files[f"{lang}/{stem}.html"] = _player(item, lesson, timeline, ms, lang)
    for lang in langs:
        files[f"{lang}/{QUIZ}"] = quiz_html(
            lang,
            tr("quiz_title", lang),
            tr("pack.quiz.intro", lang),
            (tr("pack.back", lang), f"../{INDEX}#{lang}"),
            {
                "check": tr("quiz_answer", lang),
                "pick": tr("pack.quiz.pick", lang),
                "right": tr("quiz_right", lang),
            },
            _quiz_questions(items, steps, lang),
        )
    files[INDEX] = _index(items, langs, ms.name)
    return files
