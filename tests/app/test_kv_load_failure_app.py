"""Lesson 10's failed-load switch in the app (AppTest, tiny model): D's first load from the CPU
fails under the chosen ``kv_load_failure_policy``, the switch is kept in the URL, and the
evict_blocks myth's live line counts the failed load."""

from support.app import Browser, app
from support.kv import events_of


def test_lesson_10s_switch_makes_ds_load_fail_and_the_myth_counts_it():
    at = app("secondtier")
    at.segmented_control(key="tg:secondtier:failed_load").set_value("D:recompute").run()
    assert not at.exception
    tier = at.session_state["lesson:secondtier"].run.scenario.engine.cpu_offload
    assert (tier.fail_loads, tier.kv_load_failure_policy) == (("D",), "recompute")
    assert at.query_params.get("failed_load") in ("D:recompute", ["D:recompute"])
    b = Browser(at, "secondtier")
    b.until_recorded(1 << 30)
    b.show(len(b.steps))
    assert not at.exception
    run = at.session_state["lesson:secondtier"].run
    (failed,) = events_of(run.records, "kv_load_failed", "D")
    assert failed.asynchronous and failed.policy == "recompute"
    at.session_state["myths_open:secondtier"] = True  # open the myths' expander
    at.run()
    text = "\n".join(m.value for m in at.markdown)
    assert "A KV connector reported 1 failed loads (the first: D at step" in text, text[-3000:]
