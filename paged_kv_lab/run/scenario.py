"""Scenario files: engine settings + requests, validated on load with a pydantic schema.

The schema is the dataclasses below (their ``Annotated`` types); pydantic checks a
file against them and reports every problem with its path in the file
("requests[2].max_tokens: ..."). Nothing is half-applied: load_scenario either
returns a complete Scenario or raises ScenarioError listing all problems.

Old files: ``engine.sliding_retention`` ("sparse" / "dense", before vLLM named the
setting) is still read, as ``prefix_cache_retention_interval`` 0 / null; the app's
lesson 5 switch still writes it, with those two words as its labels.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

from kvcore.config.kv_events import KVEventsConfig
from kvcore.config.lora import MAX_LORA_RANKS
from kvcore.config.scheduler import ADMISSIONS
from kvcore.core.block_pool import FREE_ORDERS
from kvcore.core.sched.request_queue import POLICIES
from kvcore.distributed.kv_transfer.kv_connector.factory import NAMED_ONLY_CONNECTORS
from kvcore.kv_cache_interface import MAMBA_CACHE_MODES
from kvcore.model.memory import DEFAULT_BLOCK_SIZE, HybridPageSizes, hybrid_page_sizes
from kvcore.model.shapes import DEVICE_CHOICES, DTYPE_CHOICES, MODEL_CHOICES, hybrid_shape
from kvcore.utils.hashing import HASH_ALGOS
from paged_kv_lab.text.i18n import ProblemsError, Text, tr

# Each choice is kvcore's own list, where kvcore uses it (the model names where the models are
# loaded); the playground's form, the command lines and the tests derive theirs from these.
MODELS = MODEL_CHOICES
DEVICES = DEVICE_CHOICES
DTYPES = DTYPE_CHOICES
# "linear_attention": a Mamba-style state layer (Qwen3-Next / Qwen3.5's gated delta-net): its
# group holds state blocks (kvcore MambaSpec); only model-free runs have such layers so far.
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
# engine.sliding_retention -> prefix_cache_retention_interval
LEGACY_RETENTION = {"sparse": 0, "dense": None}
_FORBID = ConfigDict(extra="forbid")


class ScenarioError(ProblemsError):
    """A scenario that does not validate: ``texts`` one problem each (``field: what is wrong``,
    a catalogue sentence with the field's path and value as data), ``problems`` their English,
    ``lines(lang)`` in a language; ``str(e)`` the whole refusal in English."""

    AROUND = Text("refusal.invalid_scenario")


# Every integer fits the engine's 64-bit tensors (positions, seeds): a larger one is refused here,
# by name, rather than overflowing in a step.
INT64_MAX = 2**63 - 1
Int = Annotated[StrictInt, Field(ge=1, le=INT64_MAX)]
# a number in a range, kept as a float; the bounds are data, so the forms and tests read them
Fraction = Annotated[Union[StrictInt, StrictFloat], Field(ge=0, lt=1), AfterValidator(float)]
Utilization = Annotated[Union[StrictInt, StrictFloat], Field(gt=0, le=1), AfterValidator(float)]
Count = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
# a fraction with both ends allowed (vLLM's cache_aware_admission_threshold: ge=0.0, le=1.0)
ClosedFraction = Annotated[Union[StrictInt, StrictFloat], Field(ge=0, le=1), AfterValidator(float)]
OptInt = Optional[Int]


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's speculative_config, verified greedily. ``method``: "ngram" (prompt lookup) or
    "draft_model": the target's own first ``num_draft_layers`` layers with its final norm and LM
    head (kvcore/worker/gpu/spec_decode/standalone_ar/speculator.py; null = three quarters of the
    model's layers, at least one), which writes K/V ahead, so the scheduler reserves
    ``num_speculative_tokens`` lookahead slots. Unset lookup lengths follow vLLM: both unset -> 5
    and 5, one set -> the other equals it. "eagle" / "mtp": a head over the target's hidden states
    (kvcore/worker/gpu/spec_decode/eagle/speculator.py, made by scripts/make_eagle_head.py); vLLM
    then hashes each block with the token after it unless ``disable_lookahead_block_hashes`` (the
    lab models only that case: every hit gives up its last matched block) or
    ``disable_eagle_block_drop`` (neither)."""

    __pydantic_config__ = _FORBID
    method: Literal["ngram", "draft_model", "eagle", "mtp"] = "ngram"
    num_speculative_tokens: Int = 3
    prompt_lookup_min: OptInt = None
    prompt_lookup_max: OptInt = None
    num_draft_layers: OptInt = None
    disable_eagle_block_drop: StrictBool = False
    disable_lookahead_block_hashes: StrictBool = False

    def __post_init__(self) -> None:
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = 5
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        if lo > hi:
            raise ValueError(Text("problem.lookup_order", {"lo": lo, "hi": hi}))
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)


@dataclass(frozen=True)
class CPUOffloadConfig:
    """vLLM's SimpleCPUOffloadConnector (``kv_connector_extra_config``): a CPU pool of
    ``num_cpu_blocks`` blocks (its null block included) beside the GPU pool; ``lazy_offload``
    stores only the blocks about to be evicted from the GPU instead of every computed block
    (kvcore/simple_kv_offload/manager.py). ``kv_load_failure_policy`` is vLLM's
    ``KVTransferConfig`` setting: when a load fails, "fail" (vLLM's default) ends the request
    with an error, "recompute" computes the lost tokens again. ``fail_loads`` is ours, for
    teaching: the CPU -> GPU copy that first brings in each named request's blocks fails, and the
    worker reports those GPU blocks as ``invalid_block_ids`` (the other requests loading in that
    step share the copy, and its failure)."""

    __pydantic_config__ = _FORBID
    num_cpu_blocks: Annotated[StrictInt, Field(ge=2, le=INT64_MAX)] = 16
    lazy_offload: StrictBool = False
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"
    fail_loads: Annotated[tuple[StrictStr, ...], Field(max_length=1024)] = ()


def _lora_rank(rank: int) -> int:
    if rank not in MAX_LORA_RANKS:
        choices = ", ".join(str(r) for r in MAX_LORA_RANKS)
        raise ValueError(Text("problem.lora_rank", {"choices": choices, "got": rank}))
    return rank


