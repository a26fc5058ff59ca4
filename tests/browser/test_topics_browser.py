"""A real browser (Debian's chromium) draws one hash held by two blocks as one node of the hash
tree, with both blocks' chips (the lesson "One hash, two blocks", as its offline export)."""

import pytest

from support.browser import wait_step


@pytest.mark.browser
def test_hash_tree_draws_twins_as_one_node(browser, tiny_model, tmp_path):  # noqa: F811
    from paged_kv_lab.content import BY_ID
    from paged_kv_lab.player import run_payload, static_html
    from paged_kv_lab.run.engine import Engine
    from paged_kv_lab.store.timeline import lesson_scenario

    model = tiny_model
    engine = Engine(
        lesson_scenario(BY_ID["onehash"], model.num_layers, model=model.name, device="cpu"),
        model=model,
    )
    initial = engine.snapshot()
    records = engine.run()
    step = next(r.step for r in records if any(len(v) > 1 for v in r.snapshot.hash_map.values()))
    snap = records[step - 1].snapshot
    path = tmp_path / "onehash.html"
    path.write_text(static_html(run_payload(initial, records)))
    page = browser.new_page()
    page.goto(path.as_uri())
    page.wait_for_selector(".pkv[data-total]", timeout=30_000)
    page.keyboard.press("Home")
    for _ in range(step):
        page.keyboard.press("ArrowRight")
    wait_step(page, step)
    nodes = page.locator(".pkv-chains .pkv-node").evaluate_all(
        "els => els.map(e => [e.querySelector('code').textContent,"
        " Array.from(e.querySelectorAll(':scope > .pkv-chip')).map(c => Number(c.dataset.block))])"
    )
    drawn = {h: sorted(ids) for h, ids in nodes}
    assert len(drawn) == len(nodes), "each hash is drawn once"
    want = {"#" + key[:8]: sorted(ids) for key, ids in snap.hash_map.items()}
    assert drawn == want
    assert any(len(ids) == 2 for ids in drawn.values())
    page.close()
