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


def test_playground_offers_vllm_034s_settings_with_vllms_names_and_defaults():
    """vLLM 0.34's scheduler settings: cache-aware admission's window (0) and threshold (0.5),
    the cap on in-flight KV loads (none: 0 in the form); applied, they reach the run's
    scenario, and 0 writes null again."""
    at = app("playground")
    Browser(at, "playground").show(1)
    window = at.number_input(key="pg_cache_aware_admission_window")
    threshold = at.number_input(key="pg_cache_aware_admission_threshold")
    loads = at.number_input(key="pg_max_num_inflight_kv_loads")
    assert (window.label, threshold.label, loads.label) == (
        "cache_aware_admission_window",
        "cache_aware_admission_threshold",
        "max_num_inflight_kv_loads",
    )
    assert (window.value, threshold.value, loads.value) == (0, 0.5, 0)
    assert "vLLM 0.34" in window.help and "vLLM 0.34" in loads.help
    window.set_value(4)
    threshold.set_value(0.25)
    loads.set_value(2)
    at.button(key="FormSubmitter:settings:playground-Apply settings").click().run()
    assert not at.exception and not at.error
    run = at.session_state["lesson:playground"].run
    e = run.scenario.engine
    assert (
        e.cache_aware_admission_window,
        e.cache_aware_admission_threshold,
        e.max_num_inflight_kv_loads,
    ) == (4, 0.25, 2)
    at.number_input(key="pg_max_num_inflight_kv_loads").set_value(0)
    at.button(key="FormSubmitter:settings:playground-Apply settings").click().run()
    assert (
        at.session_state["lesson:playground"].run.scenario.engine.max_num_inflight_kv_loads is None
    )


def test_playground_says_the_extensible_kv_cache_is_off_for_a_stated_pool():
    """vLLM 0.34's enable_extensible_kv_cache by its name and default: the playground's pool is a
    stated num_gpu_blocks (vLLM's num_gpu_blocks_override), so vLLM resolves it off."""
    at = app("playground")
    Browser(at, "playground").show(1)
    blocks = at.session_state["lesson:playground"].run.scenario.engine.num_gpu_blocks
    told = [c.value for c in at.caption if "enable_extensible_kv_cache" in c.value]
    assert len(told) == 1 and "false" in told[0] and "(None)" in told[0]
    assert f"num_gpu_blocks {blocks} is stated" in told[0] and "0.92" in told[0]