# one of vLLM's ranks, as an integer (a Literal would take true for 1 and 8.0 for 8)
LoRARank = Annotated[StrictInt, AfterValidator(_lora_rank)]


@dataclass(frozen=True)
class LoRAModulePath:
    """One adapter the engine serves (vLLM's ``--lora-modules`` entry ``{"name", "path"}``):
    ``path`` is a peft adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``),
    read when a request first names the adapter. Its ``lora_int_id`` is its place in
    ``engine.lora_modules`` plus one, as vLLM numbers the adapters it is started with."""

    __pydantic_config__ = _FORBID
    name: Annotated[StrictStr, Field(min_length=1)]
    path: Annotated[StrictStr, Field(min_length=1)]


# Bounds on what a scenario may ask for embedding rows (kvcore/model/prompt_embeds.py): a noise
# scale (an embedding's own entries are far smaller) and the multimodal items of one request.
MAX_NOISE_SCALE = 100
MAX_MM_ITEMS = 64


@dataclass(frozen=True)
class EmbedsNoise:
    """Gaussian noise added to embedding rows: ``scale`` times standard normal draws from a CPU
    generator seeded with ``seed`` (same seed -> same rows on any machine)."""

    __pydantic_config__ = _FORBID
    seed: Count = 0
    scale: Annotated[
        Union[StrictInt, StrictFloat], Field(ge=0, le=MAX_NOISE_SCALE), AfterValidator(float)
    ] = 0.02


@dataclass(frozen=True)
class EmbedsSource:
    """Where embedding rows come from (kvcore/model/prompt_embeds.py): the model's own input
    embeddings of ``text``'s tokens (tokenized as the request's prompt would be, ``chat``
    included), or zeros without a text; plus ``noise`` when it is set."""

    __pydantic_config__ = _FORBID
    text: Optional[Annotated[StrictStr, Field(min_length=1)]] = None
    noise: Optional[EmbedsNoise] = None


@dataclass(frozen=True)
class MultiModalItem:
    """One multimodal item of a token prompt (vLLM's ``MultiModalFeatureSpec``): its placeholder
    range ``offset``/``length`` (``PlaceholderRange``), ``modality``, and ``identifier``, the hash
    every block the range touches carries (null: the sha256 of its rows, hex). The lab runs no
    encoder: ``embeds`` gives the rows standing for the encoder's output, one per placeholder
    position (a text must have ``length`` tokens), merged into the prompt's embeddings there."""

    __pydantic_config__ = _FORBID
    offset: Count
    length: Int
    embeds: EmbedsSource = field(default_factory=EmbedsSource)
    modality: Annotated[StrictStr, Field(min_length=1, max_length=64)] = "image"
    identifier: Optional[Annotated[StrictStr, Field(min_length=1, max_length=256)]] = None


@dataclass(frozen=True)
class KVTransferConfig:
    """What a P/D pair (``kv_transfer: "pd"``) does with a failed pull.
    ``kv_load_failure_policy`` is vLLM's ``KVTransferConfig`` field: "fail" (vLLM's default)
    ends the request with an error on the decode replica, "recompute" computes its prompt there.
    ``fail_loads`` is ours, for teaching (vLLM has no such knob): the decode replica's pull of
    each named request fails, and its worker reports the request in ``failed_recving`` with its
    blocks as ``invalid_block_ids``."""

    __pydantic_config__ = _FORBID
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"
    fail_loads: Annotated[tuple[StrictStr, ...], Field(max_length=1024)] = ()


MAX_FLEET_REPLICAS = 8  # a fleet's engines share the model; each holds a KV pool of its own
RouterValue = Union[StrictInt, float, StrictStr]


