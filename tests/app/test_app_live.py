"""AppTest: the Live vLLM page against a local publisher replaying vLLM 0.33 recordings."""

import os
import time

import pytest
import zmq
from streamlit.testing.v1 import AppTest

from paged_kv_lab.ui import live_page
from support.app import open_page
from support.kv_pub import ScriptedPublisher, fixture, wait_for
from support.paths import ROOT


def _page():
    from paged_kv_lab.ui.live_page import render_live_page

    render_live_page()


@pytest.fixture
def publisher():
    ctx = zmq.Context()
    pub = ScriptedPublisher(ctx)
    yield pub
    pub.close()
    ctx.destroy(linger=0)


def button(at, label):
    return next(b for b in at.button if b.label == label)


def connect(at, pub):
    at.text_input(key="live:endpoint").set_value(pub.endpoint)
    at.text_input(key="live:replay").set_value(pub.replay_endpoint)
    at.text_input(key="live:topic").set_value("kv-events")
    button(at, "Connect").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return live_page.get_watcher(at.session_state["live:key"])


def test_live_page_shows_the_remote_cache_counts_garbage_and_answers_would_it_hit(publisher):
    expected, frames = fixture("eviction")
    at = AppTest.from_function(_page, default_timeout=30).run()
    assert not at.exception and any("Not connected" in i.value for i in at.info)
    w = connect(at, publisher)
    try:
        assert w is not None and w.connected.wait(5)
        time.sleep(0.3)
        publisher.send_raw([b"kv-events", b"two frames only"])
        publisher.send_raw([b"kv-events", os.urandom(3), b"bad seq"])
        for topic, seq, payload in frames[:5]:
            publisher.send(topic, seq, payload)
        publisher.send("kv-events", 5, b"\x93" + b"\x00" * (9 << 20))  # over the 8 MiB payload cap
        for topic, seq, payload in frames[6:]:
            publisher.send(topic, seq, payload)
        assert wait_for(lambda: w.snapshot().stats.batches >= len(frames) - 1, 15)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        status = " ".join(m.value for m in at.markdown)
        assert f"{len(frames) - 1} batches" in status
        st = w.snapshot().stats
        assert st.garbage_messages >= 2 and st.oversized_messages == 1
        assert f"{st.garbage_messages + st.oversized_messages} bad messages skipped" in status
        assert at.get("plotly_chart"), "no pictures"
        # the lost seq 5 came before the reset
        assert w.snapshot().ranks[0].state == expected["final_state"]
        # Would E7's prompt hit? Both of its full blocks are cached (hashed with seed "0", as
        # recorded).
        e7 = next(op for op in expected["ops"] if op.get("req") == "E7")["tokens"]
        at.text_input(key="live:ids").set_value(", ".join(map(str, e7)))
        at.number_input(key="live:block_size").set_value(4)
        at.text_input(key="live:seed").set_value("0")
        button(at, "Check").click().run()
        assert not at.exception, [e.value for e in at.exception]
        assert any("2 of 2 leading full blocks" in s.value for s in at.success)
        at.text_input(key="live:seed").set_value("vllm-none-hash")
        button(at, "Check").click().run()
        assert any("0 of 2 leading full blocks" in s.value for s in at.success)
        # Chinese labels too.
        at.session_state["lang"] = "zh"
        at.run()
        assert not at.exception and any("实时 vLLM" in t.value for t in at.title)
        at.session_state["lang"] = "en"
        at.run()
        button(at, "Disconnect").click().run()
        assert wait_for(lambda: not w.running, 5)
        assert live_page.get_watcher(("x",)) is None
    finally:
        w.stop()


def test_live_page_names_a_bad_endpoint_and_stays_up():
    at = AppTest.from_function(_page, default_timeout=30).run()
    at.text_input(key="live:endpoint").set_value("http://example.com/<script>")
    button(at, "Connect").click().run()
    assert not at.exception
    assert any("Event endpoint" in e.value and "tcp://HOST:PORT" in e.value for e in at.error)
    at.text_input(key="live:endpoint").set_value("tcp://10.1.2.3:5557")
    at.checkbox(key="live:bind").check()
    button(at, "Connect").click().run()
    assert any("Bind needs a local address" in e.value for e in at.error)
    at.checkbox(key="live:bind").uncheck()
    button(at, "Connect").click().run()
    assert any(
        "may watch only" in e.value
        and "PAGED_KV_LAB_WATCH_HOSTS" in e.value
        and "10.1.2.3" in e.value
        for e in at.error
    ), "a shared server connects only to allowed hosts"
    at.text_input(key="live:ids").set_value("1, two, 3")
    button(at, "Check").click().run()
    assert any("Token ids must be integers" in e.value for e in at.error)


def test_live_page_is_in_the_navigation_and_opens_from_the_app(monkeypatch):
    monkeypatch.setenv("PAGED_KV_LAB_MODEL", "tiny-random")
    monkeypatch.setenv("PAGED_KV_LAB_DEVICE", "cpu")
    at = AppTest.from_file(
        str(ROOT / "paged_kv_lab" / "streamlit_app.py"),
        default_timeout=180,
    ).run()
    assert not at.exception, [e.value for e in at.exception]
    open_page(at, "live").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Live vLLM" in t.value for t in at.title)


def test_tree_and_longest_prefixes_follow_the_hash_chains_and_never_pass_markup():
    from kvcore.distributed import kv_events as ke
    from paged_kv_lab.watch.prefix_index import PrefixCacheIndex

    expected, frames = fixture("shared_prefix")
    index = PrefixCacheIndex()
    for _, _, payload in frames:
        for ev in ke.decode_batch(payload).events:
            index.apply(ev)
    entries = index.tiers[("GPU", "0")]
    depth = live_page.chain_depths(entries)
    assert max(depth.values()) == 4  # 16-token blocks: A, B, C, D reach block 3
    fig = live_page.tree_figure(entries, lambda ids: "<b>hi</b><script>", "en")
    trace = fig.data[0]
    assert len(trace.ids) == len(entries) + 1 and not any(
        "<" in x for x in trace.labels + trace.hovertext
    )
    rows = live_page.longest_prefixes(entries, None)
    assert rows[0]["blocks"] == 4 and rows[0]["tokens"] == 64 and len(rows) == 4


def test_watch_hosts_are_loopback_unless_the_server_allows_more(monkeypatch):
    from paged_kv_lab.ui.live_page import check_endpoints

    monkeypatch.delenv("PAGED_KV_LAB_WATCH_HOSTS", raising=False)
    assert check_endpoints("tcp://127.0.0.1:5557", "tcp://[::1]:5558", False, "en") is None
    assert "may watch only" in check_endpoints(
        "tcp://127.0.0.1:5557", "tcp://vllm-a:5558", False, "en"
    )
    monkeypatch.setenv("PAGED_KV_LAB_WATCH_HOSTS", "vllm-a, 10.0.0.5")
    assert check_endpoints("tcp://10.0.0.5:5557", "tcp://vllm-a:5558", False, "en") is None
    assert "vllm-b" in check_endpoints("tcp://vllm-b:5557", "", False, "zh")
    monkeypatch.setenv("PAGED_KV_LAB_WATCH_HOSTS", "*")
    assert check_endpoints("tcp://vllm-b:5557", "", False, "en") is None
