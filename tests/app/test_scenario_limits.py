"""The hostile-and-careless suite (issue 26): every setting of the scenario schema at its minimum
and maximum, one past each, at the budget's limit and one past it, null, a wrong type (cases made
from the schema itself: tests/support/scenario_cases.py), delivered as a pasted scenario, an
uploaded file and a link on the playground, and as a trace file's header on the trace viewer (and
from there into the playground). Each case ends with the run open holding the value, or a refusal
that names the setting (a budget's: its limit and environment variable); the page is drawn to its
end and the scenario box takes the next case, so every case is also the box's "still usable"
check for the one before.

One AppTest session per way in, cases in a row: a session per case would spend the suite's time
starting the app."""

import copy
import dataclasses
import json

import pytest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.run.budget import ENV, Limits, app_limits
from paged_kv_lab.run.scenario import EngineSettings, RequestSpec, Scenario
from paged_kv_lab.ui.playground import form_values
from paged_kv_lab.ui.state import SETTING_DEFAULTS, _encode_base
from paged_kv_lab.ui.trace_page import STATE_KEY as TRACE_STATE
from support.app import APP, TIMEOUT, app, open_page
from support.scenario_cases import Case, cases, extremes

BASE = BY_ID["playground"].scenario
CASES = cases(BASE, Limits())
EXTREMES = extremes(CASES)  # what the second and third ways in carry (one per field, budgets)
FIELDS = {
    f.name for cls in (Scenario, EngineSettings, RequestSpec) for f in dataclasses.fields(cls)
}
PASTE, LOAD = "paste:playground", "paste_btn:playground"
APPLY = "FormSubmitter:settings:playground-Apply settings"
# the engine settings the playground's form draws (the others it passes through untouched)
FORM = {("engine", name) for name in form_values(SETTING_DEFAULTS)} | {
    ("engine", "speculative"),
    ("engine", "cpu_offload"),
}


@pytest.fixture(scope="module", autouse=True)
def small_store():
    """Runs opened here compute two steps at most: the cases are about opening a run (the step cap
    is tests/app/test_playground_limits.py's), and a hundred runs computed to their ends would only
    take the machine from the other tests."""
    import paged_kv_lab.store.run_store as store_mod
    from paged_kv_lab.run.budget import app_limits
    from paged_kv_lab.store.run_store import RunStore

    old, store_mod._STORE = store_mod._STORE, RunStore(max_steps=2, limits=app_limits())
    yield
    store_mod._STORE.close()
    store_mod._STORE = old


def value_at(scenario, path: tuple):
    at = scenario
    for p in path:
        at = at[p] if isinstance(p, int) else getattr(at, p)
    return at


def named(msg: str, case: Case) -> bool:
    """A refusal names what was wrong: the setting's path, a setting of the schema, or a limit of
    the server's budget (by its environment variable)."""
    return (
        case.where in msg
        or "PAGED_KV_LAB_" in msg
        or any(f"{name}" in msg for name in FIELDS if len(name) > 3)
    )


def box_drawn(at) -> bool:
    """The way a scenario comes in is drawn: the playground's paste box and Load button (with its
    uploader), or the trace viewer's uploader."""
    uploaders = {u.key for u in at.get("file_uploader")}
    if "up:trace" in uploaders:
        return True
    return (
        "up:playground" in uploaders
        and any(t.key == PASTE for t in at.text_area)
        and any(b.key == LOAD for b in at.button)
    )


