"""The casebook in a real browser (Debian's chromium, Playwright) on the tiny model: a link opens
a case, its "try the fix" switch swaps the player's run for the fixed one, and the number under the
player changes to the fixed run's, as the engine computes it for the same two scenarios here. For
the cases whose figure is a count or whose run is a P/D pair (8, 9, 10), where the page's path
differs from the hit-rate cases the AppTest covers, and for case 7, whose fix changes the block
size of KV cache groups of different block sizes (a worker laid out in pages of their greatest
common divisor). Case 7's player also draws each group at its own block size: its label, the
tokens a logical block covers, and the address arithmetic, as the engine's groups have them."""

import pytest

from paged_kv_lab.content.casebook import RATES, cases_by_id, numbers
from paged_kv_lab.text.i18n import tr
from support.browser import open_player, wait_idle, wait_step

pytestmark = pytest.mark.browser

CASES = ("preemptions-seen", "connector-hma-off", "pd-cached-tokens", "which-block-size")


def shown(key: str, x: float) -> str:
    return f"{100 * x:.1f}%" if key in RATES else f"{x:g}"


def expected(case, tiny_model) -> tuple[str, str]:
    """The figure's number at the end of the run and of the fixed run, as the page writes it."""
    from paged_kv_lab.store.timeline import lesson_run

    out = []
    for lesson in (case.lesson, case.fixed_lesson()):
        run = lesson_run(lesson, tiny_model)
        run.run_to_end(timeout=300)
        out.append(shown(case.figure, numbers(run.records[-1].snapshot)[case.figure]))
    return out[0], out[1]


def check_group_block_sizes(page, case, tiny_model) -> None:
    """At the first step where a request's table in the group of the longer blocks reaches a
    second block, each group's label names its block size, that block's cell its tokens, the grid
    leaves a block's slots hollow up to its group's size, and the address view computes each
    group's slot with the group's own size (numbers from the engine)."""
    from paged_kv_lab.store.timeline import lesson_run

    run = lesson_run(case.lesson, tiny_model)
    run.run_to_end(timeout=300)
    sizes = run.records[0].snapshot.group_block_sizes
    assert len(set(sizes)) > 1, sizes
    wide = sizes.index(max(sizes))
    rec = next(
        r for r in run.records if any(len(v.block_tables[wide]) > 1 for v in r.snapshot.requests)
    )
    snap = rec.snapshot
    page.keyboard.press("Home")
    for k in range(1, rec.step + 1):  # bounded: one press per recorded step
        page.keyboard.press("ArrowRight")
        wait_step(page, k)
    text = page.locator('[data-role="tables"]').evaluate("e => e.textContent")
    for g, bs in enumerate(sizes):
        assert tr("player.group_block_size", "en", block_size=bs) in text, (g, bs, text)
    cell = tr("player.block_tokens", "en", first=max(sizes), last=2 * max(sizes) - 1)
    cells = page.locator(f'[data-role="tables"] table[data-group="{wide}"] .pkv-logical')
    assert f"L1 · {cell}" in cells.all_text_contents()
    # the block grid's hollow slots: a held block's empty slots at its own group's block size
    group_of = {b: g for v in snap.requests for g, t in enumerate(v.block_tables) for b in t}
    want = {
        str(b.block_id): str(sizes[group_of[b.block_id]] - len(b.token_ids))
        for b in snap.blocks
        if b.owners and not b.is_null and len(b.token_ids) < sizes[group_of[b.block_id]]
    }
    got = page.locator('[data-role="grid"] [data-block]').evaluate_all(
        "els => Object.fromEntries(els.filter(e => e.dataset.empty)"
        ".map(e => [e.dataset.block, e.dataset.empty]))"
    )
    assert got == want
    # the address view's request and position by default: the first holding blocks, its last
    # computed token
    r = next(v for v in snap.requests if any(v.block_tables))
    pos = max(0, min(r.num_prompt_tokens + len(r.output_token_ids), r.num_computed_tokens) - 1)
    for g, (bs, table) in enumerate(zip(sizes, r.block_tables)):
        line = page.locator(f'[data-role="address"] .pkv-addr-line[data-group="{g}"]')
        said = line.evaluate("e => e.textContent")
        assert f"{pos} // {bs} = {pos // bs}" in said, said
        pb = table[pos // bs] if pos // bs < len(table) else 0
        if pb:
            assert f"slot {pb} × {bs} + {pos % bs} = {pb * bs + pos % bs}" in said, said


def metric(page, label: str, timeout_s: float = 120.0) -> str:
    """The value of the page's metric called ``label``, once it is drawn."""
    box = page.locator("[data-testid=stMetric]", has_text=label).first
    box.wait_for(timeout=timeout_s * 1000)
    return box.locator("[data-testid=stMetricValue]").inner_text().strip()


@pytest.mark.parametrize("case_id", CASES)
def test_the_switch_shows_the_fixed_run_and_its_number(server, browser, tiny_model, case_id):
    case = cases_by_id()[case_id]
    before, after = expected(case, tiny_model)
    assert before != after, (case_id, before, after)
    label = tr(f"casebook.metric.{case.figure}", "en")
    page = browser.new_page(viewport={"width": 1400, "height": 2400})
    open_player(page, f"{server}/casebook?lesson={case.lesson.id}")
    wait_idle(page)
    assert metric(page, label) == before
    if case_id == "which-block-size":
        check_group_block_sizes(page, case, tiny_model)
    page.get_by_text(tr(case.fix.label, "en"), exact=True).click()
    page.wait_for_function(
        "(want) => [...document.querySelectorAll('[data-testid=stMetric]')]"
        ".some(m => m.innerText.includes(want[0]) && m.innerText.includes(want[1]))",
        arg=[label, after],
        timeout=180_000,
    )
    assert metric(page, label) == after
    # the player now plays the fixed run, and the link it writes says so
    page.wait_for_selector(".pkv[data-total]", timeout=180_000)
    assert f"lesson={case.lesson.id}-fixed" in page.url
    page.close()
