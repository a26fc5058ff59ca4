"""The hybrid KV cache manager switched off (vLLM 0.34.0's ``disable_hybrid_kv_cache_manager``):
the rule that decides it (kvcore/config/vllm.py), the connectors that support it
(kvcore/distributed/kv_transfer/kv_connector/factory.py), the unify step
(kvcore/core/kv_cache_utils.py) and what the engine then does: one full-attention group whose
sliding-window layers keep every block. tests/differential/test_hybrid_kv_cache_manager_vllm.py
holds the connectors and the unify step against vLLM's own functions."""

import pytest

from kvcore.config.scheduler import SchedulerConfig
from kvcore.config.vllm import resolve_disable_hybrid_kv_cache_manager
from kvcore.core.kv_cache_planning import unify_hybrid_kv_cache_specs
from kvcore.distributed.kv_transfer.kv_connector.factory import (
    NAMED_ONLY_CONNECTORS,
    KVConnectorFactory,
)
from kvcore.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from kvcore.kv_cache_interface import mamba as mamba_group
from paged_kv_lab.run.engine import (
    EngineRefused,
    hybrid_kv_cache_manager_off,
    kv_cache_groups,
    kv_connector_name,
)
from paged_kv_lab.run.scenario import CPUOffloadConfig, EngineSettings
from support.kv import events_of, make_engine, spec

MIX = ("full_attention", "sliding_attention") * 2


def test_the_flag_is_vllms_and_unset_by_default():
    assert SchedulerConfig().disable_hybrid_kv_cache_manager is None
    assert EngineSettings().disable_hybrid_kv_cache_manager is None


@pytest.mark.parametrize(
    "flag, connector, off",
    [
        (None, None, False),  # no kv_transfer_config: on
        (None, "LMCacheConnectorV1", True),  # a connector without SupportsHMA: off
        (None, "FlexKVConnectorV1", True),
        (None, "OffloadingConnector", False),  # one that declares it: on
        (None, "SimpleCPUOffloadConnector", False),
        (None, "NixlConnector", False),
        (True, None, True),  # set: respected
        (True, "OffloadingConnector", True),
        (False, "LMCacheConnectorV1", False),  # forced on: vLLM skips the connector check
    ],
)
def test_vllms_rule(flag, connector, off):
    assert resolve_disable_hybrid_kv_cache_manager(flag, connector) is off


def test_connectors_the_lab_runs_answer_from_their_class():
    assert KVConnectorFactory.supports_hma_config("SimpleCPUOffloadConnector")
    assert KVConnectorFactory.supports_hma_config("NixlPullConnector")
    assert KVConnectorFactory.get_connector_class("LMCacheConnectorV1") is None
    with pytest.raises(ValueError, match="Unsupported connector"):
        KVConnectorFactory.supports_hma_config("NoSuchConnector")
    # a MultiConnector: every child must support it, and it needs one
    assert KVConnectorFactory.supports_hma_config("MultiConnector", ["OffloadingConnector"])
    assert not KVConnectorFactory.supports_hma_config(
        "MultiConnector", ["OffloadingConnector", "LMCacheConnectorV1"]
    )
    assert not KVConnectorFactory.supports_hma_config("MultiConnector", [])
    assert "LMCacheConnectorV1" in NAMED_ONLY_CONNECTORS
    assert "SimpleCPUOffloadConnector" not in NAMED_ONLY_CONNECTORS


def test_unify_turns_sliding_layers_into_full_attention_only_beside_full_ones():
    mixed = {"a": FullAttentionSpec(4), "b": SlidingWindowSpec(4, 8)}
    unify_hybrid_kv_cache_specs(mixed)
    assert mixed == {"a": FullAttentionSpec(4), "b": FullAttentionSpec(4)}
    sliding = {"a": SlidingWindowSpec(4, 8), "b": SlidingWindowSpec(4, 8)}
    unify_hybrid_kv_cache_specs(sliding)
    assert all(isinstance(s, SlidingWindowSpec) for s in sliding.values())
    state = mamba_group(4).kv_cache_spec
    with pytest.raises(ValueError, match="unified type"):  # a Mamba layer cannot be promoted
        unify_hybrid_kv_cache_specs({"a": FullAttentionSpec(4), "m": state})
    only_state = {"m": state, "n": state}
    unify_hybrid_kv_cache_specs(only_state)
    assert only_state == {"m": state, "n": state}
    with pytest.raises(ValueError, match="unified type"):
        unify_hybrid_kv_cache_specs({"a": SlidingWindowSpec(4, 8), "b": SlidingWindowSpec(4, 16)})


