"""Lesson 12 "Prefill here, decode there" on SmolLM2 in a real browser (Debian's chromium,
Playwright), on the session's shared SmolLM2 server: stepping it, the player narrates which
replica made each step, the prefill replica keeping A's blocks, the transfer step with both
sides' block ids, the prefill replica's delayed free and the delayed caching when the load
lands, each at the step where the run makes it; under the player both pools stand side by side,
each as the same lesson run here on the same weights has it at that step (disagg/pd.py:
pair_at), the pull marked on both sides; "Why?" answers for a prefill block; the failure switch
makes A's pull fail under "fail"."""

import re
import time

import pytest

from paged_kv_lab.content import BY_ID
from paged_kv_lab.text.i18n import Text, tr
from support.browser import open_player, wait_idle

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def words(i: int) -> str:
    """The longest stretch of moment i's sentence without a field, as the player shows it."""
    text = tr(BY_ID["pd"].moments[i].text, "en").replace("**", "").replace("`", "")
    return max(re.split(r"\{\w+\}", text), key=len).strip()


MOMENTS = {i: words(i) for i in range(4)}


def lesson_run(model, option: str):
    """The lesson's run under ``option`` of its failure switch, here, on the same weights."""
    from paged_kv_lab.disagg.pd import engine_for
    from paged_kv_lab.run.scenario import load_scenario

    d = BY_ID["pd"].scenario_dict(None, {"failed_load": option})
    run = engine_for(load_scenario({**d, "model": "smollm2", "device": "cpu"}), model=model)
    initial = run.snapshot()
    return initial, run.run()


@pytest.fixture(scope="module")
def expected(smollm2):
    return {option: lesson_run(smollm2, option) for option in ("none", "A:fail")}


def pools(page) -> dict[str, list[str]]:
    """Each replica's pool as the page shows it: its cells' texts, in order."""
    return {
        name: [
            t
            for t in page.locator(f".st-key-pd-pool-{name} table td").all_inner_texts()
            if t.strip()
        ]
        for name in ("prefill", "decode")
    }


def settled_pools(page, want: dict) -> dict[str, list[str]]:
    """The pools once the rerun's tables are drawn: the title can arrive before the tables do,
    so they are read until they show what is wanted (bounded: 30 s), and returned as read."""
    deadline = time.monotonic() + 30
    shown = pools(page)
    while shown != want and time.monotonic() < deadline:
        page.wait_for_timeout(500)
        shown = pools(page)
    return shown


def wanted_pools(initial, records, step) -> dict[str, list[str]]:
    from paged_kv_lab.disagg.pd import pair_at
    from paged_kv_lab.ui.pd_panel import cell_text

    view = pair_at(initial, records, step)
    return {name: [cell_text(b) for b in cells] for name, cells in view.blocks.items()}


def step_to(page, step: int, records) -> str:
    """Press → to ``step``; the narration once the pools under the player show that step."""
    page.keyboard.press("ArrowRight")
    page.wait_for_selector(f'.pkv[data-step="{step}"]', timeout=180_000)
    title = tr("pd.pools.title", "en", step=step)
    page.wait_for_function("t => document.body.innerText.includes(t)", arg=title, timeout=120_000)
    wait_idle(page)
    return page.locator('[data-role="narration"]').inner_text()


def test_both_pools_the_replica_and_the_transfer_are_shown_at_each_step(
    smollm2_server,
    browser,  # noqa: F811
    expected,
):
    initial, records = expected["none"]
    page = browser.new_page(viewport={"width": 1500, "height": 2600})
    open_player(page, smollm2_server + "/prefill_decode", done=False)
    assert "Prefill here, decode there" in page.inner_text("h1")
    seen: dict[int, int] = {}
    (pull,) = [r for r in records if "A" in r.pulls]
    for rec in records[: pull.step + 2]:  # A's journey: kept, pulled, freed there, cached here
        said = step_to(page, rec.step, records)
        replica = tr("pd.replica." + rec.replica, "en")
        assert f"Step {rec.step}: the {replica}'s step." in said
        for i, start in MOMENTS.items():
            if i not in seen and start in said:
                seen[i] = rec.step
        want = wanted_pools(initial, records, rec.step)
        shown = settled_pools(page, want)
        assert shown == want, rec.step
        label = tr(
            "pd.pools.pool_now", "en", replica=Text(f"pd.replica.{rec.replica}"), step=rec.step
        )
        assert label in page.inner_text(f".st-key-pd-pool-{rec.replica}")
        if rec is pull:  # the transfer step: both sides' ids, in the narration and on the pools
            remote, local = rec.pulls["A"]
            assert f"pulled prefill blocks {list(remote)} into decode blocks {list(local)}" in said
            assert "waiting_for_remote_kvs" in page.locator('[data-role="outputs"]').inner_text()
            assert sorted(c for c in shown["prefill"] if "→" in c) == sorted(
                f"{p} → {d}" for p, d in zip(remote, local)
            )
            assert sorted(c for c in shown["decode"] if "←" in c) == sorted(
                f"{d} ← {p}" for p, d in zip(remote, local)
            )
    assert list(seen) == [0, 1, 2, 3], seen
    assert list(seen.values()) == sorted(seen.values())
    page.close()


def test_why_answers_for_a_prefill_block_at_the_transfer_step(smollm2_server, browser, expected):  # noqa: F811
    from paged_kv_lab.why.explain import RecordedSteps
    from paged_kv_lab.why.explain_pd import explain_pd_block

    initial, records = expected["none"]
    (pull,) = [r for r in records if "A" in r.pulls]
    page = browser.new_page(viewport={"width": 1500, "height": 2600})
    open_player(page, smollm2_server + "/prefill_decode", done=False)
    for rec in records[: pull.step]:
        step_to(page, rec.step, records)
    page.get_by_text(tr("why.title", "en")).click()
    wait_idle(page)
    # the P/D question comes first; the prefill replica and block 1 are its first choices
    answer = explain_pd_block(
        RecordedSteps(initial, tuple(records[: pull.step]), None), "prefill", 1
    )
    assert [t.key for t in answer.texts] == ["why.pd.kept", "why.pd.kept_read"]
    for text in answer.texts:
        line = tr(text, "en")
        page.wait_for_function("t => document.body.innerText.includes(t)", arg=line, timeout=60_000)
    page.close()


def test_the_failure_switch_fails_As_pull(smollm2_server, browser, expected):  # noqa: F811
    initial, records = expected["A:fail"]
    (failed,) = [r for r in records for e in r.events if e.kind == "kv_load_failed"]
    page = browser.new_page(viewport={"width": 1500, "height": 2600})
    open_player(page, smollm2_server + "/prefill_decode?lesson=pd&failed_load=A:fail", done=False)
    for rec in records[: failed.step]:
        said = step_to(page, rec.step, records)
    assert "fails" in said and "“fail”" in said and "FINISHED_ERROR" in said
    want = wanted_pools(initial, records, failed.step)
    shown = settled_pools(page, want)
    assert shown == want
    (ev,) = [e for e in failed.events if e.kind == "kv_load_failed"]
    assert sorted(c for c in shown["decode"] if "✗" in c) == sorted(f"{b} ✗" for b in ev.block_ids)
    assert any("⏸" in c for c in shown["prefill"]), "the prefill replica still keeps A's blocks"
    page.close()
