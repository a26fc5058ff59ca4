"""Lesson 1's "How many blocks?": the loaded model's profile and vLLM's num_gpu_blocks arithmetic,
under AppTest on the tiny model; the figures equal KVCacheSizing computed independently."""

from kvcore.model.memory import DEFAULT_BLOCK_SIZE, num_gpu_blocks_from_profile
from paged_kv_lab.ui import how_many_blocks as H
from support.app import app


def metric(at, label):
    return next(m.value for m in at.metric if m.label == label)


def test_profile_then_sliders_give_vllms_num_gpu_blocks(tiny):  # noqa: F811
    H.PROFILES.clear()
    at = app("blocks")
    button = next(b for b in at.button if b.key == "hmb_profile:blocks")
    button.click().run()
    assert not at.exception, [e.value for e in at.exception]
    profile = H.profiled(tiny)
    assert profile is not None and profile.weights_memory > 0 and profile.peak_activation_memory > 0
    assert profile.max_num_batched_tokens == H.PROFILE_TOKENS

    def expected(util, bs, mml, extensible=None):
        return num_gpu_blocks_from_profile(
            profile, tiny.config, bs, "float32", util, mml, enable_extensible_kv_cache=extensible
        )

    max_len = (
        H.MAX_MODEL_LENS[-1]
        if tiny.config.max_position_embeddings >= 8192
        else at.select_slider(key="hmb_len:blocks").value
    )
    # the block size starts where vLLM 0.34 starts without --block-size on a GPU
    assert at.select_slider(key="hmb_bs:blocks").value == DEFAULT_BLOCK_SIZE
    # vLLM 0.34's defaults: both settings unset, so the extensible KV cache sizes the pool from
    # the memory the profile measured free after the model's warm-up, at utilization 1.0
    assert at.selectbox(key="hmb_ext:blocks").value is None
    s = expected(None, DEFAULT_BLOCK_SIZE, max_len)
    assert s.sizing_path == "measured" and s.gpu_memory_utilization == 1.0
    first = s
    assert metric(at, "num_gpu_blocks") == f"{s.num_gpu_blocks:,}"
    assert metric(at, "max concurrency") == f"{s.max_concurrency:,.2f}"
    assert any("= num_gpu_blocks" in c.value for c in at.code)
    told = [c.value for c in at.caption]
    assert any("enable_extensible_kv_cache: true" in c for c in told)
    assert any(
        f"num_gpu_blocks {s.num_gpu_blocks:,} comes from the memory measured" in c for c in told
    )

    # off: the profiling estimate, at 0.92 unless stated
    at.selectbox(key="hmb_ext:blocks").set_value(False).run()
    off = expected(None, DEFAULT_BLOCK_SIZE, max_len, False)
    assert off.gpu_memory_utilization == 0.92
    assert metric(at, "num_gpu_blocks") == f"{off.num_gpu_blocks:,}"
    assert any("comes from the profiling estimate" in c.value for c in at.caption)

    at.checkbox(key="hmb_util_on:blocks").check().run()
    at.slider(key="hmb_util:blocks").set_value(0.9).run()
    s = expected(0.9, DEFAULT_BLOCK_SIZE, max_len, False)
    assert metric(at, "num_gpu_blocks") == f"{s.num_gpu_blocks:,}"
    at.slider(key="hmb_util:blocks").set_value(0.5).run()
    at.select_slider(key="hmb_bs:blocks").set_value(128).run()
    at.select_slider(key="hmb_len:blocks").set_value(1024).run()
    s2 = expected(0.5, 128, 1024, False)
    assert s2.num_gpu_blocks < s.num_gpu_blocks
    assert metric(at, "num_gpu_blocks") == f"{s2.num_gpu_blocks:,}"
    assert metric(at, "max concurrency") == f"{s2.max_concurrency:,.2f}"

    # a second session sees the shared profile at once, in Chinese, without profiling again
    at2 = app("blocks")
    at2.session_state["lang"] = "zh"
    at2.session_state["_prefs"] = {**at2.session_state["_prefs"], "lang": "zh"}
    at2.run()
    assert not any(b.key == "hmb_profile:blocks" for b in at2.button)
    assert metric(at2, "最大并发") == f"{first.max_concurrency:,.2f}"
    assert any("预热后测得的空闲内存" in c.value for c in at2.caption)
    assert H.profiled(tiny) is profile
