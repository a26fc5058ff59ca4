"""Engine: a scenario run step by step through kvcore's EngineCore, every step recorded.

It builds the KV cache groups, the KVCacheManager, the Scheduler and the EngineCore from the
scenario's engine settings, adds each request at its arrival step, attaches a Recorder, and
after every ``EngineCore.step`` takes a Snapshot and publishes the KV events.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from dataclasses import replace
from typing import Callable, Optional

from kvcore.config.kv_events import KVEventsConfig
from kvcore.config.lora import LoRAConfig
from kvcore.config.scheduler import SchedulerConfig
from kvcore.config.speculative import (
    SpeculativeConfig as VllmSpeculativeConfig,
)
from kvcore.config.vllm import (
    resolve_disable_hybrid_kv_cache_manager,
    resolve_num_hash_lookahead_tokens,
)
from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.kv_cache_planning import uniform_page_group_size, unify_hybrid_kv_cache_specs
from kvcore.core.kv_cache_utils import (
    RequestBlockHasher,
    get_request_block_hasher,
    resolve_none_hash_seed,
)
from kvcore.core.sched.scheduler import Scheduler, use_eagle_block_drop
from kvcore.distributed.kv_events import KVEventBatch, ZmqEventPublisher
from kvcore.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from kvcore.engine.core import EngineCore
from kvcore.engine.detokenizer import IncrementalDetokenizer
from kvcore.engine.parallel_sampling import ParentRequest, fan_out, group_outputs, parent_groups
from kvcore.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcore.lora.request import LoRARequest
from kvcore.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from kvcore.request import Request, RequestStatus
from kvcore.utils.hashing import get_hash_fn_by_name
from kvcore.utils.math_utils import cdiv
from kvcore.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
from kvcore.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator
from kvcore.worker.gpu.spec_decode.standalone_ar.speculator import StandaloneARSpeculator
from paged_kv_lab.recording import snapshot
from paged_kv_lab.recording.invariants import check_invariants
from paged_kv_lab.recording.recorder import Recorder
from paged_kv_lab.recording.snapshot import take_snapshot
from paged_kv_lab.run.scenario import (
    EmbedsSource,
    EngineSettings,
    RequestSpec,
    Scenario,
    prompt_text,
)
from paged_kv_lab.text.i18n import Refusal


class EngineRefused(Refusal):
    """Settings or a request the engine cannot take (a prompt that never fits, a pool with no
    room, ...): the catalogue sentence "problem.<key>"."""


def kv_cache_groups(
    settings: EngineSettings, num_layers: int, hma_off: bool = False
) -> tuple[list[KVCacheGroupSpec], list[int]]:
    """KV cache groups and, per decoder layer, the group it reads.

    No window: one full-attention group. A window without layer_types: every layer
    slides, one sliding group. A mix: group 0 = full layers, group 1 = sliding layers.
    With linear-attention layers, vLLM's rule (``linear_attention_groups``). ``hma_off`` (the
    hybrid KV cache manager off): the layers' specs are first made one kind as vLLM makes them
    (``unify_hybrid_kv_cache_specs``), so a mix is one full-attention group of every layer.
    """
    W = settings.sliding_window
    types = layer_types_of(settings, num_layers)
    if settings.sliding_block_multiple != 1 and (
        hma_off or set(types) != {"full_attention", "sliding_attention"}
    ):
        # the multiple is the ratio of two kinds' pages: it needs both kinds, in two groups
        raise EngineRefused("engine.sliding_block_multiple_unsupported")
    if "linear_attention" in types:
        if hma_off:
            raise EngineRefused("engine.hma_off_linear")
        return linear_attention_groups(settings, types)
    bs = settings.block_size
    sliding_bs = bs * settings.sliding_block_multiple
    specs = {
        f"layers.{i}": FullAttentionSpec(bs)
        if t == "full_attention"
        else SlidingWindowSpec(sliding_bs, W)
        for i, t in enumerate(types)
    }
    if hma_off:
        unify_hybrid_kv_cache_specs(specs)
    kinds = sorted({s_.kind for s_ in specs.values()}, key=lambda k: k != "full")
    layer_kind = [specs[f"layers.{i}"].kind for i in range(len(types))]
    groups = [
        KVCacheGroupSpec(
            tuple(name for name, s_ in specs.items() if s_.kind == k),
            next(s_ for s_ in specs.values() if s_.kind == k),
        )
        for k in kinds
    ]
    return groups, [kinds.index(k) for k in layer_kind]


def layer_types_of(settings: EngineSettings, num_layers: int) -> tuple[str, ...]:
    """Each decoder layer's kind: ``layer_types``, or every layer sliding when there is a window
    (full attention when there is none); refused when the list does not fit the model."""
    W = settings.sliding_window
    types = settings.layer_types
    if types is None:
        types = ("sliding_attention" if W else "full_attention",) * num_layers
    if len(types) != num_layers:
        raise EngineRefused("engine.layer_count", listed=len(types), layers=num_layers)
    return tuple(types)


def kv_connector_name(s: EngineSettings) -> Optional[str]:
    """The connector vLLM's kv_transfer_config would name for these settings: the CPU tier's
    (SimpleCPUOffloadConnector), the P/D pair's (NixlConnector), or ``engine.kv_connector``;
    None: no connector. Refused when kv_connector names a second one."""
    own = {"cpu_offload": "SimpleCPUOffloadConnector", "kv_transfer": "NixlConnector"}
    given = [(k, name) for k, name in own.items() if getattr(s, k) is not None]
    if s.kv_connector is not None:
        if given:
            raise EngineRefused("engine.connector_twice", other=given[0][0])
        return s.kv_connector
    return given[0][1] if given else None


def hybrid_kv_cache_manager_off(s: EngineSettings, num_layers: int) -> bool:
    """``disable_hybrid_kv_cache_manager`` as vLLM 0.34.0 resolves it for these settings
    (kvcore/config/vllm.py). Refused where vLLM would start with the manager on under a
    connector without SupportsHMA and several KV cache groups: its scheduler asserts one group
    when a request finishes."""
    connector = kv_connector_name(s)
    off = resolve_disable_hybrid_kv_cache_manager(s.disable_hybrid_kv_cache_manager, connector)
    if not off and connector is not None and not KVConnectorFactory.supports_hma_config(connector):
        groups, _ = kv_cache_groups(s, num_layers)
        if len(groups) > 1:
            raise EngineRefused("engine.hma_forced_on", connector=connector, groups=len(groups))
    return off


def linear_attention_groups(
    settings: EngineSettings, types: tuple[str, ...]
) -> tuple[list[KVCacheGroupSpec], list[int]]:
    """vLLM's grouping for a hybrid model (kv_cache_planning's uniform-page-size groups): one
    bucket per layer kind in order of first appearance, split so every group has as many
    layers as the smallest bucket (the largest, when no bucket is 1.5 times the smallest),
    group i of a bucket taking its layers i, i + n, ... So 3 linear per 1 full gives three
    state-block groups and one attention group. The linear layers' mamba_cache_mode is
    resolved as vLLM does: "align" with prefix caching, else "none"."""
    bs = settings.block_size
    mode = "align" if settings.enable_prefix_caching else "none"
    specs = {
        "full_attention": FullAttentionSpec(bs),
        "sliding_attention": SlidingWindowSpec(bs, settings.sliding_window or 1),
        "linear_attention": MambaSpec(
            bs, shapes=((1,),), dtypes=("float32",), mamba_cache_mode=mode
        ),
    }
    buckets: dict[str, list[int]] = {}
    for i, t in enumerate(types):
        buckets.setdefault(t, []).append(i)
    group_size = uniform_page_group_size([len(v) for v in buckets.values()])
    groups, layer_group = [], [0] * len(types)
    for kind, layers in buckets.items():
        n = cdiv(len(layers), group_size)
        for j in range(n):
            for layer in layers[j::n]:
                layer_group[layer] = len(groups)
            groups.append(KVCacheGroupSpec(tuple(f"layers.{i}" for i in layers[j::n]), specs[kind]))
    return groups, layer_group


def kv_cache_manager_for(
    s: EngineSettings, groups, max_model_len: int, enable_kv_cache_events: bool
) -> KVCacheManager:
    """The KVCacheManager the settings describe, over these KV cache groups."""
    return KVCacheManager(
        KVCacheConfig(s.num_gpu_blocks, tuple(groups), s.prefix_cache_retention_interval),
        max_model_len,
        s.enable_prefix_caching,
        s.max_num_batched_tokens,
        s.watermark,
        s.free_order,
        enable_kv_cache_events=enable_kv_cache_events,
        hash_block_size=s.prefix_match_unit,
        use_eagle=eagle_block_drop(s),
    )


EAGLE_METHODS = ("eagle", "mtp")  # the scenario's methods drafting from the target's hidden states


def speculative_config_for(s: EngineSettings) -> Optional[VllmSpeculativeConfig]:
    """The fields of vLLM's speculative_config kvcore reads, from the scenario's."""
    sp = s.speculative
    if sp is None:
        return None
    return VllmSpeculativeConfig(
        sp.method,
        sp.num_speculative_tokens,
        disable_eagle_block_drop=sp.disable_eagle_block_drop,
        disable_lookahead_block_hashes=sp.disable_lookahead_block_hashes,
    )


def eagle_block_drop(s: EngineSettings) -> bool:
    """Whether every prefix-cache hit gives up its last matched block, decided as vLLM 0.34.0
    decides it (kvcore/config/vllm.py: the lookahead, kvcore/core/sched/scheduler.py: the drop,
    where vLLM decides each). The CPU tier's connector (vLLM's
    SimpleCPUOffloadConnector) supports lookahead hashes, the P/D pull's (NixlConnector) does
    not; with no connector they follow prefix caching. Refused where vLLM would hash each block
    with the tokens after it: the lab does not model lookahead hashes."""
    sp = speculative_config_for(s)
    connector = None
    if s.kv_transfer is not None:
        connector = False
    elif s.cpu_offload is not None:
        connector = True
    lookahead = resolve_num_hash_lookahead_tokens(sp, s.enable_prefix_caching, connector)
    if lookahead:
        raise EngineRefused("engine.lookahead_block_hashes", method=repr(sp.method))
    return use_eagle_block_drop(sp, lookahead)


def scheduler_config_for(s: EngineSettings, max_model_len: int) -> SchedulerConfig:
    """vLLM's SchedulerConfig fields, from the scenario's engine settings."""
    return SchedulerConfig(
        max_num_seqs=s.max_num_seqs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        policy=s.policy,
        max_model_len=max_model_len,
        admission=s.admission,
        long_prefill_token_threshold=s.long_prefill_token_threshold,
        max_cache_hit_length=s.max_cache_hit_length,
        num_spec_tokens=s.speculative.num_speculative_tokens if s.speculative else 0,
        num_lookahead_tokens=num_lookahead_tokens(s.speculative),
        cache_aware_admission_window=s.cache_aware_admission_window,
        cache_aware_admission_threshold=s.cache_aware_admission_threshold,
        max_num_inflight_kv_loads=s.max_num_inflight_kv_loads,
    )


def num_lookahead_tokens(speculative) -> int:
    """vLLM's ``VllmConfig.num_lookahead_tokens``: a draft model or an EAGLE/MTP head writes K/V
    for up to ``num_speculative_tokens`` positions past the scheduled ones; the n-gram proposer
    for none."""
    if speculative is None or speculative.method not in ("draft_model",) + EAGLE_METHODS:
        return 0
    return speculative.num_speculative_tokens


def num_draft_layers(speculative, num_layers: int) -> int:
    """The draft model's depth: the setting, or three quarters of the target's layers (at least
    one: 22 of SmolLM2's 30, where early exit starts to guess right a third of the time; see
    docs/speculative-decoding.md); ValueError when the model has fewer layers than asked for."""
    asked = speculative.num_draft_layers
    if asked is None:
        return max(1, num_layers * 3 // 4)
    if asked > num_layers:
        raise EngineRefused("engine.draft_layers", asked=asked, layers=num_layers)
    return asked


def cpu_offload_connectors(s: EngineSettings, kv_cache_config, max_model_len: int):
    """(scheduler half, worker half) of SimpleCPUOffloadConnector for ``engine.cpu_offload``,
    or (None, None) when it is off; ValueError for settings it cannot serve."""
    cfg = s.cpu_offload
    if cfg is None:
        return None, None
    if not s.enable_prefix_caching:
        raise EngineRefused("engine.offload_needs_caching")
    if s.sliding_window is not None:
        raise EngineRefused("engine.offload_full_only")
    from kvcore.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from kvcore.distributed.kv_transfer.kv_connector.v1.simple_cpu_offload_connector import (
        SimpleCPUOffloadConnector,
    )

    def half(role):
        return SimpleCPUOffloadConnector(
            role,
            kv_cache_config,
            cfg.num_cpu_blocks,
            lazy_offload=cfg.lazy_offload,
            max_model_len=max_model_len,
            max_num_batched_tokens=s.max_num_batched_tokens,
            enable_kv_cache_events=True,
        )

    return half(KVConnectorRole.SCHEDULER), half(KVConnectorRole.WORKER)


def lora_config_for(s: EngineSettings) -> Optional[LoRAConfig]:
    """vLLM's LoRAConfig for ``engine.enable_lora``; None when LoRA is off."""
    if not s.enable_lora:
        return None
    return LoRAConfig(max_lora_rank=s.max_lora_rank, max_loras=s.max_loras)


