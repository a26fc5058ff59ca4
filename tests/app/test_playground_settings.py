"""The playground's settings form offers vLLM's settings and applies them to the run (AppTest)."""

from support.app import Browser, app


def test_playground_applies_the_vllm_settings():
    at = app("playground")
    Browser(at, "playground").show(1)
    assert "xxhash_cbor" in at.selectbox(key="pg_hash_algo").options
    at.selectbox(key="pg_hash_algo").set_value("sha256_cbor")
    at.number_input(key="pg_watermark").set_value(0.1)
    at.number_input(key="pg_max_cache_hit_length").set_value(8)
    at.number_input(key="pg_prefix_cache_retention_interval").set_value(-1)
    at.text_input(key="pg_hash_seed").set_value("0")
    at.button(key="FormSubmitter:settings:playground-Apply settings").click().run()
    assert not at.exception and not at.error
    e = at.session_state["lesson:playground"].run.scenario.engine
    assert (
        e.hash_algo,
        e.watermark,
        e.max_cache_hit_length,
        e.prefix_cache_retention_interval,
        e.hash_seed,
    ) == ("sha256_cbor", 0.1, 8, None, "0")
    at.text_input(key="pg_hash_seed").set_value("")
    at.number_input(key="pg_max_cache_hit_length").set_value(-1)
    at.button(key="FormSubmitter:settings:playground-Apply settings").click().run()
    e = at.session_state["lesson:playground"].run.scenario.engine
    assert e.hash_seed is None and e.max_cache_hit_length is None