def outcome(at, state, case: Case, kept) -> str | None:
    """What is wrong with how the page ended this case (None: nothing)."""
    if at.exception:
        return f"raised {[e.value for e in at.exception]}"
    if not box_drawn(at):
        return "the scenario box is gone"
    errors = "\n".join(e.value for e in at.error)
    if errors:
        if not kept(state.run.scenario):
            return f"refused ({errors[:200]}) but the run shown is not the one kept"
        if not named(errors, case):
            return f"a refusal that names nothing: {errors[:300]}"
        if case.what == "budget" and ENV[case.limit] in errors:
            return f"refused at the budget's own limit: {errors[:200]}"
        if case.what == "over budget" and ENV[case.limit] not in errors:
            return f"over the budget but {ENV[case.limit]} is not named: {errors[:300]}"
        if case.expect == "refused" and case.where.split("[")[0] not in errors:
            return f"refused without naming {case.where}: {errors[:300]}"
        return None
    if case.expect == "refused" or case.what == "over budget":
        return "opened a scenario the schema or the budget refuses"
    if len(case.path) and case.path[-1] in ("model", "device"):
        return None  # the page runs the model loaded in the sidebar
    if case.expect == "either":
        return None  # the class's own code may normalise it (publisher null -> "null")
    got = value_at(state.run.scenario, case.path)
    want = case.shown()
    if got != want and not (case.path[-1] == "requests" and len(got) == len(want)):
        return f"opened with {str(got)[:80]!r}, not the value given"
    return None


def sweep(at, deliver, state_of, kept=None, only=None, computes=True) -> list[str]:
    """Every case (or those in ``only``) through ``deliver(at, case)``; the problems found. After
    a refusal the run shown must pass ``kept(scenario)`` (default: the run before the case).
    ``computes``: the page computes the run, so the budget applies (a trace is only read)."""
    problems = []
    for case in CASES if only is None else only:
        before = state_of(at).run.scenario
        try:
            deliver(at, case)
        except KeyError as e:  # the way in is not drawn: the case before broke the page
            problems.append(f"{case.id}: the scenario box is gone ({e})")
            break
        if not computes and case.what == "over budget":
            case = dataclasses.replace(case, what="past a budget a trace does not need")
        problem = outcome(at, state_of(at), case, kept or (lambda s, b=before: s == b))
        if problem:
            problems.append(f"{case.id}: {problem}")
    return problems


def open_box(at):
    at.session_state["scenario_open:playground"] = True
    return at.run()


def playground_state(at):
    return at.session_state["lesson:playground"]


def paste(at, case: Case) -> None:
    at.text_area(key=PASTE).set_value(json.dumps(case.scenario(BASE)))
    at.button(key=LOAD).click().run()


def test_every_setting_at_its_limits_pasted():
    """Pasted: every case. An engine setting of the settings form that opened then goes through
    it: Apply with nothing edited keeps the engine exactly (a value the form cannot edit is kept, a
    null stays null, a seed of 0 stays a seed)."""
    at = open_box(app("playground"))
    applied = []

    def paste_and_apply(at, case):
        paste(at, case)
        if case.path[:2] not in FORM or at.error or at.exception:
            return
        engine = playground_state(at).run.scenario.engine
        at.button(key=APPLY).click().run()
        after = playground_state(at).run.scenario.engine
        if at.exception or at.error or after != engine:
            shown = [e.value[:200] for e in [*at.exception, *at.error]]
            applied.append(f"{case.id}: Apply changed {engine} into {after} {shown}")

    problems = sweep(at, paste_and_apply, playground_state)
    assert not problems, "\n".join(problems)
    assert not applied, "\n".join(applied)


def test_every_setting_at_its_limits_uploaded():
    at = open_box(app("playground"))
    counter = iter(range(10**6))

    def upload(at, case):
        data = json.dumps(case.scenario(BASE)).encode()
        at.file_uploader(key="up:playground").upload(
            f"case{next(counter)}.json", data, "application/json"
        ).run()

    problems = sweep(at, upload, playground_state, only=EXTREMES)
    assert not problems, "\n".join(problems)


def test_every_setting_at_its_limits_linked():
    """A link (``?lesson=playground&scn=...``) is read when a session opens the page: each case
    is a new session's state on the same server (the session's lesson state dropped)."""
    at = app("playground")

    def link(at, case):
        at.query_params.clear()
        at.query_params.update({"lesson": "playground", "scn": _encode_base(case.scenario(BASE))})
        del at.session_state["lesson:playground"]
        at.run()

    open_box(at)
    problems = sweep(
        at, link, playground_state, kept=lambda s: s.name == BASE["name"], only=EXTREMES
    )
    assert not problems, "\n".join(problems)