@dataclass(frozen=True)
class FleetConfig:
    """Replicas of this engine behind a router (``engine.fleet``; paged_kv_lab/fleet/
    model_fleet.py): ``replicas`` engines of these settings, one copy of the model, each with a
    pool of ``num_gpu_blocks``; ``router`` one of the router registry's policies
    (paged_kv_lab/fleet/router.py) with ``router_settings`` over its defaults (the router's own
    block size and hash seed among them); ``sessions`` each request's conversation, the session
    router's key (a request left out is its own). A request's ``arrival_step`` is on the fleet's
    clock: it is routed once every replica made that many steps. Checked against the router
    registry when the fleet is built."""

    __pydantic_config__ = _FORBID
    replicas: Annotated[StrictInt, Field(ge=1, le=MAX_FLEET_REPLICAS)] = 2
    router: Annotated[StrictStr, Field(min_length=1, max_length=64)] = "round_robin"
    router_settings: dict[Annotated[StrictStr, Field(max_length=64)], RouterValue] = field(
        default_factory=dict
    )
    sessions: dict[StrictStr, StrictStr] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineSettings:
    __pydantic_config__ = _FORBID
    # left out: vLLM 0.34's default on a GPU (64), or for a hybrid model the size vLLM resolves
    # for it (resolve_from_model)
    block_size: Int = DEFAULT_BLOCK_SIZE
    # counts the null block, as vLLM does; "auto": profile the model and derive it from
    # gpu_memory_utilization, or from kv_cache_memory_bytes when that is set (kvcore/model/
    # profile.py, kvcore/model/memory.py: KVCacheSizing); left out: 64, or "auto" when
    # kv_cache_memory_bytes is set
    num_gpu_blocks: Union[Annotated[StrictInt, Field(ge=2, le=INT64_MAX)], Literal["auto"]] = 64
    # null (vLLM 0.34's default): resolved to 1.0 with the extensible KV cache and 0.92 without
    # (kvcore/config/cache.py: resolved_gpu_memory_utilization)
    gpu_memory_utilization: Optional[Utilization] = None
    # vLLM's CacheConfig.kv_cache_memory_bytes: the KV budget stated in bytes (then
    # gpu_memory_utilization is not used); null: derived from gpu_memory_utilization
    kv_cache_memory_bytes: OptInt = None
    # vLLM 0.34's CacheConfig.enable_extensible_kv_cache: with num_gpu_blocks "auto", size the
    # pool from the memory measured free after the model's warm-up, within the capacity the
    # estimate reserves (kvcore/model/memory.py: KVCacheSizing.sizing_path). null: resolved as
    # vLLM resolves it on a GPU (kvcore/config/vllm.py): on, unless num_gpu_blocks is a number or
    # kv_cache_memory_bytes is set; true where those are stated is refused, as vLLM refuses it
    enable_extensible_kv_cache: Optional[StrictBool] = None
    enable_prefix_caching: StrictBool = True
    hash_algo: Literal[HASH_ALGOS] = "xxhash"
    # NONE_HASH seed: a string is the seed; null = vLLM's rule (PYTHONHASHSEED, else fixed
    # for sha256 and random for xxhash). See kvcore/core/kv_cache_utils.py.
    hash_seed: Optional[StrictStr] = "vllm-none-hash"
    max_num_seqs: Int = 8
    max_num_batched_tokens: Int = 256
    policy: Literal[POLICIES] = "fcfs"
    sliding_window: OptInt = None
    # The sliding-window layers' block as a multiple of block_size. vLLM 0.34 gives every page
    # the same bytes (kv_cache_planning.unify_kv_cache_spec_page_size): a layer whose page per
    # token is 1/k of the largest gets k times the block (gemma-4-E4B: sliding 32, full 16).
    # The scheduler's block is then the least common multiple of the groups' sizes.
    sliding_block_multiple: Int = 1
    layer_types: Optional[Annotated[tuple[Literal[LAYER_TYPES], ...], Field(min_length=1)]] = None
    # "v0.33": vLLM 0.34's free order, as 0.33's (the value is a setting: kvcore/core/block_pool.py)
    free_order: Literal[FREE_ORDERS] = "v0.33"
    admission: Literal[ADMISSIONS] = "full_sequence"
    # None: hash every full block of a sliding-window group; 0: only the blocks a later
    # request can hit (vLLM's default); n > 0: those and a checkpoint every n tokens.
    prefix_cache_retention_interval: Optional[Count] = 0
    # vLLM's CacheConfig names. mamba_cache_mode is resolved as vLLM resolves it for a model
    # with linear-attention layers: "align" with prefix caching, "none" without.
    # prefix_match_unit: hash every this many tokens (finer than block_size: hits inside a
    # block, with a linear-attention group in align mode); null = block_size.
    mamba_cache_mode: Literal[MAMBA_CACHE_MODES] = "none"
    prefix_match_unit: OptInt = None
    watermark: Fraction = 0.0
    max_cache_hit_length: Optional[Count] = None
    seed: Optional[Count] = None
    max_model_len: OptInt = None
    long_prefill_token_threshold: Count = 0
    # vLLM 0.34's SchedulerConfig: cache-aware admission (within the first this many waiting
    # requests, those with a cached prefix are admitted first; 0 = arrival order), once the pool
    # is at least cache_aware_admission_threshold used; and the cap on requests holding blocks
    # for an asynchronous KV load (null: no cap, loads start only when a running slot is free).
    cache_aware_admission_window: Count = 0
    cache_aware_admission_threshold: ClosedFraction = 0.5
    max_num_inflight_kv_loads: OptInt = None
    # KV cache events published on ZeroMQ as vLLM does (vLLM's --kv-events-config); off when null.
    kv_events: Optional[KVEventsConfig] = None
    # Speculative decoding (kvcore/worker/gpu/spec_decode/ngram/speculator.py); off when null.
    speculative: Optional[SpeculativeConfig] = None
    # A second tier: CPU offloading (kvcore/simple_kv_offload/); off when null.
    cpu_offload: Optional[CPUOffloadConfig] = None
    # Disaggregated serving: "pd" runs a prefill replica and a decode replica joined by the
    # NIXL connector's flow (paged_kv_lab/disagg/); null: one engine.
    kv_transfer: Optional[Literal["pd"]] = None
    # the pair's vLLM KVTransferConfig settings (a failed pull's policy); null: vLLM's defaults
    kv_transfer_config: Optional[KVTransferConfig] = None
    # vLLM's kv_transfer_config.kv_connector, for a connector the lab does not run (LMCache,
    # FlexKV, Mooncake...): only what vLLM's configuration reads from its class is modelled,
    # whether it declares SupportsHMA (kvcore/distributed/kv_transfer/kv_connector/factory.py);
    # no KV moves. null: none (the CPU tier and the P/D pair name their own connectors).
    kv_connector: Optional[Literal[NAMED_ONLY_CONNECTORS]] = None
    # vLLM's SchedulerConfig.disable_hybrid_kv_cache_manager: true = sliding-window layers are
    # managed as full attention (one KV cache group); null = vLLM 0.34's rule decides, from the
    # connector (kvcore/config/vllm.py); false = kept on (refused with a connector without
    # SupportsHMA on a model with several groups, where vLLM fails an assertion)
    disable_hybrid_kv_cache_manager: Optional[StrictBool] = None
    # replicas of this engine behind a router (paged_kv_lab/fleet); null: one engine
    fleet: Optional[FleetConfig] = None
    # LoRA (vLLM's names): serve the adapters of lora_modules; at most max_loras of them run in one
    # step, each of rank <= max_lora_rank (kvcore/lora/, kvcore/worker/lora_model_runner_mixin.py)
    enable_lora: StrictBool = False
    max_loras: Int = 1
    max_lora_rank: LoRARank = 16
    lora_modules: tuple[LoRAModulePath, ...] = ()
    # vLLM's ModelConfig.enable_prompt_embeds: requests may give their prompt as embedding rows
    enable_prompt_embeds: StrictBool = False