def lora_requests_for(s: EngineSettings) -> dict[str, LoRARequest]:
    """Each adapter of ``engine.lora_modules`` by name, numbered from 1 in their order (as vLLM
    numbers the adapters it starts with)."""
    return {m.name: LoRARequest(m.name, i + 1, m.path) for i, m in enumerate(s.lora_modules)}


def block_hasher_for(s: EngineSettings) -> RequestBlockHasher:
    """Hashes requests' full blocks with the settings' algorithm and NONE_HASH seed."""
    fn = get_hash_fn_by_name(s.hash_algo)
    size = s.prefix_match_unit or s.block_size  # hashes every prefix_match_unit tokens
    return get_request_block_hasher(
        size, fn, none_hash_seed=resolve_none_hash_seed(s.hash_algo, s.hash_seed)
    )


def size_kv_cache(model, settings: EngineSettings):
    """``num_gpu_blocks: "auto"``: profile the loaded model and derive the pool as vLLM does
    (a :class:`kvcore.model.memory.KVCacheSizing`); ValueError when not even one usable block
    fits. For a model of attention layers only, one block holds a page for each layer of the
    largest KV cache group, as vLLM 0.34.0 sizes a block
    (``kv_cache_planning._get_kv_cache_bytes_per_block``): with full-attention and
    sliding-window layers, half as many layers per block while the hybrid KV cache manager
    keeps them in two groups."""
    from kvcore.model.memory import num_gpu_blocks_from_profile
    from kvcore.model.profile import profile_model

    max_model_len = settings.max_model_len or getattr(model.config, "max_position_embeddings", 8192)
    num_layers = int(model.config.num_hidden_layers)
    groups, _ = kv_cache_groups(
        settings, num_layers, hybrid_kv_cache_manager_off(settings, num_layers)
    )
    profile = profile_model(model, settings.max_num_batched_tokens, settings.block_size)
    sizing = num_gpu_blocks_from_profile(
        profile,
        model.config,
        settings.block_size,
        model.dtype,
        settings.gpu_memory_utilization,
        max_model_len,
        kv_cache_memory_bytes=settings.kv_cache_memory_bytes,
        layers_per_block=max(len(g.layer_names) for g in groups),
        group_blocks_per_request=sum(
            g.kv_cache_spec.max_admission_blocks_per_request(
                settings.max_num_batched_tokens, max_model_len
            )
            or cdiv(max_model_len, settings.block_size)
            for g in groups
        )
        if any(g.kind != "full" for g in groups)
        else None,
        enable_extensible_kv_cache=settings.enable_extensible_kv_cache,
    )
    if sizing.estimate_num_gpu_blocks < 2:
        raise EngineRefused(
            "engine.auto_no_room",
            utilization=sizing.gpu_memory_utilization,
            derivation="\n".join(sizing.lines()),
        )
    if sizing.sizing_path == "measured":
        # vLLM 0.34's last step: the count measured after warm-up, within the capacity reserved,
        # refused when max_model_len no longer fits (kv_cache_planning.finalize_extensible_kv_cache)
        from kvcore.config.cache import CacheConfig
        from kvcore.config.scheduler import SchedulerConfig
        from kvcore.core.kv_cache_planning import finalize_extensible_kv_cache
        from kvcore.kv_cache_interface import KVCacheConfig
        from kvcore.worker.worker_base import CompilationTimes

        reserved = KVCacheConfig(sizing.capacity_blocks, tuple(groups))
        try:
            finalize_extensible_kv_cache(
                SchedulerConfig(
                    max_model_len=max_model_len,
                    max_num_batched_tokens=settings.max_num_batched_tokens,
                ),
                CacheConfig(enable_extensible_kv_cache=True),
                [reserved],
                reserved,
                [CompilationTimes(num_kv_blocks=sizing.measured_num_blocks)],
            )
        except ValueError as e:
            raise EngineRefused(
                "engine.extensible_no_fit", error=str(e), derivation="\n".join(sizing.lines())
            ) from None
    return sizing


