"""The player's decoder (player/assets/decode.js, the only one) in a real browser: a recorded run,
exported as one HTML file, opened offline in chromium and stepped through to its end. At every
step the snapshot the player rebuilt from the payload's head and deltas equals the snapshot an
independent engine took there: field by field under recording/snapshot.py's names, and as
``snapshot_dict`` once put back under the wire keys (player/assets/wire.json). What ran in the
step (events, scheduled tokens, phases, changed blocks) is the engine's record."""

import pytest

from support.browser import wait_step

pytestmark = pytest.mark.browser

STATE = """() => { const p = globalThis.__pkvActive;
  return {cursor: p.cursor, first: p.first, snap: p.run.snaps[p.cursor],
          step: p.cursor ? p.run.steps[p.cursor - 1] : p.run.step0}; }"""


def plain(v):
    if isinstance(v, tuple):
        return [plain(x) for x in v]
    return dict(v) if isinstance(v, dict) else v


def by_name(snap) -> dict:
    """A Snapshot under the decoder's names: the fields wire.json lists, as JSON would hold them."""
    from paged_kv_lab.player import WIRE

    out = {name: plain(getattr(snap, name)) for name in WIRE["snapshot"]}
    out["blocks"] = [{f: plain(getattr(b, f)) for f in WIRE["block"]} for b in snap.blocks]
    out["requests"] = [{f: plain(getattr(r, f)) for f in WIRE["request"]} for r in snap.requests]
    return out


def to_wire(decoded: dict) -> dict:
    """The decoded snapshot back under the wire keys, in the wire's order."""
    from paged_kv_lab.player import WIRE

    out = {key: decoded[name] for name, key in WIRE["snapshot"].items()}
    S = WIRE["snapshot"]
    out[S["blocks"]] = [{k: b[n] for n, k in WIRE["block"].items()} for b in decoded["blocks"]]
    out[S["requests"]] = [
        {k: r[n] for n, k in WIRE["request"].items()} for r in decoded["requests"]
    ]
    return out


def recorded(lesson_id: str):
    """A lesson on the tiny model, and an independent engine's snapshots of the same scenario."""
    from kvcore.model import load_model
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.disagg.pd import engine_for
    from paged_kv_lab.store.timeline import lesson_scenario, played_model

    # a lesson with a model of its own (hybrid models) plays on it
    model = played_model(BY_ID[lesson_id], load_model("tiny-random", "cpu"))
    scenario = lesson_scenario(BY_ID[lesson_id], model.num_layers, model=model.name, device="cpu")
    engine = engine_for(scenario, model=model)
    initial, records = engine.snapshot(), engine.run(max_steps=400)
    other = engine_for(scenario, model=model)
    truth = [other.snapshot()] + [other.step().snapshot for _ in records]
    return engine, initial, records, truth


def open_export(browser, tmp_path, payload):  # noqa: F811
    from paged_kv_lab.player import static_html

    path = tmp_path / "run.html"
    path.write_text(static_html(payload), encoding="utf-8")
    ctx = browser.new_context(offline=True)
    page = ctx.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector(".pkv[data-total]", timeout=30_000)
    return ctx, page, errors


def check_step(state, snap, rec) -> None:
    from paged_kv_lab.player import snapshot_dict

    got = state["snap"]
    assert got == by_name(snap), f"step {snap.step}: the decoded snapshot differs from the engine's"
    assert to_wire(got) == snapshot_dict(snap), f"step {snap.step}"
    st = state["step"]
    if rec is None:
        assert st is None
        return
    assert [(e["kind"], e["request_id"], e["block_ids"], e["group"]) for e in st["events"]] == [
        (str(e.kind), e.request_id, list(e.block_ids), e.group) for e in rec.events
    ], rec.step
    assert all(isinstance(e["text"], str) and e["text"] for e in st["events"])
    assert st["scheduled"] == rec.scheduled
    assert st["phases"] == {e.request_id: e.phase for e in rec.events if e.kind == "scheduled"}
    assert st["summary"] and isinstance(st["narration"], list)


def lesson_ids():
    from paged_kv_lab.content import LESSONS

    return [lesson.id for lesson in LESSONS]


@pytest.mark.parametrize("lesson_id", lesson_ids())
def test_every_step_decodes_to_the_engines_snapshot(lesson_id, browser, tmp_path):  # noqa: F811
    from paged_kv_lab.player import run_payload

    engine, initial, records, truth = recorded(lesson_id)
    payload = run_payload(initial, records, decode=engine.decode, lang="en")
    ctx, page, errors = open_export(browser, tmp_path, payload)
    n = len(records)
    assert int(page.locator(".pkv").get_attribute("data-total")) == n
    state = page.evaluate(STATE)
    assert state["cursor"] == 0 and state["first"] == 0
    check_step(state, truth[0], None)
    for k in range(1, n + 1):  # step by step, as a learner does
        page.keyboard.press("ArrowRight")
        wait_step(page, k)
        check_step(page.evaluate(STATE), truth[k], records[k - 1])
    assert not errors, errors
    ctx.close()


def test_a_run_without_the_state_before_step_1(browser, tmp_path):  # noqa: F811
    """A trace without its header: the head holds step 1's snapshot and record (step0)."""
    from paged_kv_lab.player import run_payload

    engine, _, records, truth = recorded("prefix")
    payload = run_payload(None, records, decode=engine.decode, lang="zh")
    ctx, page, errors = open_export(browser, tmp_path, payload)
    state = page.evaluate(STATE)
    assert state["first"] == 1 and int(page.locator(".pkv").get_attribute("data-step")) == 1
    check_step(state, truth[1], records[0])
    page.keyboard.press("End")
    wait_step(page, len(records))
    check_step(page.evaluate(STATE), truth[-1], records[-1])
    assert not errors, errors
    ctx.close()


def test_steps_streamed_in_pieces_decode_the_same(browser, tmp_path):  # noqa: F811
    """The first steps inlined, the rest fed later as the app feeds them (no head, from
    ``base``)."""
    from paged_kv_lab.player import run_payload

    engine, initial, records, truth = recorded("eviction")
    whole = run_payload(initial, records, decode=engine.decode)
    k = 4
    ctx, page, errors = open_export(
        browser, tmp_path, {**whole, "steps": whole["steps"][:k], "done": False}
    )
    page.evaluate(
        "(rest) => globalThis.__pkvActive.receive(rest)",
        {**whole, "head": None, "base": k, "steps": whole["steps"][k:], "done": True},
    )
    snaps = page.evaluate("() => globalThis.__pkvActive.run.snaps")
    assert snaps == [by_name(s) for s in truth]
    assert not errors, errors
    ctx.close()
