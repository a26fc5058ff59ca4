"""What the KV cache looks like to the manager: specs, groups, config (vLLM v1: kv_cache_interface).

Only the fields the block manager reads are kept; vLLM's byte-level fields
(heads, head size, dtype, tensors) serve the GPU allocator, which lives in
``kvcore/model``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

from kvcore.utils.math_utils import cdiv


@dataclass(frozen=True)
class KVCacheSpec:
    """One layer's cache layout: ``block_size`` tokens per block."""

    block_size: int
    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be an integer >= 1; got {self.block_size!r}")

    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> Optional[int]:
        """The most blocks one request can hold at once; None = no cap (it keeps every block)."""
        return None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "sliding_window": getattr(self, "sliding_window", None)}


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    """Every token attends to every earlier one: a request keeps all its blocks."""

    kind: ClassVar[str] = "full"


@dataclass(frozen=True)
class SlidingWindowSpec(KVCacheSpec):
    """A token attends to itself and the ``sliding_window - 1`` tokens before it."""

    sliding_window: int
    kind: ClassVar[str] = "sliding"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.sliding_window, int) or self.sliding_window < 1:
            raise ValueError(f"sliding_window must be an integer >= 1; got {self.sliding_window!r}")

    def max_admission_blocks_per_request(
        self, max_in_flight_tokens: int, max_model_len: int
    ) -> int:
        # Blocks behind the window are freed before each chunk allocates, so a request
        # never holds more than the window plus one step's tokens; +1 because the
        # window need not start on a block boundary.
        num_tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
        return cdiv(num_tokens, self.block_size) + 1


# Bytes per element of the state dtypes a MambaSpec names (kvcore's manager side has no torch).
DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}
MAMBA_CACHE_MODES = ("align", "none")  # vLLM 0.34's CacheConfig.mamba_cache_mode


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A linear-attention layer (Mamba, gated delta-net, short convolution): one fixed-size
    state per request instead of one K/V slot per token.

    A block holds one state (``shapes`` x ``dtypes``); ``block_size`` is how many tokens
    that state stands for. ``mamba_cache_mode`` "none": a request keeps one running state
    (plus ``num_speculative_blocks``) and nothing is prefix-cached; "align": the state
    after every ``block_size`` tokens lands in that position's block, so a block boundary
    can be a prefix hit (vLLM 0.34 requires "align" for prefix caching of Mamba groups).
    """

    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    page_size_padded: Optional[int] = None
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    kind: ClassVar[str] = "mamba"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ValueError(
                f"mamba_cache_mode must be one of {MAMBA_CACHE_MODES}; "
                f"got {self.mamba_cache_mode!r}"
            )
        if len(self.shapes) != len(self.dtypes):
            raise ValueError("MambaSpec needs one dtype per state shape")
        unknown = [d for d in self.dtypes if d not in DTYPE_SIZES]
        if unknown:
            raise ValueError(f"unknown state dtype(s) {unknown}; known: {sorted(DTYPE_SIZES)}")
        if not isinstance(self.num_speculative_blocks, int) or self.num_speculative_blocks < 0:
            raise ValueError("num_speculative_blocks must be an integer >= 0")
        if self.page_size_padded is not None and self.page_size_padded < self.real_page_size_bytes:
            raise ValueError("page_size_padded is smaller than the state it pads")

    @property
    def real_page_size_bytes(self) -> int:
        total = 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            n = DTYPE_SIZES[dtype]
            for dim in shape:
                n *= dim
            total += n
        return total

    @property
    def page_size_bytes(self) -> int:
        """One block's bytes: the state, or the padded page when the attention page is larger."""
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.real_page_size_bytes

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "sliding_window": None,
            "mamba_cache_mode": self.mamba_cache_mode,
        }


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers sharing one block table; the manager treats them as one layer."""

    layer_names: tuple[str, ...]
    kv_cache_spec: KVCacheSpec
    # Whether the group holds an EAGLE/MTP drafter's layers, so its hits drop their last block
    # (vLLM's kv_cache_planning flags the groups sharing a layer with the draft model).
    is_eagle_group: bool = False

    @property
    def kind(self) -> str:
        return self.kv_cache_spec.kind

    @property
    def sliding_window(self) -> Optional[int]:
        return getattr(self.kv_cache_spec, "sliding_window", None)

    def to_dict(self) -> dict:
        return self.kv_cache_spec.to_dict()


@dataclass(frozen=True)
class KVCacheConfig:
    """The whole cache: ``num_blocks`` blocks (the null block included) shared by the groups.

    Groups may differ in block size (vLLM 0.34: ``unify_kv_cache_spec_page_size`` gives a layer
    whose page is smaller a proportionally larger block, so every page has the same bytes);
    ``scheduler_block_size``, the least common multiple of the groups' sizes, is then the grain
    the scheduler and prefix-cache hits align to.

    ``prefix_cache_retention_interval`` says which full blocks of a sliding-window
    or Mamba group get a hash: None = every one, 0 = only those a later request can reach
    (vLLM's default), n > 0 = those plus a checkpoint every n tokens (n a multiple of
    ``scheduler_block_size``).
    """

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]
    prefix_cache_retention_interval: Optional[int] = 0

    def __post_init__(self) -> None:
        if not self.kv_cache_groups:
            raise ValueError("at least one KV cache group is needed")
        r = self.prefix_cache_retention_interval
        if r is None:
            return
        unit = self.scheduler_block_size
        if not isinstance(r, int) or isinstance(r, bool) or r < 0 or r % unit:
            raise ValueError(
                f"prefix_cache_retention_interval must be null or a non-negative multiple "
                f"of scheduler_block_size ({unit}); got {r!r}"
            )
        if r > 0 and not any(g.kind in ("sliding", "mamba") for g in self.kv_cache_groups):
            raise ValueError(
                "prefix_cache_retention_interval > 0 needs a sliding-window or Mamba group "
                "(full attention always hashes every full block); set it to 0 or null"
            )

    @property
    def group_block_sizes(self) -> tuple[int, ...]:
        """Each group's own block size, in group order."""
        return tuple(g.kv_cache_spec.block_size for g in self.kv_cache_groups)

    @property
    def scheduler_block_size(self) -> int:
        """The least common multiple of the groups' block sizes (vLLM 0.34's
        ``resolve_kv_cache_block_sizes``; the one size when every group shares it)."""
        return math.lcm(*self.group_block_sizes)

    @property
    def block_size(self) -> int:
        """The scheduler's block size (``scheduler_block_size``)."""
        return self.scheduler_block_size


