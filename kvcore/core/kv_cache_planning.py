"""Planning the KV cache's groups from the layers' specs (vLLM 0.34.0: v1/core/kv_cache_planning.py;
0.33.0 kept these functions in the same file).

kvcore models two of that file's decisions: how many layers share one KV cache group of a hybrid
model (``uniform_page_group_size``), and what becomes of the layers' specs when the hybrid KV
cache manager is off (``unify_hybrid_kv_cache_specs``). Both are pure functions of the specs
or of the layer counts; the rest of vLLM's planning (memory per block, the number of blocks,
the extensible cache) is the lab's arithmetic in :mod:`kvcore.model.memory`.
"""

from __future__ import annotations

from typing import Sequence

from kvcore.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec


def uniform_page_group_size(bucket_sizes: Sequence[int]) -> int:
    """How many layers each KV cache group of a hybrid model holds (vLLM 0.34's
    ``kv_cache_planning._get_kv_cache_groups_uniform_page_size``), given the number of layers
    of each kind: the smallest kind's count, or the largest's when no kind has 1.5 times as
    many layers as the smallest. One block of the shared pool is this many pages."""
    smallest, largest = min(bucket_sizes), max(bucket_sizes)
    return largest if largest < smallest * 1.5 else smallest


def unify_hybrid_kv_cache_specs(kv_cache_spec: dict) -> None:
    """With the hybrid KV cache manager off, make every layer's spec one kind, in place (vLLM
    0.34.0: ``kv_cache_planning.unify_hybrid_kv_cache_specs``, called first thing by
    ``get_kv_cache_groups`` when ``disable_hybrid_kv_cache_manager`` is set).

    ``kv_cache_spec`` maps layer names to specs. Specs that are already one kind are left as they
    are (every layer sliding with one window stays sliding). When full-attention and
    sliding-window layers are both present, every sliding-window layer gets a
    ``FullAttentionSpec`` (of the full-attention layers' block size when they share one): it is
    then given a block for every token of a request, and keeps them all, though its attention
    still reads only its window. Nothing else is converted: a Mamba (state) layer beside
    attention layers leaves two kinds, and that is a ValueError, as in vLLM ("Failed to promote
    local KV cache specs to one unified type"; vLLM keeps apart only the attention layers whose
    cache is not sharded across decode context parallel ranks, which the lab does not model)."""
    if len(set(kv_cache_spec.values())) <= 1:
        return
    specs = kv_cache_spec.values()
    full_sizes = {s.block_size for s in specs if isinstance(s, FullAttentionSpec)}
    if full_sizes and any(isinstance(s, SlidingWindowSpec) for s in specs):
        for name, spec in list(kv_cache_spec.items()):
            if isinstance(spec, SlidingWindowSpec):
                size = next(iter(full_sizes)) if len(full_sizes) == 1 else spec.block_size
                kv_cache_spec[name] = FullAttentionSpec(size)
    if len(set(kv_cache_spec.values())) > 1:
        raise ValueError("Failed to promote local KV cache specs to one unified type.")
