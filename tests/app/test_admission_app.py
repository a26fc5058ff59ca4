"""The cache-aware admission lesson in the app (AppTest, tiny model): it opens, its window switch
reruns it with the window on, the table under the player shows both runs side by side, and the
"why?" panel answers "why was B admitted before A?" with the window, threshold and usage."""

import time

from support.app import Browser, app


def test_the_lesson_opens_and_shows_both_runs_side_by_side():
    at = app("admission")
    assert not at.exception
    at.segmented_control(key="tg:admission:cache_aware_admission_window").set_value(4).run()
    assert not at.exception
    assert (
        at.session_state["lesson:admission"].run.scenario.engine.cache_aware_admission_window == 4
    )
    for _ in range(240):  # the other run is computed in the background; the table polls
        frames = [d for d in at.table if "admission order" in d.value.columns]
        if frames:
            break
        time.sleep(0.5)
        at.run(timeout=30)
    assert frames, [i.value for i in at.info]
    (frame,) = frames
    df = frame.value
    runs = list(df.index)
    assert runs == ["cache_aware_admission_window = 0", "cache_aware_admission_window = 4 (shown)"]
    order = list(df["admission order"])
    assert order[0].index("C") < order[0].index("A2")
    assert order[1].index("A2") < order[1].index("C")
    assert list(df["A2: hit tokens"]) == [0, 16]
    assert list(df["C: waiting steps"])[1] > 0 and list(df["A2: waiting steps"])[1] == 0


def test_why_was_b_admitted_before_a():
    at = app("admission")
    at.segmented_control(key="tg:admission:cache_aware_admission_window").set_value(4).run()
    b = Browser(at, "admission")
    b.until_recorded(1 << 30)
    b.show(len(b.steps))
    at.toggle(key="why_open:admission").set_value(True).run()
    at.radio(key="why_mode:admission").set_value("order").run()
    assert not at.exception
    at.selectbox(key="why_ob:admission").set_value("A2").run()
    at.selectbox(key="why_oa:admission").set_value("C").run()
    text = "\n".join(m.value for m in at.markdown).replace("\\", "")  # markdown escapes
    assert "cache-aware admission moved it ahead" in text, text[-2000:]
    assert "cache_aware_admission_threshold 0.50" in text


def test_the_pd_lessons_inflight_switch_reruns_it_with_the_setting():
    at = app("pd")
    at.segmented_control(key="tg:pd:max_num_inflight_kv_loads").set_value(1).run()
    assert not at.exception
    assert at.session_state["lesson:pd"].run.scenario.engine.max_num_inflight_kv_loads == 1
    b = Browser(at, "pd")
    b.until_recorded(1 << 30)
    b.show(len(b.steps))
    assert not at.exception
    run = at.session_state["lesson:pd"].run
    pulls = [r for r in run.records if "B" in r.pulls]
    assert pulls and pulls[0].snapshot.running == ("A",)