# The kinds below are vLLM 0.34.0's ``KVCacheSpecKind`` values (kvcore has three of its kinds);
# they and the window are what KVCacheManager stamps on each BlockStored event. A spec is read by
# its class name or its ``kind``, so vLLM's own spec classes read the same (kvcore's Scheduler
# under vLLM's scheduler tests).
def get_kv_cache_spec_kind(kv_cache_spec) -> str:
    """The spec's kind as vLLM's KV events name it: "full_attention", "sliding_window",
    "mamba", or "unknown" for a kind kvcore does not model."""
    kind = getattr(kv_cache_spec, "kind", None)
    name = type(kv_cache_spec).__name__
    if name == "SlidingWindowSpec" or kind in ("sliding", "sliding_window"):
        return "sliding_window"
    if name == "FullAttentionSpec" or kind in ("full", "full_attention"):
        return "full_attention"
    if name == "MambaSpec" or kind == "mamba":
        return "mamba"
    return "unknown"


def get_kv_cache_spec_sliding_window(kv_cache_spec) -> Optional[int]:
    """The window of a sliding-window spec; None for full attention and Mamba. (A kind kvcore
    does not model keeps its own ``sliding_window``, if it has one.)"""
    if get_kv_cache_spec_kind(kv_cache_spec) in ("full_attention", "mamba"):
        return None
    return getattr(kv_cache_spec, "sliding_window", None)


def full_attention(block_size: int, layer_names: tuple[str, ...] = ("full",)) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(layer_names, FullAttentionSpec(block_size))


def sliding_window(
    block_size: int, window: int, layer_names: tuple[str, ...] = ("sliding",)
) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(layer_names, SlidingWindowSpec(block_size, window))


def mamba(
    block_size: int,
    mamba_cache_mode: str = "align",
    shapes: tuple[tuple[int, ...], ...] = ((1,),),
    dtypes: tuple[str, ...] = ("float32",),
    num_speculative_blocks: int = 0,
    layer_names: tuple[str, ...] = ("mamba",),
) -> KVCacheGroupSpec:
    return KVCacheGroupSpec(
        layer_names,
        MambaSpec(
            block_size,
            shapes=shapes,
            dtypes=dtypes,
            mamba_cache_mode=mamba_cache_mode,
            num_speculative_blocks=num_speculative_blocks,
        ),
    )