@dataclass(frozen=True)
class RequestSpec:
    __pydantic_config__ = _FORBID
    id: Annotated[StrictStr, Field(min_length=1)]
    prompt: Optional[Annotated[StrictStr, Field(min_length=1)]] = None
    prompt_token_ids: Optional[Annotated[tuple[Count, ...], Field(min_length=1)]] = None
    chat: StrictBool = False
    max_tokens: Int = 16
    arrival_step: Count = 0
    priority: Annotated[StrictInt, Field(ge=-INT64_MAX - 1, le=INT64_MAX)] = 0
    cache_salt: Optional[StrictStr] = None
    ignore_eos: StrictBool = False
    # parallel sampling (vLLM's SamplingParams.n): n child requests "0_<id>", "1_<id>", ...
    # (kvcore/engine/parallel_sampling.py)
    n: Int = 1
    # vLLM's SamplingParams.seed: sample at temperature 1 from this request's own generator
    # (child i of an n > 1 request: seed + i); None: greedy, or the engine's seed if it has one
    seed: Optional[Count] = None
    # the adapter this request runs with: a name in engine.lora_modules (vLLM's LoRARequest);
    # None: the base model
    lora_name: Optional[Annotated[StrictStr, Field(min_length=1)]] = None
    # vLLM's SamplingParams.prompt_logprobs (-1: the whole vocabulary): set, the request skips
    # reading the prefix cache (skip_reading_prefix_cache); the logprobs are not computed
    prompt_logprobs: Optional[Annotated[StrictInt, Field(ge=-1, le=INT64_MAX)]] = None
    # vLLM's SamplingParams.stop: the request finishes once its output text holds one of these
    # (kvcore/engine/detokenizer.py), the text cut before it unless include_stop_str_in_output
    stop: tuple[Annotated[StrictStr, Field(min_length=1)], ...] = ()
    include_stop_str_in_output: StrictBool = False
    # vLLM's embeddings prompt (needs engine.enable_prompt_embeds): the model is fed these rows
    # instead of token embeddings; its token ids are zeros, as vLLM's, and its blocks' hashes
    # carry each block's embedding bytes
    prompt_embeds: Optional[EmbedsSource] = None
    # vLLM's mm_features: multimodal items at placeholder ranges of the (token) prompt
    mm_features: Annotated[tuple[MultiModalItem, ...], Field(max_length=MAX_MM_ITEMS)] = ()


def prompt_text(spec: RequestSpec) -> Optional[str]:
    """The text a request's prompt is tokenized from: ``prompt``, or the text its
    ``prompt_embeds`` rows embed (None: neither, the prompt is token ids or plain rows)."""
    if spec.prompt is not None:
        return spec.prompt
    return spec.prompt_embeds.text if spec.prompt_embeds is not None else None


@dataclass(frozen=True)
class Scenario:
    __pydantic_config__ = _FORBID
    name: StrictStr = "scenario"
    description: StrictStr = ""
    model: Literal[MODELS] = "smollm2"
    device: Literal[DEVICES] = "auto"
    dtype: Literal[DTYPES] = "float32"
    engine: EngineSettings = field(default_factory=EngineSettings)
    requests: tuple[RequestSpec, ...] = ()


_SCENARIO = TypeAdapter(Scenario)


# What a field must be, said once per field: the message for any error at that path.
def _must(key: str, **fields: Any) -> Text:
    return Text(f"must.{key}", fields)


_BOOL, _STR_OR_NULL, _POSITIVE = _must("bool"), _must("string_or_null"), _must("null_or_positive")
_INT_GE1, _INT_GE0 = _must("int_ge", n=1), _must("int_ge", n=0)
_NULL_GE0, _NULL_GE1 = _must("null_or_int_ge", n=0), _must("null_or_int_ge", n=1)
_ENDPOINT = "tcp://, ipc:// or inproc://"


def _one_of(choices: tuple[str, ...]) -> Text:
    return _must("one_of", choices=", ".join(choices))