# -- the trace viewer: a trace file whose header holds the case's scenario ------------------------
@pytest.fixture(scope="module")
def trace_lines(tiny):  # noqa: F811
    """A real trace of the playground's scenario on the tiny model: (header, the other lines)."""
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.run.scenario import load_scenario, scenario_to_dict
    from paged_kv_lab.run.trace_file import Trace

    scenario = load_scenario({**BASE, "model": "tiny-random", "device": "cpu"})
    engine = Engine(scenario, model=tiny)
    initial, records = engine.snapshot(), engine.run()
    text = Trace(scenario_to_dict(scenario), initial, tuple(records), engine.outputs()).to_jsonl()
    first, *rest = text.splitlines()
    return json.loads(first), rest


def trace_state(at):
    return at.session_state[TRACE_STATE]


def trace_text(trace_lines, case: Case) -> bytes:
    header, rest = trace_lines
    return "\n".join([json.dumps({**header, "scenario": case.scenario(BASE)}), *rest]).encode()


def test_every_setting_at_its_limits_in_a_trace_file(trace_lines):
    """The trace viewer reads the scenario in a trace's header: each case (every field at its most
    extreme accepted value, and every value the schema refuses) opens the trace or is refused by
    name (the trace shown before stays), and the viewer's upload takes the next. Nothing is
    computed from a trace, so the run budget does not apply: over it, the trace opens."""
    at = app("trace")
    counter = iter(range(10**6))

    def upload(at, case):
        at.file_uploader(key="up:trace").upload(
            f"case{next(counter)}.jsonl", trace_text(trace_lines, case), "application/jsonl"
        ).run()

    first = dataclasses.replace(CASES[0], path=("description",), value="first", what="first")
    upload(at, first)
    assert trace_state(at).run is not None and not at.error
    only = EXTREMES + [c for c in CASES if c.expect == "refused"]
    problems = sweep(at, upload, trace_state, only=only, computes=False)
    assert not problems, "\n".join(problems)


def test_every_setting_at_its_limits_from_a_trace_into_the_playground(trace_lines):
    """ "Open in the Playground" under a trace hands its header's scenario to the playground: the
    playground opens it (holding the value) or the viewer says by name why not."""
    at = app("trace")
    at.session_state["scenario_open:playground"] = True  # the playground's box, drawn there
    counter = iter(range(10**6))
    problems = []
    for case in EXTREMES:
        if case.what == "over budget" or case.expect == "refused":
            continue  # refused by the header's own check (above) or by the playground (below)
        at.file_uploader(key="up:trace").upload(
            f"case{next(counter)}.jsonl", trace_text(trace_lines, case), "application/jsonl"
        ).run()
        if at.error or at.exception:
            continue  # a rule between fields refused the header, by name (the test above)
        at.button(key="playground:trace").click().run()
        if at.exception:
            problems.append(f"{case.id}: raised {[e.value for e in at.exception]}")
        elif at.error:  # still on the viewer, which says why
            errors = "\n".join(e.value for e in at.error)
            if not named(errors, case):
                problems.append(f"{case.id}: a refusal that names nothing: {errors[:300]}")
        else:
            state = playground_state(at)
            problem = outcome(at, state, case, lambda s: True)
            if problem:
                problems.append(f"{case.id}: {problem}")
            open_page(at, "trace").run()
    assert not problems, "\n".join(problems)


