"""KV-cache memory arithmetic (pure Python: no torch import, so pages can call it freely):
bytes per block, blocks per budget, and num_gpu_blocks from a memory profile.

One *block* holds ``block_size`` tokens of K and V for every decoder layer:

    bytes_per_block = block_size * num_layers * 2 (K and V) * num_kv_heads * head_dim * dtype_bytes

e.g. SmolLM2-135M (30 layers, 3 KV heads, head_dim 64) in float32 with 16-token blocks:
16 * 30 * 2 * 3 * 64 * 4 = 737,280 bytes (720 KiB) per block.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from kvcore.utils.math_utils import cdiv

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float64": 8,
    "double": 8,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "int8": 1,
    "uint8": 1,
}


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of a dtype given as ``"float32"``, ``torch.float32`` or an int (already
    bytes)."""
    if isinstance(dtype, int):
        if dtype <= 0:
            raise ValueError(f"dtype bytes must be positive, got {dtype}")
        return dtype
    itemsize = getattr(dtype, "itemsize", None)  # torch.dtype has .itemsize
    if isinstance(itemsize, int) and not isinstance(dtype, str):
        return itemsize
    name = str(dtype).removeprefix("torch.")
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(
            f"unknown dtype {dtype!r}; known: {', '.join(sorted(DTYPE_BYTES))}"
        ) from None


def bytes_per_block_dims(
    block_size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype: Any = "float32"
) -> int:
    """The int-only variant: bytes of one KV block across all layers."""
    for name, v in (
        ("block_size", block_size),
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
    ):
        if int(v) <= 0:
            raise ValueError(f"{name} must be positive, got {v}")
    return (
        int(block_size)
        * int(num_layers)
        * 2
        * int(num_kv_heads)
        * int(head_dim)
        * dtype_bytes(dtype)
    )


def model_dims(config: Any) -> tuple[int, int, int]:
    """(num_layers, num_kv_heads, head_dim) of a transformers config (or anything with those
    fields)."""
    n_layers = int(config.num_hidden_layers)
    n_heads = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return n_layers, n_kv, int(head_dim)


def bytes_per_block(config: Any, block_size: int, dtype: Any = "float32") -> int:
    """Bytes of one KV block (``block_size`` tokens, all layers, K and V)."""
    n_layers, n_kv, head_dim = model_dims(config)
    return bytes_per_block_dims(block_size, n_layers, n_kv, head_dim, dtype)


def blocks_for_budget_dims(
    block_size: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: Any,
    budget_bytes: int,
) -> int:
    """How many whole blocks fit in ``budget_bytes`` (int-only variant)."""
    if budget_bytes < 0:
        raise ValueError("budget_bytes must be >= 0")
    return int(budget_bytes) // bytes_per_block_dims(
        block_size, num_layers, num_kv_heads, head_dim, dtype
    )


def blocks_for_budget(config: Any, block_size: int, dtype: Any, budget_bytes: int) -> int:
    """How many whole blocks fit in ``budget_bytes``."""
    if budget_bytes < 0:
        raise ValueError("budget_bytes must be >= 0")
    return int(budget_bytes) // bytes_per_block(config, block_size, dtype)


# ---------------------------------------------------------------------------------------------
# where num_gpu_blocks comes from: a profile of the loaded model, then vLLM's arithmetic
# ---------------------------------------------------------------------------------------------

GiB = 1 << 30
CPU_KVCACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"


