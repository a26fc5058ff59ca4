"""The CPU tier in the app (AppTest): the playground sets engine.cpu_offload and the page shows the
hit split by tier under the player; a bad CPU pool is refused by name."""

from support.app import Browser, app

APPLY = "FormSubmitter:settings:playground-Apply settings"


def test_playground_turns_the_cpu_tier_on_and_off():
    at = app("playground")
    Browser(at, "playground").show(1)
    assert at.number_input(key="pg_num_cpu_blocks").value == 0  # off by default
    at.number_input(key="pg_num_cpu_blocks").set_value(16)
    at.checkbox(key="pg_lazy_offload").check()
    at.button(key=APPLY).click().run()
    assert not at.exception and not at.error
    run = at.session_state["lesson:playground"].run
    tier = run.scenario.engine.cpu_offload
    assert (tier.num_cpu_blocks, tier.lazy_offload) == (16, True)
    assert run.snapshot.cpu_pool is not None and run.snapshot.cpu_pool.num_blocks == 16
    assert any("time to first token" in m.value for m in at.markdown)
    at.number_input(key="pg_num_cpu_blocks").set_value(1)  # its null block alone: refused
    at.button(key=APPLY).click().run()
    assert not at.exception
    assert any("cpu_offload.num_cpu_blocks" in e.value for e in at.error)
    at.number_input(key="pg_num_cpu_blocks").set_value(0)
    at.button(key=APPLY).click().run()
    assert at.session_state["lesson:playground"].run.scenario.engine.cpu_offload is None


def test_the_second_tier_page_shows_the_tier_table():
    at = app("secondtier")
    b = Browser(at, "secondtier")
    b.until_recorded(1 << 30)
    b.show(len(b.steps))
    assert not at.exception
    text = "\n".join(m.value for m in at.markdown)
    assert "| D | CPU hit | " in text and "| C | GPU hit | " in text and "| A | miss | " in text