_MUST: dict[str, Text] = {
    "block_size": _INT_GE1,
    "num_gpu_blocks": _must("num_gpu_blocks"),
    "gpu_memory_utilization": _must("either", a="null", b=_must("number_in", range="(0, 1]")),
    "kv_cache_memory_bytes": _POSITIVE,
    "enable_extensible_kv_cache": _must("null_or_bool"),
    "max_num_seqs": _INT_GE1,
    "max_num_batched_tokens": _INT_GE1,
    "long_prefill_token_threshold": _INT_GE0,
    "enable_prefix_caching": _BOOL,
    "hash_algo": _one_of(HASH_ALGOS),
    "hash_seed": _STR_OR_NULL,
    "policy": _one_of(POLICIES),
    "free_order": _one_of(FREE_ORDERS),
    "admission": _one_of(ADMISSIONS),
    "sliding_window": _POSITIVE,
    "sliding_block_multiple": _POSITIVE,
    "max_model_len": _POSITIVE,
    "seed": _NULL_GE0,
    "prefix_cache_retention_interval": _NULL_GE0,
    "max_cache_hit_length": _NULL_GE0,
    "watermark": _must("number_in", range="[0, 1)"),
    "layer_types": _must("non_empty_list_of", choices=" / ".join(LAYER_TYPES)),
    "mamba_cache_mode": _one_of(MAMBA_CACHE_MODES),
    "kv_connector": _must("null_or_one_of", choices=", ".join(NAMED_ONLY_CONNECTORS)),
    "disable_hybrid_kv_cache_manager": _must("null_or_bool"),
    "prefix_match_unit": _POSITIVE,
    "id": _must("non_empty_string"),
    "prompt": _must("non_empty_string"),
    "prompt_token_ids": _must("token_ids"),
    "chat": _BOOL,
    "max_tokens": _INT_GE1,
    "num_draft_layers": _must("num_draft_layers"),
    "method": _one_of(('"ngram"', '"draft_model"', '"eagle"', '"mtp"')),
    "disable_eagle_block_drop": _BOOL,
    "disable_lookahead_block_hashes": _BOOL,
    "num_speculative_tokens": _INT_GE1,
    "prompt_lookup_min": _NULL_GE1,
    "prompt_lookup_max": _NULL_GE1,
    "arrival_step": _INT_GE0,
    "priority": _must("integer"),
    "cache_salt": _STR_OR_NULL,
    "ignore_eos": _BOOL,
    "n": _INT_GE1,
    "prompt_logprobs": _must("null_or_int_ge", n=-1),
    "stop": _must("stop_strings"),
    "include_stop_str_in_output": _BOOL,
    "model": _one_of(MODELS),
    "device": _one_of(DEVICES),
    "dtype": _one_of(DTYPES),
    "name": _must("string"),
    "description": _must("string"),
    "engine": _must("object"),
    "requests": _must("list"),
    "enable_kv_cache_events": _BOOL,
    "publisher": _must("either", a='"zmq"', b='"null"'),
    "endpoint": _must("endpoint", schemes=_ENDPOINT),
    "replay_endpoint": _must("null_or_endpoint", schemes=_ENDPOINT),
    "buffer_steps": _INT_GE1,
    "hwm": _INT_GE1,
    "max_queue_size": _INT_GE1,
    "topic": _must("string"),
    "use_int_block_hashes": _BOOL,
    "num_cpu_blocks": _must("num_cpu_blocks"),
    "lazy_offload": _BOOL,
    "kv_load_failure_policy": _must("either", a='"recompute"', b='"fail"'),
    "fail_loads": _must("request_ids"),
    "kv_transfer": _must("either", a="null", b='"pd"'),
    "kv_transfer_config": _must("object"),
    "fleet": _must("object"),
    "replicas": _must("int_in", range=f"[1, {MAX_FLEET_REPLICAS}]"),
    "router": _must("non_empty_string"),
    "router_settings": _must("object"),
    "sessions": _must("object"),
    "enable_lora": _BOOL,
    "max_loras": _INT_GE1,
    "max_lora_rank": _one_of(tuple(str(r) for r in MAX_LORA_RANKS)),
    "lora_modules": _must("lora_modules"),
    "path": _must("non_empty_string"),
    "lora_name": _must("null_or_non_empty_string"),
    "enable_prompt_embeds": _BOOL,
    "prompt_embeds": _must("null_or_object"),
    "mm_features": _must("mm_features", most=MAX_MM_ITEMS),
    "text": _must("null_or_non_empty_string"),
    "noise": _must("null_or_object"),
    "scale": _must("number_in", range=f"[0, {MAX_NOISE_SCALE}]"),
    "offset": _INT_GE0,
    "length": _INT_GE1,
    "embeds": _must("object"),
    "modality": _must("short_string", most=64),
    "identifier": _must("null_or_short_string", most=256),
}
_SECTIONS = {
    (): Scenario,
    ("engine",): EngineSettings,
    ("requests", int): RequestSpec,
    ("engine", "kv_events"): KVEventsConfig,
    ("engine", "speculative"): SpeculativeConfig,
    ("engine", "cpu_offload"): CPUOffloadConfig,
    ("engine", "kv_transfer_config"): KVTransferConfig,
    ("engine", "fleet"): FleetConfig,
    ("engine", "lora_modules", int): LoRAModulePath,
    ("requests", int, "prompt_embeds"): EmbedsSource,
    ("requests", int, "prompt_embeds", "noise"): EmbedsNoise,
    ("requests", int, "mm_features", int): MultiModalItem,
    ("requests", int, "mm_features", int, "embeds"): EmbedsSource,
    ("requests", int, "mm_features", int, "embeds", "noise"): EmbedsNoise,
}


# a field whose name another section uses for something else: its own sentence there
_MUST_IN = {
    (LoRAModulePath, "name"): _must("non_empty_string"),
    (EmbedsNoise, "seed"): _INT_GE0,
}


def _must_at(section: tuple, name: Any) -> Optional[Text]:
    """What the field ``name`` of the section at ``section`` must be (None: no sentence)."""
    return _MUST_IN.get((_section(section), name), _MUST.get(name))


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _section(loc: tuple):
    shape = tuple(int if isinstance(p, int) else p for p in loc)
    return _SECTIONS.get(shape)


# pydantic's error types a scenario or a trace file can meet, with the ctx fields their sentence
# names (catalogue keys "pydantic.<type>", whose English is pydantic's own message)
_PYDANTIC_TYPES: dict[str, tuple[str, ...]] = {
    "int_type": (),
    "int_parsing": (),
    "int_from_float": (),
    "bool_type": (),
    "string_type": (),
    "float_type": (),
    "finite_number": (),
    "list_type": (),
    "tuple_type": (),
    "dict_type": (),
    "none_required": (),
    "greater_than_equal": ("ge",),
    "greater_than": ("gt",),
    "less_than_equal": ("le",),
    "less_than": ("lt",),
    "literal_error": ("expected",),
    "too_short": ("field_type", "min_length", "actual_length"),
    "too_long": ("field_type", "max_length", "actual_length"),
    "dataclass_type": ("class_name",),
    "union_tag_invalid": ("tag", "discriminator", "expected_tags"),
    "union_tag_not_found": ("discriminator",),
}


def pydantic_said(err: dict) -> Text:
    """What a pydantic error says, as a catalogue sentence (its ctx fields as data): the entry
    for its type whose English is pydantic's message (a count of 1 and JSON input have their own
    wording in pydantic: ".one", ".json")."""
    ctx = {k: str(err.get("ctx", {}).get(k)) for k in _PYDANTIC_TYPES.get(err["type"], ())}
    for variant in ("", ".one", ".json"):
        said = Text(f"pydantic.{err['type']}{variant}", ctx)
        if err["type"] in _PYDANTIC_TYPES and tr(said, "en") == err["msg"]:
            return said
    # last resort, an error type (or a wording) not in the catalogue: pydantic's own English
    return Text("pydantic.said", {"said": err["msg"]})