def test_the_engine_groups_every_layer_as_full_attention_when_it_is_off():
    s = EngineSettings(sliding_window=8, layer_types=MIX, kv_connector="LMCacheConnectorV1")
    assert hybrid_kv_cache_manager_off(s, 4)
    groups, layer_group = kv_cache_groups(s, 4, True)
    assert [g.kind for g in groups] == ["full"] and layer_group == [0, 0, 0, 0]
    assert len(groups[0].layer_names) == 4
    on = EngineSettings(sliding_window=8, layer_types=MIX, kv_connector="OffloadingConnector")
    assert not hybrid_kv_cache_manager_off(on, 4)
    assert [g.kind for g in kv_cache_groups(on, 4)[0]] == ["full", "sliding"]


def test_refusals():
    forced = EngineSettings(
        sliding_window=8,
        layer_types=MIX,
        kv_connector="LMCacheConnectorV1",
        disable_hybrid_kv_cache_manager=False,
    )
    with pytest.raises(EngineRefused, match="asserts there is one group"):
        hybrid_kv_cache_manager_off(forced, 4)
    # forced on with one group only (no sliding layer): nothing to assert about
    plain = EngineSettings(kv_connector="LMCacheConnectorV1", disable_hybrid_kv_cache_manager=False)
    assert not hybrid_kv_cache_manager_off(plain, 2)
    linear = EngineSettings(
        layer_types=("linear_attention", "full_attention"), disable_hybrid_kv_cache_manager=True
    )
    with pytest.raises(EngineRefused, match="stops at startup"):
        kv_cache_groups(linear, 2, True)
    both = EngineSettings(kv_connector="LMCacheConnectorV1", cpu_offload=CPUOffloadConfig())
    with pytest.raises(EngineRefused, match="MultiConnector"):
        kv_connector_name(both)
    assert kv_connector_name(EngineSettings(cpu_offload=CPUOffloadConfig())) == (
        "SimpleCPUOffloadConnector"
    )


def test_a_sliding_layer_keeps_every_block_when_it_is_off():
    prompt = spec("A", range(1, 33), max_tokens=4)
    kw = dict(sliding_window=8, layer_types=MIX, num_gpu_blocks=64)
    on = make_engine([prompt], kv_connector="OffloadingConnector", **kw)
    off = make_engine([prompt], kv_connector="LMCacheConnectorV1", **kw)
    held = {}
    for name, eng in (("on", on), ("off", off)):
        records = [eng.step() for _ in range(3)]
        held[name] = (records, eng.kv_cache_manager.num_kv_cache_groups)
        snap = records[-1].snapshot
        table = snap.request("A").block_tables
        held[name] += (sum(1 for t in table for b in t if b),)
    assert held["on"][1] == 2 and held["off"][1] == 1
    assert events_of(held["on"][0], "window_skipped", "A")
    assert not events_of(held["off"][0], "window_skipped")
    # 34 tokens in 4-token blocks: 9 blocks in the one group; with the manager on, 9 in the
    # full-attention group and only the window's in the sliding one
    assert held["off"][2] == 9 and 9 < held["on"][2] < 18


def test_auto_sizes_a_block_by_the_largest_group():
    """num_gpu_blocks "auto" as vLLM 0.34.0 divides the KV memory: a block is a page for each
    layer of the largest group (four layers with the manager off, two with it on here), and the
    maximum concurrency counts each group's blocks for one request."""
    from kvcore.model.loader import tiny_random_config
    from kvcore.model.memory import MemoryProfile, num_gpu_blocks_from_profile

    profile = MemoryProfile("cpu", "tiny-random", "float32", 16, 1 << 30, 0, 0, 0)
    args = (profile, tiny_random_config(), 4, "float32", 0.9, 64)
    off = num_gpu_blocks_from_profile(*args, environ={}, kv_cache_memory_bytes=65536)
    on = num_gpu_blocks_from_profile(
        *args,
        environ={},
        kv_cache_memory_bytes=65536,
        layers_per_block=2,
        group_blocks_per_request=16 + 7,  # the full group's 64 tokens + the window's blocks
    )
    assert (off.num_gpu_blocks, on.num_gpu_blocks) == (16, 32)
    assert off.max_concurrency == 16 / 16 and on.max_concurrency == 32 / 23
    assert "23 (blocks of the KV cache groups)" in "\n".join(on.lines())