def sized_settings(settings: EngineSettings, sizing) -> EngineSettings:
    """The settings with "auto" replaced by the count ``sizing`` derived, as the run records
    them. A stated ``enable_extensible_kv_cache: true`` becomes null there: beside a stated
    num_gpu_blocks it would be refused when the record is read back (vLLM refuses it beside
    ``num_gpu_blocks_override``), and the count already holds what the extensible path gave."""
    extensible = (
        None if settings.enable_extensible_kv_cache else settings.enable_extensible_kv_cache
    )
    return replace(
        settings, num_gpu_blocks=sizing.num_gpu_blocks, enable_extensible_kv_cache=extensible
    )


class NoModelRunner:
    """Stands in for the model when only the block manager is studied (benchmarks,
    property tests): the next token is a fixed function of the request and its length."""

    def __init__(self, vocab_size: int = 1000, eos_token_id: Optional[int] = None) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.request_seeds: dict[str, int] = {}  # a request's own seed replaces its id's checksum

    def add_request_seed(self, request_id: str, seed: int) -> None:
        self.request_seeds[request_id] = seed

    def copy_blocks(self, copies) -> None:
        """No pools here: nothing to copy."""

    def execute(self, items) -> dict[str, int]:
        out = {}
        for it in items:
            if it.sample:
                base = self.request_seeds.get(it.request_id, zlib.crc32(it.request_id.encode()))
                seed = base + 7919 * (it.start_pos + len(it.token_ids))
                out[it.request_id] = seed % self.vocab_size
        return out

    def execute_verify(self, items) -> dict[str, list[int]]:
        """The token after each of an item's last 1 + num_draft_tokens positions (same function
        of the position as ``execute``, so drafts never change what is generated)."""
        out = {}
        for it in items:
            if it.sample:
                base = self.request_seeds.get(it.request_id, zlib.crc32(it.request_id.encode()))
                end = it.start_pos + len(it.token_ids)
                out[it.request_id] = [
                    (base + 7919 * p) % self.vocab_size
                    for p in range(end - it.num_draft_tokens, end + 1)
                ]
        return out