def test_a_linked_window_past_the_form_steps_and_reruns(monkeypatch):
    """Issue 26 saw, once, with sliding_window 200000 from a link: the player's reruns failing on
    a duplicate element key ('pkv:playground') and a Step hanging. The link opened, stepped and
    rerun (the page and the player's own fragment) draws one player and no exception."""
    from streamlit.testing.v1 import AppTest

    import paged_kv_lab.store.run_store as store_mod
    from paged_kv_lab.run.budget import app_limits
    from paged_kv_lab.store.run_store import RunStore
    from support.app import Browser, player_data

    store = RunStore(max_steps=6, limits=app_limits())  # past the steps shown: Step computes
    monkeypatch.setattr(store_mod, "_STORE", store)
    d = copy.deepcopy(BASE)
    d["engine"]["sliding_window"] = 200_000
    try:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params.update({"lesson": "playground", "scn": _encode_base(d)})
        open_page(at, "playground").run()
        assert not at.exception, [e.value for e in at.exception]
        b = Browser(at, "playground").until_recorded(4)
        for step in (1, 2, 3, 2, 4):
            b.show(step)
            assert not at.exception and player_data(at, "playground")  # one player, no duplicate
        for _ in range(3):
            b.run()
        assert playground_state(at).run.scenario.engine.sliding_window == 200_000
        assert playground_state(at).run.cursor == 4
    finally:
        store.close()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_each_cap_is_said_next_to_what_it_caps(lang):
    """Before anything is applied, the playground's forms name each per-setting limit of the budget
    and its variable (from run/budget.py: SETTING_LIMITS), and the request count and the tokens
    a request may generate, in the page's language."""
    from paged_kv_lab.text.i18n import tr
    from paged_kv_lab.ui.playground import BUDGET_MAX
    from support.app import sidebar_set

    at = app("playground")
    if lang != "en":
        sidebar_set(at, "lang", lang)
    lim = app_limits()
    said = " ".join(c.value for c in at.caption)
    for name, field in BUDGET_MAX.items():
        assert f"{name} {getattr(lim, field):,} ({ENV[field]})" in said
    assert tr("playground.field_limits", lang, limits="").split("{")[0][:6] in said
    count = sum(r.get("n", 1) for r in BASE["requests"])
    assert (
        tr(
            "playground.requests_limit",
            lang,
            count=count,
            most=f"{lim.max_requests:,}",
            tokens=f"{lim.max_tokens:,}",
        )
        in said
    )
    assert "PAGED_KV_LAB_MAX_REQUESTS" in said and "PAGED_KV_LAB_MAX_TOKENS" in said


def test_a_scenario_too_large_for_a_link_says_so_and_leaves_the_link_openable(monkeypatch):
    """The app never writes a link it would refuse to open: a scenario whose packed form is over
    PAGED_KV_LAB_MAX_LINK_CHARS stays out of the URL, and the page says why, by name."""
    monkeypatch.setenv("PAGED_KV_LAB_MAX_LINK_CHARS", "2000")
    at = open_box(app("playground"))
    d = copy.deepcopy(BASE)
    d["description"] = "".join(f"{i:x}" for i in range(2000))  # packs to about 5,000
    at.text_area(key=PASTE).set_value(json.dumps(d))
    at.button(key=LOAD).click().run()
    assert not at.error and playground_state(at).run.scenario.description == d["description"]
    note = " ".join(c.value for c in at.caption)
    assert "PAGED_KV_LAB_MAX_LINK_CHARS" in note and "at most 2,000" in note
    assert "scn" not in at.query_params and at.query_params["lesson"] == "playground"
    d["description"] = "short"  # a scenario that fits goes into the link again
    at.text_area(key=PASTE).set_value(json.dumps(d))
    at.button(key=LOAD).click().run()
    assert "scn" in at.query_params
    assert "PAGED_KV_LAB_MAX_LINK_CHARS" not in " ".join(c.value for c in at.caption)


def test_a_link_to_the_trace_viewer_carries_no_scenario_into_it():
    """The trace viewer opens traces, not scenarios: a link to it with a scenario (one past the
    budget, and one past the schema) opens the viewer empty, says nothing went wrong, and drops the
    scenario from the URL; the uploader is there to take a trace."""
    from streamlit.testing.v1 import AppTest

    for case in [c for c in EXTREMES if c.what == "over budget"][:1] + [
        next(c for c in CASES if c.expect == "refused")
    ]:
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params.update({"lesson": "playground", "scn": _encode_base(case.scenario(BASE))})
        open_page(at, "trace").run()
        assert not at.exception and not at.error, case.id
        assert any("No trace loaded" in i.value for i in at.info)
        assert "scn" not in at.query_params and box_drawn(at)