@dataclass(frozen=True)
class MemoryProfile:
    """What profiling the loaded model measured on its device, in bytes.

    total_memory: the device's memory (CUDA: ``torch.cuda.mem_get_info``'s total; CPU: the
    machine's physical memory).  weights_memory: the model's parameters and buffers.
    peak_activation_memory: the peak, above what was allocated before, of memory allocated
    during one forward of ``max_num_batched_tokens`` tokens (CUDA: the allocator's peak
    statistics; CPU: the peak of live tensor bytes that forward's ops created).
    other_memory: the rest this process holds that is neither weights nor KV cache (CUDA: the
    device's used memory outside torch's allocator -- the CUDA context, and other processes;
    CPU: the process's resident memory minus the weights -- Python, libraries, the runner's
    packed weight copies).  process_memory: the process's resident memory (CPU), as vLLM's CPU
    worker reads it; 0 on CUDA.
    """

    device: str
    model: str
    dtype: str
    max_num_batched_tokens: int
    total_memory: int
    weights_memory: int
    peak_activation_memory: int
    other_memory: int
    process_memory: int = 0
    seconds: float = 0.0
    # what the extensible KV cache measures after the model's warm-up (None: not measured).
    # free_memory: the device's free memory then (CUDA: mem_get_info's free after emptying
    # torch's cache; CPU, where nothing reserves device memory: the machine's available memory,
    # psutil's, stands for it). init_free_memory: the free memory before the engine took any,
    # as vLLM's worker snapshots it at start (CUDA: the free memory plus what torch holds; CPU:
    # the available memory plus the process's resident memory).
    init_free_memory: int | None = None
    free_memory: int | None = None

    @property
    def non_kv_cache_memory(self) -> int:
        return self.weights_memory + self.peak_activation_memory + self.other_memory