def _problem(err: dict, raw: Any) -> Text:
    loc = tuple(
        p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("function-", "tagged-")))
    )
    path = _path(loc)
    if err["type"] == "unexpected_keyword_argument" or err["type"] == "extra_forbidden":
        cls = _section(loc[:-1])
        known = ", ".join(sorted(f.name for f in fields(cls))) if cls else ""
        what = "setting" if cls is EngineSettings else "field"
        return Text(f"problem.unknown_{what}", {"path": path, "known": known})
    ctx = err.get("ctx", {})
    error = ctx.get("error")
    if err["type"] == "value_error" and error is not None and isinstance(error.args[0], Text):
        return Text("problem.at", {"path": path, "problem": error.args[0]})
    # KVEventsConfig's own check (kvcore: its words are English): said again by the field it names
    if err["type"] == "value_error" and loc[:2] == ("engine", "kv_events"):
        name = str(error).partition(":")[0].rpartition(".")[2]
        at = ("engine", "kv_events", name)
        if name in _MUST:
            got = repr(_value_at(raw, at))
            return Text("problem.must", {"path": _path(at), "must": _MUST[name], "got": got})
        # last resort: kvcore's English sentence for a field we have no sentence for
        return Text("problem.said", {"path": "engine", "said": str(error)})
    if err["type"] in ("dataclass_type", "dataclass_args_type", "model_type", "dict_type"):
        return Text("problem.object", {"path": path})
    if err["type"] == "missing" or err["type"] == "missing_argument":
        must = _must_at(loc[:-1], loc[-1]) or _must("given")
        return Text("problem.must", {"path": path, "must": must, "got": "None"})
    got = _value_at(raw, loc)
    if isinstance(got, int) and INT64_MAX in (ctx.get("le"), -1 - ctx.get("ge", 0)):
        side = "most" if "le" in ctx else "least"
        bound = f"{ctx.get('le', ctx.get('ge')):,}"
        return Text(f"problem.int64_at_{side}", {"path": path, "bound": bound, "got": repr(got)})
    # Cut the path at the field (an element of a list reports the whole list).
    for i in range(len(loc) - 1, -1, -1):
        if isinstance(loc[i], str) and _section(loc[:i]) is not None:
            field_path, value = _path(loc[: i + 1]), repr(_value_at(raw, loc[: i + 1]))
            must = _must_at(loc[:i], loc[i])
            if must is not None:
                return Text("problem.must", {"path": field_path, "must": must, "got": value})
            # a field without its own sentence: pydantic's, by its error type
            at = {"path": field_path, "said": pydantic_said(err), "got": value}
            return Text("problem.pydantic", at)
    return Text("problem.at", {"path": path, "problem": pydantic_said(err)})


def _value_at(raw: Any, loc: tuple) -> Any:
    for part in loc:
        try:
            raw = raw[part]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _unknown_fail_loads(section: str, fail_loads: Any, reqs: Any) -> list[Text]:
    """A problem for each id in ``engine.<section>.fail_loads`` that no request runs with."""
    if not isinstance(fail_loads, list) or not isinstance(reqs, list):
        return []
    ids = set()
    for r in reqs:
        if isinstance(r, dict):
            n = r.get("n")
            many = isinstance(n, int) and not isinstance(n, bool) and 1 < n <= 1024
            # an n > 1 request runs as its children "0_<id>", "1_<id>"...
            ids.update([f"{k}_{r.get('id')}" for k in range(n)] if many else [r.get("id")])
    return [
        Text(
            "problem.fail_loads_unknown",
            {"path": f"engine.{section}.fail_loads[{j}]", "id": repr(rid)},
        )
        for j, rid in enumerate(fail_loads)
        if isinstance(rid, str) and rid not in ids
    ]


def _cross_checks(raw: dict) -> list[Text]:
    """Rules between fields, checked on the raw file so they are reported with the rest."""
    problems = []
    eng = raw.get("engine")
    if isinstance(eng, dict):
        lt = eng.get("layer_types")
        shape = hybrid_shape(raw.get("model")) if isinstance(raw.get("model"), str) else None
        if lt is None and shape is not None:  # a hybrid model's own layers, as the engine takes
            lt = list(shape.layer_types)
        if isinstance(lt, list) and "sliding_attention" in lt and eng.get("sliding_window") is None:
            problems.append(Text("problem.sliding_needs_window"))
        linear = isinstance(lt, list) and "linear_attention" in lt
        unit, bs0 = eng.get("prefix_match_unit"), eng.get("block_size", DEFAULT_BLOCK_SIZE)
        if isinstance(unit, int) and isinstance(bs0, int) and unit > 0 and bs0 > 0:
            if bs0 % unit:
                problems.append(Text("problem.unit_divides", {"block_size": bs0, "got": unit}))
            elif unit != bs0 and not linear:
                problems.append(Text("problem.unit_one_kind", {"block_size": bs0}))
        if linear and eng.get("enable_prefix_caching") is False:
            problems.append(Text("problem.linear_needs_caching"))
        if eng.get("enable_extensible_kv_cache") is True:  # vLLM's _resolve_extensible_kv_cache
            if eng.get("kv_cache_memory_bytes") is not None:
                problems.append(
                    Text("problem.extensible_stated", {"name": "kv_cache_memory_bytes"})
                )
            elif eng.get("num_gpu_blocks", 64) != "auto":
                problems.append(Text("problem.extensible_stated", {"name": "num_gpu_blocks"}))
        r, bs = (
            eng.get("prefix_cache_retention_interval"),
            eng.get("block_size", DEFAULT_BLOCK_SIZE),
        )
        if (
            isinstance(r, int)
            and not isinstance(r, bool)
            and isinstance(bs, int)
            and bs > 0
            and r > 0
        ):
            if r % bs:
                problems.append(Text("problem.retention_multiple", {"block_size": bs, "got": r}))
            elif eng.get("sliding_window") is None and not linear:
                problems.append(Text("problem.retention_needs_window"))
    reqs = raw.get("requests")
    problems += _lora_checks(eng if isinstance(eng, dict) else {}, reqs)
    problems += _embeds_checks(eng if isinstance(eng, dict) else {}, reqs)
    for section in ("cpu_offload", "kv_transfer_config"):
        fail_loads = eng.get(section) if isinstance(eng, dict) else None
        fail_loads = fail_loads.get("fail_loads") if isinstance(fail_loads, dict) else None
        problems += _unknown_fail_loads(section, fail_loads, reqs)
    if isinstance(reqs, list):
        seen = set()
        for i, r in enumerate(reqs):
            if not isinstance(r, dict):
                continue
            given = [r.get(k) is not None for k in ("prompt", "prompt_token_ids", "prompt_embeds")]
            if sum(given) != 1:
                problems.append(Text("problem.one_prompt", {"path": f"requests[{i}]"}))
            rid = r.get("id")
            if isinstance(rid, str) and rid:
                if rid in seen:
                    problems.append(
                        Text("problem.duplicate_id", {"path": f"requests[{i}].id", "id": repr(rid)})
                    )
                seen.add(rid)
        # an n > 1 request runs as children "0_<id>", "1_<id>"...: no id may be used twice
        n_of = {
            r["id"]: r.get("n")
            for r in reqs
            if isinstance(r, dict) and isinstance(r.get("id"), str)
        }
        for pid, n in n_of.items():
            if isinstance(n, int) and not isinstance(n, bool) and 1 < n <= 1024:
                clash = sorted(f"{k}_{pid}" for k in range(n) if f"{k}_{pid}" in n_of)
                if clash:
                    at = {"id": repr(pid), "n": n, "child": repr(clash[0])}
                    problems.append(Text("problem.child_id_taken", at))
    return problems