class Engine:
    """Drives one scenario. Same scenario -> same tokens, block ids and trace, every run.

    A driver (paged_kv_lab/run/driver.py): ``add_request(RequestSpec)``, ``step() ->
    StepRecord``, ``has_unfinished()``, ``kv_events()``, ``outputs()``; the scenario's own
    requests are added at the start of the first step after their ``arrival_step``."""

    def __init__(
        self,
        scenario: Scenario,
        model=None,
        runner=None,
        debug: bool = False,
        progress: Optional[Callable[[str], None]] = None,
        kv_events: Optional[KVEventsConfig] = None,
        kv_connectors: Optional[tuple] = None,
    ) -> None:
        """``kv_connectors``: (scheduler half, worker half, kv_load_failure_policy) of a KV
        connector built by the caller (paged_kv_lab/disagg/: the NIXL pair); by default the
        settings' CPU tier, if any."""
        s = scenario.engine
        if s.kv_transfer is not None and kv_connectors is None:
            raise ValueError(
                f"engine.kv_transfer {s.kv_transfer!r} runs two replicas: "
                "paged_kv_lab.disagg.pd.PDEngine builds them"
            )
        if getattr(s, "fleet", None) is not None:
            raise ValueError(
                "engine.fleet runs replicas behind a router: "
                "paged_kv_lab.fleet.model_fleet.FleetRun builds them"
            )
        self.scenario = scenario
        self.settings = s
        self.debug = debug
        self.model = None
        if runner is None:
            from kvcore.model import load_model

            self.model = (
                model
                if model is not None
                else load_model(scenario.model, scenario.device, scenario.dtype, progress=progress)
            )
            cfg = self.model.config
            num_layers = cfg.num_hidden_layers
            model_types = tuple(getattr(cfg, "layer_types", None) or ())
            if "linear_attention" in model_types:
                # a hybrid model (tiny-hybrid): its own layer kinds decide the groups
                if s.speculative is not None or s.cpu_offload is not None:
                    # the worker keeps no rejected-draft states and offloads no state blocks
                    raise EngineRefused("engine.linear_unsupported")
                if s.layer_types is None:
                    s = self.settings = replace(s, layer_types=model_types)
                elif tuple(s.layer_types) != model_types:
                    raise EngineRefused("engine.layer_types_not_models", layers=list(model_types))
            elif s.layer_types is not None and "linear_attention" in s.layer_types:
                raise EngineRefused("engine.no_linear_model")
            max_len = getattr(cfg, "max_position_embeddings", 8192)
        else:
            self.model = model
            num_layers = 1 if s.layer_types is None else len(s.layer_types)
            max_len = 1 << 20
        # vLLM's disable_hybrid_kv_cache_manager, resolved (kvcore/config/vllm.py)
        self.hybrid_kv_cache_manager_off = hybrid_kv_cache_manager_off(s, num_layers)
        self.groups, layer_group = kv_cache_groups(s, num_layers, self.hybrid_kv_cache_manager_off)
        # what the worker computes: each group's window, and which group's block table a layer
        # reads (a sliding-window layer managed as full attention still attends to its window)
        worker_windows = [g.sliding_window for g in self.groups]
        table_of_group = None
        types = layer_types_of(s, num_layers)
        if self.hybrid_kv_cache_manager_off and s.sliding_window and len(self.groups) == 1:
            if "sliding_attention" in types and self.groups[0].sliding_window is None:
                worker_windows, table_of_group = [None, s.sliding_window], [0, 0]
                layer_group = [int(t == "sliding_attention") for t in types]
        self.max_model_len = s.max_model_len or max_len
        # how num_gpu_blocks "auto" was derived (kvcore.model.memory.KVCacheSizing)
        self.kv_cache_sizing = None
        if s.num_gpu_blocks == "auto":
            if self.model is None:
                raise EngineRefused("engine.auto_needs_model")
            self.kv_cache_sizing = size_kv_cache(self.model, s)
            s = self.settings = sized_settings(s, self.kv_cache_sizing)
        self.recorder = Recorder()
        self.hasher = block_hasher_for(s)
        self.hash_fn = self.hasher.hash_fn
        self.none_hash_seed = self.hasher.none_hash_seed
        self.kv_cache_manager = kv_cache_manager_for(
            s, self.groups, self.max_model_len, enable_kv_cache_events=True
        )
        self.kv_cache_config = self.kv_cache_manager.kv_cache_config
        self.recorder.attach(self.kv_cache_manager)
        # A second tier (CPU offloading): the connector's two halves, scheduler and worker.
        self.kv_connector, kv_connector_worker = cpu_offload_connectors(
            s, self.kv_cache_config, self.max_model_len
        )
        policy = s.cpu_offload.kv_load_failure_policy if s.cpu_offload is not None else "fail"
        if kv_connectors is not None:
            self.kv_connector, kv_connector_worker, policy = kv_connectors
        self.lora_config = lora_config_for(s)
        self.lora_requests = lora_requests_for(s)
        self.scheduler = Scheduler(
            scheduler_config_for(s, self.max_model_len),
            self.kv_cache_manager,
            self.kv_connector,
            kv_load_failure_policy=policy,
            lora_config=self.lora_config,
        )
        # Speculative decoding: drafts from an n-gram proposer, verified greedily.
        self.drafter: Optional[NgramGPUSpeculator | StandaloneARSpeculator | EagleSpeculator] = None
        if s.speculative is not None:
            if s.seed is not None:
                raise ValueError(
                    "engine.speculative verifies drafts greedily: it needs engine.seed null"
                )
            sp = s.speculative
            if sp.method == "ngram":
                # vLLM drafts num_speculative_tokens, but a step never schedules more than
                # max_num_batched_tokens tokens and drops the drafts it cut: a longer list would
                # schedule the same tokens, and a huge k (a scenario may give one) would not fit
                # in memory.
                self.drafter = NgramGPUSpeculator(
                    sp.prompt_lookup_min,
                    sp.prompt_lookup_max,
                    min(sp.num_speculative_tokens, s.max_num_batched_tokens),
                    self.max_model_len,
                )
        if runner is None:
            runner = self._model_runner(layer_group, worker_windows, table_of_group)
        self.runner = runner
        if hasattr(runner, "add_lora"):
            # the adapters are read now, as vLLM loads the ones it starts with: a folder that
            # cannot be served is refused before any step
            for lora in self.lora_requests.values():
                try:
                    runner.add_lora(lora)
                except ValueError as e:
                    at = {"name": repr(lora.lora_name), "path": lora.lora_path, "error": str(e)}
                    raise EngineRefused("engine.lora_refused", **at) from None
        if s.speculative is not None and s.speculative.method == "draft_model":
            self.drafter = self._draft_model_proposer(s.speculative, runner, num_layers)
        if s.speculative is not None and s.speculative.method in EAGLE_METHODS:
            self.drafter = self._eagle_proposer(s.speculative, runner)
        # The engine core builds its hasher and PrefixHashConfig as vLLM 0.34 does, from the
        # settings self.hasher came from (its seed already resolved, so both give the same
        # bytes). The lab makes its Requests itself, with self.hasher, and never sends
        # frontend hashes.
        self.engine_core = EngineCore(
            self.scheduler,
            runner,
            self.drafter,
            self.max_model_len,
            enable_prefix_caching=s.enable_prefix_caching,
            prefix_caching_hash_algo=s.hash_algo,
            hash_block_size=self.hasher.block_size,
            none_hash_seed=self.hasher.none_hash_seed,
        )
        if kv_connector_worker is not None:
            kv_connector_worker.register_kv_caches(getattr(runner, "kv_caches", None))
            if s.cpu_offload is not None and kv_connectors is None:
                kv_connector_worker.worker_handler.fail_load_req_ids = set(s.cpu_offload.fail_loads)
            self.engine_core.kv_connector = kv_connector_worker
        # KV cache events (vLLM's wire format) are drained every step. They go out on ZeroMQ
        # only when the caller passes ``kv_events`` (the CLI passes --kv-events or the
        # scenario's engine.kv_events): a scenario file alone never opens a socket, so a
        # file uploaded to the app cannot make its server bind or connect anywhere.
        self.kv_events_config = kv_events
        self.kv_event_publisher: Optional[ZmqEventPublisher] = None
        self.last_kv_event_batch: Optional[KVEventBatch] = None
        wire = kv_events if kv_events is not None else getattr(s, "kv_events", None)
        if wire is not None:
            self.kv_cache_manager.block_pool.use_int_block_hashes = wire.use_int_block_hashes
        self.step_count = 0
        self._arrivals = 0
        self.parent_requests: dict[str, ParentRequest] = {}  # requests with n > 1, by parent id
        self._pending: list[RequestSpec] = sorted(scenario.requests, key=lambda r: r.arrival_step)
        self.history: list[snapshot.StepRecord] = []
        # Every request added, finished ones included, in arrival order: the recording shows
        # and outputs them; the scheduler, as vLLM's, forgets a request once it finishes.
        self.requests: dict[str, Request] = {}
        # vLLM's output processor state of the requests with stop strings, by id
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        # Refuse a scenario whose prompt can never fit now, not in the middle of a run; what
        # the checks computed (token ids, embedding rows) is kept for the request's arrival.
        self._prompt_inputs_of = {id(spec): self._prompt_inputs(spec) for spec in self._pending}
        if self.debug:
            self.check_invariants()
        cfg = self.kv_events_config
        if cfg is not None and cfg.enable_kv_cache_events and cfg.publisher == "zmq":
            # last: nothing after it can fail
            self.kv_event_publisher = ZmqEventPublisher.from_config(cfg)

    # -- requests -----------------------------------------------------------------------
    def _eos_ids(self) -> tuple[int, ...]:
        if self.model is None:
            return (
                (self.runner.eos_token_id,)
                if getattr(self.runner, "eos_token_id", None) is not None
                else ()
            )
        eos = self.model.eos_token_id
        return tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())

    def encode(self, spec: RequestSpec) -> list[int]:
        if spec.prompt_token_ids is not None:
            ids = list(spec.prompt_token_ids)
            vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
            if vocab is not None and any(t >= vocab for t in ids):
                raise EngineRefused("request.vocab", id=repr(spec.id), vocab=vocab, got=max(ids))
            return ids
        if self.model is None:
            what = "embeds_" if spec.prompt_embeds is not None else ""
            raise EngineRefused(f"request.{what}needs_model", id=repr(spec.id))
        return self.model.encode_prompt(prompt_text(spec), spec.chat)

    def embedding_inputs(
        self, spec: RequestSpec, ids: list[int]
    ) -> tuple[Optional[list[bytes]], list[MultiModalFeatureSpec]]:
        """The request's ``prompt_embeds`` rows (None: a token prompt) and its multimodal items,
        each with its rows as ``data`` (None without a model: its identifier alone goes into the
        hashes) and its identifier (given, or the sha256 of its rows); ``ids``: the prompt's
        tokens (for an embeddings prompt, its text's). EngineRefused for an item that does not
        fit the prompt or whose rows do not fill its range."""
        embeds = None
        if spec.prompt_embeds is not None:
            embeds = self._rows(spec.prompt_embeds, ids, len(ids))
        features = []
        for j, item in enumerate(spec.mm_features):
            at = {"id": repr(spec.id), "item": j}
            end = item.offset + item.length
            if end > len(ids):
                raise EngineRefused("request.mm_outside", **at, end=end, tokens=len(ids))
            rows = None
            if self.model is not None:
                text = item.embeds.text
                src = self.model.encode_prompt(text, chat=False) if text is not None else None
                if src is not None and len(src) != item.length:
                    raise EngineRefused("request.mm_rows", **at, rows=len(src), length=item.length)
                rows = tuple(self._rows(item.embeds, src, item.length))
            elif item.identifier is None:
                raise EngineRefused("request.mm_needs_identifier", id=repr(spec.id))
            identifier = item.identifier or hashlib.sha256(b"".join(rows)).hexdigest()
            position = PlaceholderRange(item.offset, item.length)
            features.append(MultiModalFeatureSpec(identifier, position, item.modality, rows))
        return embeds, features

    def _rows(self, source: EmbedsSource, ids: Optional[list[int]], n: int) -> list[bytes]:
        from kvcore.model.prompt_embeds import embedding_rows

        noise = source.noise
        seed, scale = (noise.seed, noise.scale) if noise is not None else (None, 0.0)
        return embedding_rows(self.model, ids, n, seed, scale)

    def add_request(self, spec: RequestSpec, kv_transfer_params: Optional[dict] = None) -> None:
        """Queue a request now (its arrival_step is ignored). Raises ValueError, changing
        nothing, if it is malformed or can never fit in the pool. ``kv_transfer_params``: what a
        KV connector needs to move its K/V (vLLM's, e.g. from a P/D proxy); each child of an
        n > 1 request gets its own copy."""
        parent, children = fan_out(spec)  # n > 1: children "0_<id>"... (vLLM's ParentRequest)
        for child in children:
            if child.id in self.scheduler.requests or child.id in self.parent_requests:
                raise EngineRefused("request.exists", id=repr(child.id))
        if parent is not None and spec.id in self.scheduler.requests:
            raise EngineRefused("request.exists", id=repr(spec.id))
        if self.drafter is not None and (spec.seed is not None or spec.n > 1):
            raise EngineRefused("request.speculative_sampling", id=repr(spec.id))
        prepared = self._prompt_inputs_of.pop(id(spec), None)  # a scenario's own request
        ids, embeds, features = prepared or self._prompt_inputs(spec)
        s = self.settings
        if parent is not None:
            self.parent_requests[parent.request_id] = parent
        self._arrivals += 1  # children are copies of one request: one arrival time, as in vLLM
        for child in children:
            req = Request(
                child.id,
                None if embeds is not None else ids,  # an embeddings prompt: ids 0, as vLLM's
                child.max_tokens,
                arrival_time=self._arrivals,
                priority=child.priority,
                cache_salt=child.cache_salt,
                lora_request=self.lora_requests.get(child.lora_name) if child.lora_name else None,
                eos_token_ids=self._eos_ids(),
                ignore_eos=child.ignore_eos,
                block_hasher=self.hasher if s.enable_prefix_caching else None,
                kv_transfer_params=dict(kv_transfer_params) if kv_transfer_params else None,
                prompt_logprobs=child.prompt_logprobs,
                mm_features=features,
                prompt_embeds=embeds,
            )
            if child.seed is not None and hasattr(self.runner, "add_request_seed"):
                self.runner.add_request_seed(child.id, child.seed)
            self.scheduler.add_request(req)
            self.requests.pop(child.id, None)  # an id used again: the new request is shown
            self.requests[child.id] = req
            self.detokenizers.pop(child.id, None)
            if child.stop:
                self.detokenizers[child.id] = IncrementalDetokenizer(
                    self._decode_output, child.stop, child.include_stop_str_in_output
                )

    def _prompt_inputs(self, spec: RequestSpec) -> tuple:
        """(token ids, embedding rows, multimodal items) of ``spec``, checked."""
        ids = self._checked_prompt(spec)
        return (ids, *self.embedding_inputs(spec, ids))

    def _checked_prompt(self, spec: RequestSpec) -> list[int]:
        """The prompt's token ids; ValueError if the prompt alone can never fit."""
        if spec.prompt_embeds is not None and not self.settings.enable_prompt_embeds:
            path = f"{spec.id}.prompt_embeds"
            raise EngineRefused("prompt_embeds_need_enable", path=path)
        rows = spec.prompt_embeds is not None or spec.mm_features
        if rows and isinstance(self.drafter, StandaloneARSpeculator):
            raise EngineRefused("engine.embeds_draft_model")
        ids = self.encode(spec)
        if spec.stop and self.model is None:
            raise EngineRefused("request.stop_needs_model", id=repr(spec.id))
        if not ids:
            # An input check: kvcore's Request, as vLLM's, takes an empty prompt.
            raise EngineRefused("request.empty", id=repr(spec.id))
        s = self.settings
        full_groups = sum(1 for g in self.groups if g.kind == "full")
        usable = s.num_gpu_blocks - 1
        need = cdiv(len(ids), s.block_size) * full_groups
        if need > usable:
            at = {"tokens": len(ids), "need": need, "block_size": s.block_size}
            at |= {"usable": usable, "blocks": s.num_gpu_blocks}
            raise EngineRefused("request.never_fits", id=repr(spec.id), **at)
        if len(ids) >= self.max_model_len:
            at = {"tokens": len(ids), "max_model_len": self.max_model_len}
            raise EngineRefused("request.max_model_len", id=repr(spec.id), **at)
        return ids

    def has_unfinished(self) -> bool:
        return bool(self._pending) or self.scheduler.has_requests()

    def kv_events(self) -> tuple:
        """The KV cache events the last step published (its ``KVEventBatch``'s events, the
        CPU tier's included), in order; () when it queued none."""
        batch = self.last_kv_event_batch
        return tuple(batch.events) if batch is not None else ()

    # -- as a replica of a fleet (paged_kv_lab/fleet) --------------------------------------
    @property
    def block_pool(self):
        return self.kv_cache_manager.block_pool

    def queued(self) -> tuple[str, ...]:
        """The requests taken and not yet in the scheduler: the scenario's, before their
        arrival step (``add_request`` hands a request to the scheduler at once)."""
        return tuple(spec.id for spec in self._pending)

    @property
    def clock_ns(self) -> int:
        """The engine keeps no clock of its own: a fleet counts one step as one second (its KV
        event batches carry the step number as their time)."""
        return self.step_count * 1_000_000_000

    def step_until(self, until_ns: Optional[int] = None) -> None:
        """One step (an engine never skips steps; ``until_ns`` bounds what a fleet asks of a
        replica that can, the model-free replay)."""
        self.step()

    # -- stepping -----------------------------------------------------------------------
    def step(self) -> snapshot.StepRecord:
        self.step_count += 1
        while self._pending and self._pending[0].arrival_step < self.step_count:
            self.add_request(self._pending.pop(0))
        started = time.perf_counter()
        done = self.engine_core.step()
        self._check_stop_strings(done.new_tokens)
        seconds = time.perf_counter() - started
        out = done.scheduler_output
        self._publish_kv_events()
        self.kv_cache_manager.make_prefix_cache_stats()
        if self.debug:
            self.check_invariants()
        rec = snapshot.StepRecord(
            step=self.step_count,
            scheduled=dict(out.num_scheduled_tokens),
            events=tuple(self.recorder.drain()),
            snapshot=self.snapshot(),
            new_tokens=done.new_tokens,
            model_inputs=done.model_inputs,
            kv_events=tuple(self.last_kv_event_batch.events) if self.last_kv_event_batch else (),
            seconds=seconds,
        )
        self.history.append(rec)
        return rec

    def _check_stop_strings(self, new_tokens: dict[str, list[int]]) -> None:
        """vLLM's output processor after a step: each new token of a request with stop strings
        is detokenized and the new text searched; a request that matched and is still running
        is then finished by the engine core (``EngineCore.abort_requests``: the scheduler
        frees it as FINISHED_ABORTED; its output says it stopped, with the string)."""
        to_abort = []
        for rid in new_tokens:
            detokenizer = self.detokenizers.get(rid)
            if detokenizer is None or detokenizer.stop_reason is not None:
                continue
            req = self.requests[rid]
            # the tokens the scheduler appended (not those sampled past a finish)
            tokens = req.output_token_ids[len(detokenizer.token_ids) :]
            stop_terminated = req.status == RequestStatus.FINISHED_STOPPED
            if detokenizer.update(tokens, stop_terminated) is not None and not req.is_finished():
                to_abort.append(rid)
        if to_abort:
            self.scheduler.finish_requests(to_abort, RequestStatus.FINISHED_ABORTED)

    def _model_runner(self, layer_group, worker_windows, table_of_group):
        """The worker: one block size for every group, or, where the groups' block sizes
        differ, pages of their greatest common divisor (paged_kv_lab/run/group_pages.py)."""
        from kvcore.worker.gpu.model_runner import GPUModelRunner

        s = self.settings
        sizes = self.kv_cache_manager.coordinator.group_block_sizes
        kw = dict(seed=s.seed, lora_config=self.lora_config, table_of_group=table_of_group)
        if len(set(sizes)) == 1:
            return GPUModelRunner(
                self.model, s.num_gpu_blocks, sizes[0], layer_group, worker_windows, **kw
            )
        if s.speculative is not None or s.cpu_offload is not None or s.kv_transfer is not None:
            # drafters, the CPU tier and the P/D pair address blocks at one block size
            raise EngineRefused("engine.sliding_block_multiple_unsupported")
        from paged_kv_lab.run.group_pages import GroupPagesRunner

        return GroupPagesRunner(
            self.model, s.num_gpu_blocks, sizes, layer_group, worker_windows, **kw
        )

    def _draft_model_proposer(self, sp, runner, num_layers: int) -> StandaloneARSpeculator:
        """The draft model: the runner's model cut after its first ``num_draft_layers`` layers,
        with K/V pools of its own (the runner's block ids address them)."""
        if self.model is None or not hasattr(runner, "kv_caches"):
            raise ValueError(
                'engine.speculative method "draft_model" runs the model\'s first layers: '
                "this engine runs without a model"
            )
        from kvcore.worker.draft_model_runner import DraftModelRunner

        draft = DraftModelRunner(runner, num_draft_layers(sp, num_layers))
        return StandaloneARSpeculator(draft, sp.num_speculative_tokens, self.max_model_len)

    def _eagle_proposer(self, sp, runner) -> EagleSpeculator:
        """The EAGLE-style head over the runner's hidden states (made once per model and kept in
        the model cache: kvcore/model/eagle_head.py)."""
        if self.model is None or not hasattr(runner, "keep_hidden_states"):
            raise EngineRefused("engine.eagle_needs_model", method=repr(sp.method))
        from kvcore.model.eagle_head import eagle_head_for
        from kvcore.worker.eagle_head_runner import EagleHeadRunner

        head_runner = EagleHeadRunner(runner, eagle_head_for(self.model))
        return EagleSpeculator(head_runner, sp.num_speculative_tokens, self.max_model_len)

    @property
    def spec_decoding_stats(self):
        return self.engine_core.spec_decoding_stats

    def run(
        self, until: Optional[str] = None, max_steps: int = 100_000
    ) -> list[snapshot.StepRecord]:
        """Step until every request finished, or until a step emits an event of kind ``until``."""
        records = []
        while self.has_unfinished() and len(records) < max_steps:
            rec = self.step()
            records.append(rec)
            if until is not None and any(e.kind == until for e in rec.events):
                break
        return records

    def generate(self, specs: list[RequestSpec]) -> dict[str, dict]:
        for spec in specs:
            self.add_request(replace(spec, arrival_step=0))
        self.run()
        out, grouped = self.outputs(), self.grouped_outputs()  # n > 1: the children, by index
        return {s.id: out[s.id] if s.n == 1 else grouped[s.id] for s in specs}

    # -- reading --------------------------------------------------------------------------
    def decode(self, token_ids) -> str:
        if self.model is None or not token_ids:
            return ""
        return self.model.decode(list(token_ids))

    def _decode_output(self, token_ids) -> str:
        """Output text as vLLM's detokenizer makes it (skip_special_tokens, its default)."""
        return self.model.decode(list(token_ids), skip_special_tokens=True)

    def snapshot(self) -> snapshot.Snapshot:
        return take_snapshot(
            self.scheduler,
            self.step_count,
            self.decode if self.model else None,
            self.recorder.hash_meta,
            self.requests,
        )

    def outputs(self) -> dict[str, dict]:
        out = {}
        for rid, req in self.requests.items():
            out[rid] = {
                "token_ids": list(req.output_token_ids),
                "text": self.decode(req.output_token_ids),
                "finish_reason": req.status.value if req.is_finished() else None,
            }
            detokenizer = self.detokenizers.get(rid)
            if detokenizer is not None:  # vLLM's text: special tokens skipped, cut at a stop
                out[rid]["token_ids"] = list(detokenizer.token_ids)
                out[rid]["text"] = detokenizer.output_text
                if detokenizer.stop_reason is not None:
                    out[rid]["finish_reason"] = RequestStatus.FINISHED_STOPPED.value
                    out[rid]["stop_reason"] = detokenizer.stop_reason
        return out

    def grouped_outputs(self) -> dict[str, dict]:
        """``outputs()`` gathered under the requests as sent: a parent's children by index
        (kvcore.engine.parallel_sampling.group_outputs)."""
        return group_outputs(self.outputs(), self.parents())

    def parents(self) -> dict[str, list[str]]:
        """parent id -> child ids, for the requests with n > 1 added so far."""
        return parent_groups(self.parent_requests.values())

    def check_invariants(self) -> None:
        check_invariants(
            self.kv_cache_manager,
            self.hash_fn,
            self.scheduler.requests,
            self.hasher.none_hash,
            extra_refs=self.kv_connector.scheduler_manager.gpu_block_refs()
            if getattr(self.kv_connector, "scheduler_manager", None) is not None
            else None,
        )

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def evict_blocks(self, block_ids) -> None:
        self.kv_cache_manager.evict_blocks(block_ids)

    def take_kv_events(self) -> list:
        return self.kv_cache_manager.take_events()

    def _publish_kv_events(self) -> None:
        """As vLLM's update_from_output: one KVEventBatch per step that queued events."""
        taken = self.kv_cache_manager.take_events()
        if self.kv_connector is not None:  # the CPU tier's events, medium "CPU"
            taken += self.kv_connector.take_events()
        self.last_kv_event_batch = KVEventBatch(ts=time.time(), events=taken) if taken else None
        if self.last_kv_event_batch is not None and self.kv_event_publisher is not None:
            self.kv_event_publisher.publish(self.last_kv_event_batch)

    def close(self) -> None:
        """Stop the KV event publisher (sends what is queued first)."""
        if self.kv_event_publisher is not None:
            self.kv_event_publisher.shutdown()
            self.kv_event_publisher = None

    def bytes_per_block(self) -> int:
        from kvcore.model.memory import bytes_per_block

        return bytes_per_block(self.model.config, self.settings.block_size, self.model.dtype)