@dataclass(frozen=True)
class KVCacheSizing:
    """num_gpu_blocks from a :class:`MemoryProfile`, as vLLM derives it from its profiling
    estimate (0.33, and 0.34 where its extensible KV cache is off):

        requested_memory          = ceil(total_memory * gpu_memory_utilization)
        available_kv_cache_memory = requested_memory - weights - peak activations - other
                                    (kv_cache_memory_bytes instead, when stated)
        num_gpu_blocks            = available_kv_cache_memory // bytes_per_block
                                    (null block included; a hybrid model's block: one KV
                                    cache group's pages, hybrid_bytes_per_block)
        max_concurrency           = num_gpu_blocks / blocks_per_request
                                    (ceil(max_model_len / block_size) in each attention
                                    group, plus a hybrid model's state blocks)

    (``gpu_worker.determine_available_memory`` and ``kv_cache_utils``;
    ``max_concurrency`` equals ``num_gpu_blocks * block_size / max_model_len`` when block_size
    divides max_model_len.)  Beside it, vLLM's CPU backend's own rule: the KV cache gets
    ``VLLM_CPU_KVCACHE_SPACE`` GiB when that variable is set, else
    ``ceil(total_memory * gpu_memory_utilization) - process_memory``; it does not profile a forward.

    vLLM 0.34's extensible KV cache (``enable_extensible_kv_cache`` True: the default on CUDA and
    ROCm unless ``kv_cache_memory_bytes`` is stated, kvcore/config/vllm.py) takes another path.
    The estimate above, with an unset ``gpu_memory_utilization`` resolved to 1.0, is only the
    capacity reserved in virtual memory (``capacity_blocks``); after the warm-up the count is what
    fits in the memory measured free then (kvcore/worker/extensible_kv_cache.py:
    ``measure_kv_cache_bytes``, with the profiled activation peak kept free and nothing
    committed), never above that capacity (``finalize_extensible_kv_cache``, one worker):

        num_gpu_blocks = min(measure_kv_cache_bytes(...) // bytes_per_block, capacity_blocks)

    ``sizing_path`` says which path gave ``num_gpu_blocks``: "estimate" or "measured".
    """

    profile: MemoryProfile
    gpu_memory_utilization: float
    block_size: int
    bytes_per_block: int
    max_model_len: int
    cpu_kvcache_space_gib: int | None = None  # VLLM_CPU_KVCACHE_SPACE as read, or None
    # vLLM's CacheConfig.kv_cache_memory_bytes: the KV cache's size as stated; when set it is the
    # available memory and gpu_memory_utilization is not used
    kv_cache_memory_bytes: int | None = None
    # a hybrid model (hybrid_group_counts): its attention groups, and the state blocks its
    # Mamba groups hold for a request; attention-only: one group, no state blocks
    num_attention_groups: int = 1
    num_state_blocks_per_request: int = 0
    # an attention-only model's blocks for one request of max_model_len, summed over its KV
    # cache groups (a sliding-window group's capped by its window); None: one full-attention
    # group's, ceil(max_model_len / block_size)
    group_blocks_per_request: int | None = None
    # vLLM 0.34's CacheConfig.enable_extensible_kv_cache as resolved (kvcore/config/vllm.py), and
    # gpu_memory_utilization as stated (None: resolved, 1.0 or 0.92)
    enable_extensible_kv_cache: bool = False
    stated_gpu_memory_utilization: float | None = None

    @property
    def sizing_path(self) -> str:
        """ "measured": the extensible KV cache's count, from the memory free after warm-up;
        "estimate": the profiling estimate's (extensible off, or nothing measured)."""
        measured = self.profile.free_memory is not None
        return "measured" if self.enable_extensible_kv_cache and measured else "estimate"

    @property
    def requested_memory(self) -> int:
        return math.ceil(self.profile.total_memory * self.gpu_memory_utilization)

    @property
    def available_kv_cache_memory(self) -> int:
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        return self.requested_memory - self.profile.non_kv_cache_memory

    @property
    def estimate_num_gpu_blocks(self) -> int:
        """The profiling estimate's count: the pool without the extensible KV cache, and the
        capacity it reserves with it."""
        return max(self.available_kv_cache_memory, 0) // self.bytes_per_block

    @property
    def capacity_blocks(self) -> int:
        return self.estimate_num_gpu_blocks

    @property
    def measured_kv_cache_memory(self) -> int | None:
        """The bytes ``measure_kv_cache_bytes`` gives from the memory free after warm-up; None
        when the profile measured none."""
        from kvcore.worker.extensible_kv_cache import measure_kv_cache_bytes

        p = self.profile
        if p.free_memory is None or p.init_free_memory is None:
            return None
        return measure_kv_cache_bytes(
            init_free_memory=p.init_free_memory,
            free_memory=p.free_memory,
            committed_bytes=0,
            requested_memory=self.requested_memory,
            transient_peak_bytes=p.peak_activation_memory,
        )

    @property
    def measured_num_blocks(self) -> int | None:
        """The blocks one worker reports after warm-up (``CompilationTimes.num_kv_blocks``)."""
        measured = self.measured_kv_cache_memory
        if measured is None:
            return None
        return min(measured // self.bytes_per_block, self.capacity_blocks)

    @property
    def num_gpu_blocks(self) -> int:
        if self.sizing_path == "measured":
            return min(self.measured_num_blocks, self.capacity_blocks)
        return self.estimate_num_gpu_blocks

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request of ``max_model_len`` tokens takes from the pool, summed over the
        KV cache groups (vLLM's ``get_max_concurrency_for_kv_cache_config``)."""
        if self.group_blocks_per_request is not None:
            return self.group_blocks_per_request
        attention = self.num_attention_groups * cdiv(self.max_model_len, self.block_size)
        return attention + self.num_state_blocks_per_request

    @property
    def max_concurrency(self) -> float:
        return self.num_gpu_blocks / self.blocks_per_request

    @property
    def cpu_backend_gpu_memory_utilization(self) -> float:
        """The utilization vLLM's CPU backend uses: the stated one, else 0.92 (the extensible KV
        cache is only for CUDA and ROCm, so an unset utilization resolves without it)."""
        from kvcore.config.cache import CacheConfig

        stated = self.stated_gpu_memory_utilization
        return CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION if stated is None else stated

    @property
    def cpu_backend_kv_cache_memory(self) -> int:
        if self.cpu_kvcache_space_gib is not None:
            return self.cpu_kvcache_space_gib * GiB
        requested = math.ceil(self.profile.total_memory * self.cpu_backend_gpu_memory_utilization)
        return requested - self.profile.process_memory

    @property
    def cpu_backend_num_blocks(self) -> int:
        return max(self.cpu_backend_kv_cache_memory, 0) // self.bytes_per_block

    def lines(self) -> list[str]:
        """The derivation, one step a line, for the CLI and the app."""
        p = self.profile

        def gib(n: int) -> str:
            return f"{n / GiB:.3f} GiB ({n:,} bytes)"

        rule = (
            f"{CPU_KVCACHE_SPACE_ENV}={self.cpu_kvcache_space_gib} GiB"
            if self.cpu_kvcache_space_gib is not None
            else f"ceil(total x {self.cpu_backend_gpu_memory_utilization}) "
            f"- process RSS {gib(p.process_memory)}"
        )
        out = [
            f"memory profile of {p.model} ({p.dtype}) on {p.device}, one forward of "
            f"{p.max_num_batched_tokens} tokens (max_num_batched_tokens), {p.seconds:.1f} s",
            f"  total memory               {gib(p.total_memory)}",
            f"  x gpu_memory_utilization   {self.gpu_memory_utilization} "
            f"= requested {gib(self.requested_memory)}",
            f"  - weights                  {gib(p.weights_memory)}",
            f"  - peak activations         {gib(p.peak_activation_memory)}",
            f"  - other (non-torch / rest) {gib(p.other_memory)}",
            f"  = available for KV cache   {gib(self.available_kv_cache_memory)}"
            + (
                " (kv_cache_memory_bytes as stated; gpu_memory_utilization unused)"
                if self.kv_cache_memory_bytes is not None
                else ""
            ),
            f"  / bytes per block          {self.bytes_per_block:,} (block_size {self.block_size})",
            f"  = num_gpu_blocks           {self.estimate_num_gpu_blocks:,} "
            "(block 0, the null block, included)"
            + (" = capacity reserved" if self.sizing_path == "measured" else ""),
            f"  max concurrency            {self.num_gpu_blocks:,} / "
            + (
                f"({self.num_attention_groups} x ceil({self.max_model_len} / {self.block_size})"
                f" + {self.num_state_blocks_per_request} state blocks)"
                if self.num_state_blocks_per_request
                else f"{self.group_blocks_per_request} (blocks of the KV cache groups)"
                if self.group_blocks_per_request is not None
                else f"ceil({self.max_model_len} / {self.block_size})"
            )
            + f" = {self.max_concurrency:.2f} requests of max_model_len {self.max_model_len}",
        ]
        if self.sizing_path == "measured":
            out[-1:-1] = [
                f"  after warm-up: free {gib(p.free_memory)} of {gib(p.init_free_memory)} "
                f"free at start, peak {gib(p.peak_activation_memory)} kept free",
                f"  measure_kv_cache_bytes     {gib(self.measured_kv_cache_memory)}",
                f"  = num_gpu_blocks           min({self.measured_num_blocks:,}, "
                f"{self.capacity_blocks:,}) = {self.num_gpu_blocks:,} (measured)",
            ]
        if p.device.startswith("cpu"):
            out.append(
                f"  vLLM's CPU backend instead: KV cache = {rule} = "
                f"{gib(self.cpu_backend_kv_cache_memory)} -> {self.cpu_backend_num_blocks:,} blocks"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in (
            "requested_memory",
            "available_kv_cache_memory",
            "sizing_path",
            "estimate_num_gpu_blocks",
            "measured_kv_cache_memory",
            "num_gpu_blocks",
            "max_concurrency",
            "cpu_backend_kv_cache_memory",
            "cpu_backend_num_blocks",
        ):
            d[name] = getattr(self, name)
        return d


def cpu_kvcache_space_gib(environ: Any = None) -> int | None:
    """``VLLM_CPU_KVCACHE_SPACE`` (GiB) as vLLM's CPU platform reads it; None when unset or
    empty."""
    import os

    raw = (os.environ if environ is None else environ).get(CPU_KVCACHE_SPACE_ENV, "")
    if raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"{CPU_KVCACHE_SPACE_ENV} must be a whole number of GiB; got {raw!r}"
        ) from None


def num_gpu_blocks_from_profile(
    profile: MemoryProfile,
    config: Any,
    block_size: int,
    dtype: Any,
    gpu_memory_utilization: float | None,
    max_model_len: int,
    environ: Any = None,
    kv_cache_memory_bytes: int | None = None,
    layers_per_block: int | None = None,
    group_blocks_per_request: int | None = None,
    enable_extensible_kv_cache: bool | None = None,
) -> KVCacheSizing:
    """The :class:`KVCacheSizing` of ``profile`` for these settings (pure arithmetic).
    ``layers_per_block``: an attention-only model's block holds a page for this many layers (the
    largest KV cache group's, as vLLM 0.34.0 sizes a block); None: every layer's.
    ``group_blocks_per_request``: its KV cache groups' blocks for one request of
    ``max_model_len`` (vLLM's ``get_max_concurrency_for_kv_cache_config``); None: one group's.
    ``gpu_memory_utilization`` None and ``enable_extensible_kv_cache`` None (vLLM 0.34.0's
    defaults): resolved as vLLM resolves them on a GPU (kvcore/config/cache.py,
    kvcore/config/vllm.py). The extensible path needs a profile that measured the memory free
    after warm-up (``profile_model``'s do); without one the estimate gives the count."""
    from kvcore.config.cache import CacheConfig
    from kvcore.config.vllm import resolve_enable_extensible_kv_cache

    cache = CacheConfig(
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        enable_extensible_kv_cache=enable_extensible_kv_cache,
    )
    extensible = resolve_enable_extensible_kv_cache(cache)
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1; got {max_model_len}")
    hybrid = is_hybrid_config(config)
    return KVCacheSizing(
        profile,
        float(cache.resolved_gpu_memory_utilization),
        int(block_size),
        # a hybrid model's pool: one block is a KV cache group's pages, as vLLM divides it
        hybrid_bytes_per_block(config, block_size, dtype)
        if hybrid
        else _attention_bytes_per_block(config, block_size, dtype, layers_per_block),
        int(max_model_len),
        cpu_kvcache_space_gib(environ),
        kv_cache_memory_bytes,
        *(hybrid_group_counts(config) if hybrid else (1, 0)),
        None if hybrid else group_blocks_per_request,
        extensible,
        gpu_memory_utilization,
    )


def _attention_bytes_per_block(
    config: Any, block_size: int, dtype: Any, layers_per_block: int | None
) -> int:
    if layers_per_block is None:
        return bytes_per_block(config, block_size, dtype)
    _, n_kv, head_dim = model_dims(config)
    return bytes_per_block_dims(block_size, layers_per_block, n_kv, head_dim, dtype)


@dataclass(frozen=True)
class HybridPageSizes:
    """How vLLM 0.34 (as 0.33) sizes the one pool a hybrid (gated delta-net + full attention)
    model shares (``Platform._align_hybrid_block_size``), for one layer of each kind: an
    attention page is ``block_size`` tokens of one layer's K and V, a state page one linear
    layer's conv and recurrent states (``MambaStateShapeCalculator.gated_delta_net_state_shape``:
    conv ``[conv_dim, conv_kernel - 1]``, recurrent ``[num_v_heads, head_v_dim, head_k_dim]``;
    0.34 rounds each state up to ``mamba_state_alignment`` bytes, which is 1 unless
    ``VllmConfig.use_flashinfer_replayssm``). Invariant:
    ``block_size * attn_bytes_per_token == page_bytes >= state_bytes``."""

    attn_bytes_per_token: int
    conv_state_bytes: int
    recurrent_state_bytes: int
    block_size: int  # the attention block size vLLM raises the setting to
    page_bytes: int  # one page of either kind; a state page is padded up to it

    @property
    def state_bytes(self) -> int:
        return self.conv_state_bytes + self.recurrent_state_bytes

    @property
    def padding_bytes(self) -> int:
        return self.page_bytes - self.state_bytes


# vLLM 0.34's CacheConfig.DEFAULT_BLOCK_SIZE (0.33's was 16): the block size vLLM gives a model
# on a GPU when --block-size is not set. ``update_block_size_for_backend`` keeps it when every
# attention backend accepts it (FlashAttention and FlashInfer take any multiple of 16), a backend
# with other kernel sizes (FlashAttention 4 for some head sizes, MLA backends) starts from its own
# preferred size instead, and ``Platform._align_hybrid_block_size`` then raises a hybrid model's
# until its page holds a state. vLLM's CPU platform starts from 128 instead; the lab models a GPU
# server whichever device runs the model, so its unset size is the GPU's, 64 (a scenario's
# ``engine.block_size`` left out, ``profile`` without --block-size).
DEFAULT_BLOCK_SIZE = 64


def hybrid_page_sizes(
    config: Any,
    dtype: Any,
    ssm_dtype: Any = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kernel_block_alignment: int = 16,
    prefill_checkpoint_alignment: int | None = None,
) -> HybridPageSizes:
    """The page arithmetic of a Qwen3.5 / Qwen3-Next style config (``linear_*`` fields) at one
    GPU (no tensor parallelism): K/V and conv states in ``dtype``, recurrent states in
    ``ssm_dtype`` (vLLM's ``mamba_ssm_cache_dtype``; default: the config's ``mamba_ssm_dtype``
    as vLLM's Qwen3.5 config reads it, else ``dtype``). The block size starts at ``block_size``
    and is raised as ``align_hybrid_block_size`` raises it (``prefill_checkpoint_alignment``:
    see there). With the defaults this is the block size vLLM 0.34 resolves on a GPU when
    ``block_size`` is left out (FlashAttention's kernel alignment of 16; from 64, a checkpoint
    alignment of 64 changes nothing)."""
    from kvcore.platforms.interface import align_hybrid_block_size

    if ssm_dtype is None:
        ssm_dtype = getattr(config, "mamba_ssm_dtype", None)
    kv_heads, head_dim = model_dims(config)[1:]
    attn = 2 * kv_heads * head_dim * dtype_bytes(dtype)
    key_dim = config.linear_key_head_dim * config.linear_num_key_heads
    conv_dim = 2 * key_dim + config.linear_value_head_dim * config.linear_num_value_heads
    conv = conv_dim * (config.linear_conv_kernel_dim - 1) * dtype_bytes(dtype)
    recurrent = (
        config.linear_num_value_heads
        * config.linear_value_head_dim
        * config.linear_key_head_dim
        * dtype_bytes(dtype if ssm_dtype is None else ssm_dtype)
    )
    bs, _ = align_hybrid_block_size(
        block_size,
        attn,
        conv + recurrent,
        kernel_block_alignment,
        kernel_block_alignment,
        prefill_checkpoint_alignment,
    )
    return HybridPageSizes(attn, conv, recurrent, bs, bs * attn)


def is_hybrid_config(config: Any) -> bool:
    """Whether a config has gated delta-net (linear-attention) layers, Qwen3-Next / Qwen3.5
    style (``linear_*`` fields and at least one linear layer)."""
    if getattr(config, "linear_conv_kernel_dim", None) is None:
        return False
    return num_linear_layers(config) > 0


def hybrid_bytes_per_block(
    config: Any, block_size: int, dtype: Any = "float32", ssm_dtype: Any = None
) -> int:
    """Bytes of one block of a hybrid model's shared pool, the size vLLM 0.34 divides the KV
    budget by (``kv_cache_planning.get_kv_cache_config_from_groups``): each KV cache group holds
    ``uniform_page_group_size`` layers, every layer's page has one size (an attention page of
    ``block_size`` tokens; a state page padded up to it), and a block is one group's pages.
    A ``block_size`` below the one vLLM would raise it to (kvcore keeps a stated size) makes
    the page the state's own size instead."""
    sizes = hybrid_page_sizes(config, dtype, ssm_dtype)
    page = max(int(block_size) * sizes.attn_bytes_per_token, sizes.state_bytes)
    return _hybrid_layers(config)[2] * page


def _hybrid_layers(config: Any) -> tuple[int, int, int]:
    """(full-attention layers, linear layers, layers per KV cache group) of a hybrid config."""
    from kvcore.core.kv_cache_planning import uniform_page_group_size

    linear = num_linear_layers(config)
    full = int(config.num_hidden_layers) - linear
    return full, linear, uniform_page_group_size([n for n in (linear, full) if n])


# the state blocks a Mamba group holds for a request (MambaSpec.max_memory_usage_bytes, with no
# speculative or prefill-checkpoint blocks): the running state and, in align mode, the last one
STATE_BLOCKS = {"align": 2, "none": 1}


def hybrid_group_counts(config: Any, mamba_cache_mode: str = "align") -> tuple[int, int]:
    """(attention groups, state blocks per request) of a hybrid config's KV cache groups (its
    Mamba groups in align mode by default, as a scenario with linear layers runs them)."""
    full, linear, size = _hybrid_layers(config)
    return cdiv(full, size), cdiv(linear, size) * STATE_BLOCKS[mamba_cache_mode]


def num_linear_layers(config: Any) -> int:
    """How many of a hybrid config's layers are linear attention: from ``layer_types``, else
    every layer but each ``full_attention_interval``-th (Qwen3-Next's and Qwen3.5's rule)."""
    types = getattr(config, "layer_types", None)
    if types:
        return sum(1 for t in types if t == "linear_attention")
    n = int(config.num_hidden_layers)
    return n - n // int(config.full_attention_interval)