def _lora_checks(eng: dict, reqs: Any) -> list[Text]:
    """LoRA's rules between fields: adapters need ``enable_lora`` (vLLM refuses
    ``--lora-modules`` without it), names are unique, and a request names a served adapter."""
    problems = []
    modules = eng.get("lora_modules")
    modules = modules if isinstance(modules, list) else []
    names = [m.get("name") for m in modules if isinstance(m, dict)]
    for j, name in enumerate(names):
        if isinstance(name, str) and name in names[:j]:
            at = {"path": f"engine.lora_modules[{j}].name", "name": repr(name)}
            problems.append(Text("problem.lora_name_twice", at))
    if modules and eng.get("enable_lora") is not True:
        problems.append(Text("problem.lora_modules_need_enable"))
    for i, r in enumerate(reqs if isinstance(reqs, list) else []):
        name = r.get("lora_name") if isinstance(r, dict) else None
        if isinstance(name, str) and name and name not in names:
            at = {"path": f"requests[{i}].lora_name", "name": repr(name)}
            at["known"] = ", ".join(repr(n) for n in names if isinstance(n, str)) or "-"
            problems.append(Text("problem.lora_name_unknown", at))
    return problems


def _embeds_checks(eng: dict, reqs: Any) -> list[Text]:
    """Rules of embedding prompts and multimodal items: ``prompt_embeds`` needs
    ``engine.enable_prompt_embeds`` (vLLM refuses it otherwise) and a text to count its rows;
    multimodal items sit in a token prompt, inside it, and their ranges do not overlap."""
    problems = []
    for i, r in enumerate(reqs if isinstance(reqs, list) else []):
        if not isinstance(r, dict):
            continue
        embeds = r.get("prompt_embeds")
        if embeds is not None:
            at = {"path": f"requests[{i}].prompt_embeds"}
            if eng.get("enable_prompt_embeds") is not True:
                problems.append(Text("problem.prompt_embeds_need_enable", at))
            if isinstance(embeds, dict) and embeds.get("text") is None:
                problems.append(Text("problem.prompt_embeds_need_text", at))
        items = r.get("mm_features")
        if not isinstance(items, list):
            continue
        if items and embeds is not None:
            problems.append(Text("problem.mm_needs_tokens", {"path": f"requests[{i}].mm_features"}))
        ids = r.get("prompt_token_ids")
        ranges = []
        for j, item in enumerate(items):
            offset = item.get("offset") if isinstance(item, dict) else None
            length = item.get("length") if isinstance(item, dict) else None
            if not all(type(v) is int and v >= 0 for v in (offset, length)):
                continue  # the schema reports it
            ranges.append((offset, offset + length, j))
            if isinstance(ids, list) and offset + length > len(ids):
                at = {"path": f"requests[{i}].mm_features[{j}]", "end": offset + length}
                problems.append(Text("problem.mm_outside", {**at, "tokens": len(ids)}))
        ranges.sort()
        for (_, end, j), (start, _, k) in zip(ranges, ranges[1:]):
            if start < end:
                at = {"path": f"requests[{i}].mm_features[{k}]", "other": f"mm_features[{j}]"}
                problems.append(Text("problem.mm_overlap", at))
    return problems


def _problem_order(problem: Text) -> tuple:
    """File order: top-level fields, then engine, then requests by index."""
    problem = tr(problem, "en")
    m = re.match(r"requests\[(\d+)\]", problem)
    if m:
        return (2, int(m.group(1)))
    return (1,) if problem.startswith("engine") else (0,)


def _upgrade(raw: dict) -> dict:
    """Read old setting names as the vLLM ones that replaced them."""
    eng = raw.get("engine")
    if not isinstance(eng, dict) or "sliding_retention" not in eng:
        return raw
    eng = dict(eng)
    old = eng.pop("sliding_retention")
    if old not in LEGACY_RETENTION:
        raise ScenarioError([Text("problem.sliding_retention_value", {"got": repr(old)})])
    if "prefix_cache_retention_interval" in eng:
        raise ScenarioError([Text("problem.sliding_retention_both")])
    eng["prefix_cache_retention_interval"] = LEGACY_RETENTION[old]
    return {**raw, "engine": eng}


def model_page_sizes(model: Any, dtype: Any) -> Optional[HybridPageSizes]:
    """The page arithmetic vLLM 0.34 does for a hybrid ``model`` in ``dtype`` when its block size
    is left out (``HybridPageSizes.block_size``: from ``CacheConfig.DEFAULT_BLOCK_SIZE``, 64,
    the attention block raised until its page holds a gated delta-net state;
    ``Platform._align_hybrid_block_size`` on a GPU whose attention backend keeps 64, see
    ``kvcore.model.memory.DEFAULT_BLOCK_SIZE``); None for a model without linear-attention
    layers or a name or dtype that is not one. vLLM 0.33 started from 16, so its sizes could be
    smaller (tiny-hybrid: 32, not 64)."""
    shape = hybrid_shape(model) if isinstance(model, str) else None
    if shape is None or dtype not in DTYPES:
        return None
    return hybrid_page_sizes(shape, dtype)


def block_size_note(s: Scenario) -> Optional[Text]:
    """What vLLM does with this scenario's block size on its hybrid model, as a catalogue
    sentence with vLLM's source beside it: the size resolved from the model (the one a scenario
    that leaves ``block_size`` out runs at, see :func:`model_page_sizes`), a stated size vLLM
    0.34 keeps, or one it would raise (kvcore keeps a stated size); None
    for a model without linear-attention layers."""
    resolved = model_page_sizes(s.model, s.dtype)
    if resolved is None:
        return None
    bs = s.engine.block_size
    at = hybrid_page_sizes(hybrid_shape(s.model), s.dtype, block_size=bs)
    fields = {
        "block_size": bs,
        "model": s.model,
        "dtype": s.dtype,
        "attn": resolved.attn_bytes_per_token,
        "state": resolved.state_bytes,
        "resolved": resolved.block_size,
        "page": resolved.page_bytes,
        "vllm": at.block_size,
        "source": "vllm/platforms/interface.py: Platform._align_hybrid_block_size",
    }
    if bs == resolved.block_size:
        return Text("block_size.resolved", fields)
    return Text("block_size.kept" if at.block_size == bs else "block_size.raised", fields)


def resolve_from_model(raw: dict) -> dict:
    """The raw scenario with the settings it leaves out resolved as vLLM resolves them: a hybrid
    model's ``block_size`` (:func:`model_page_sizes`: vLLM 0.34's size on a GPU), and
    ``num_gpu_blocks`` "auto" when ``kv_cache_memory_bytes`` states the KV budget (the engine
    divides it by one block of the pool, as ``kvcore.model.memory.num_gpu_blocks_from_profile``
    does). Anything not resolvable is left for validation to report."""
    eng = raw.get("engine", {})
    if not isinstance(eng, dict):
        return raw
    eng = dict(eng)
    if "block_size" not in eng:
        sizes = model_page_sizes(raw.get("model", "smollm2"), raw.get("dtype", "float32"))
        if sizes is not None:
            eng["block_size"] = sizes.block_size
    if "num_gpu_blocks" not in eng and eng.get("kv_cache_memory_bytes") is not None:
        eng["num_gpu_blocks"] = "auto"
    return {**raw, "engine": eng}


def load_scenario(source: Union[dict, str, Path], top: Optional[dict[str, Any]] = None) -> Scenario:
    """Parse and validate a scenario from a dict, a JSON string, or a path to a JSON file.
    ``top``: top-level fields replacing the file's before anything is resolved from the model
    (the CLI's ``--model`` / ``--device``)."""
    if isinstance(source, Path) or (
        isinstance(source, str) and not source.lstrip().startswith(("{", "["))
    ):
        try:
            text = Path(source).read_text(encoding="utf-8")
        except OSError as e:
            at = {"source": str(source), "error": e.strerror or str(e)}
            raise ScenarioError([Text("problem.cannot_read", at)]) from None
        source = text
    if isinstance(source, (str, bytes)):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as e:
            at = {"line": e.lineno, "column": e.colno, "error": e.msg}
            raise ScenarioError([Text("problem.json", at)]) from None
    if not isinstance(source, dict):
        raise ScenarioError([Text("problem.top_not_object")])
    if top:  # the file is refused for its own fields, whatever replaces them
        load_scenario(source)
    source = resolve_from_model(_upgrade({**source, **(top or {})}))
    problems: list[Text] = []
    scenario = None
    seen: set[str] = set()  # each problem once (by its repr: a long list of bad items is fast)

    def new(p: Text) -> bool:
        key = repr(p)
        fresh = key not in seen
        seen.add(key)
        return fresh

    try:
        scenario = _SCENARIO.validate_python(source)
    except ValidationError as e:
        problems += [p for p in (_problem(err, source) for err in e.errors()) if new(p)]
    problems += [p for p in _cross_checks(source) if new(p)]
    problems.sort(key=_problem_order)
    if problems:
        raise ScenarioError(problems)
    return scenario


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


# Engine settings added after the lessons' runs were recorded: left out of the file format at
# their defaults, so a recorded run (whose header holds the scenario) stays byte for byte.
_LATER_ENGINE_DEFAULTS = {
    "kv_cache_memory_bytes": None,
    "enable_extensible_kv_cache": None,
    "mamba_cache_mode": "none",
    "prefix_match_unit": None,
    "kv_transfer": None,
    "kv_transfer_config": None,
    "fleet": None,
    "enable_lora": False,
    "max_loras": 1,
    "max_lora_rank": 16,
    "lora_modules": [],
    "enable_prompt_embeds": False,
    "kv_connector": None,
    "disable_hybrid_kv_cache_manager": None,
}
# The same for settings inside engine.speculative.
_LATER_SPECULATIVE_DEFAULTS = {
    "disable_eagle_block_drop": False,
    "disable_lookahead_block_hashes": False,
}


def scenario_to_dict(s: Scenario) -> dict:
    """The scenario in its file format (defaults of requests left out for readability)."""
    d = _plain(asdict(s))
    for key, default in _LATER_ENGINE_DEFAULTS.items():
        if d["engine"].get(key, default) == default:
            d["engine"].pop(key, None)
    speculative = d["engine"].get("speculative")
    for key, default in _LATER_SPECULATIVE_DEFAULTS.items():
        if speculative is not None and speculative.get(key, default) == default:
            speculative.pop(key, None)
    default_req = asdict(RequestSpec(id=""))
    d["requests"] = [
        {k: v for k, v in r.items() if k == "id" or v != _plain(default_req[k])}
        for r in d["requests"]
    ]
    return d


def parse_engine_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (the CLI's ``--set``) as engine settings; a value is read as JSON
    (``null``, ``0.1``, ``"x"``) and otherwise taken as text. ScenarioError names a bad pair."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ScenarioError([Text("problem.set_pair", {"pair": repr(pair)})])
        key = key.strip()
        if isinstance(getattr(EngineSettings, key, None), str) and value != "null":
            out[key] = value  # a text setting stays text: hash_seed=0 is the seed "0"
            continue
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def with_engine_overrides(s: Scenario, overrides: dict[str, Any]) -> Scenario:
    """The scenario with some engine settings replaced, validated like a file (problems with
    paths)."""
    d = scenario_to_dict(s)
    d["engine"] = {**d["engine"], **overrides}
    return load_scenario(d)
