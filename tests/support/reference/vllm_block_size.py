"""vLLM 0.34.0's side of tests/lab/test_hybrid_block_size.py, run by the vLLM scratch environment's
Python: for each case (JSON on stdin: a Qwen3.5-style shape, dtypes, mamba_cache_mode, a stated
block size or null, the KV budget in bytes), vLLM's own ``Platform._align_hybrid_block_size``
resolves the block size on a GPU with the FlashAttention backend, vLLM's own specs are built for
every layer, and vLLM's own ``get_kv_cache_groups`` and ``get_kv_cache_config_from_groups`` turn
the budget into ``num_blocks``. Writes, as JSON, one ``{block_size, mamba_page_size_padded,
page_size_bytes, num_blocks, max_concurrency}`` per case (the last from vLLM's
``get_max_concurrency_for_kv_cache_config``).

What is not vLLM's here is only what a loaded model would supply: the config (a namespace with
the shape's fields), the list of attention backends (FlashAttention), the Mamba layers' prefill
checkpoint alignment (the case's: 64 is FlashInfer's gated delta-net prefill in align mode,
null a backend that exports none), and the model class, whose two state methods are Qwen3.5's
own, calling vLLM's ``MambaStateShapeCalculator`` / ``MambaStateDtypeCalculator``."""

import contextlib
import json
import sys
from types import SimpleNamespace as NS

import torch
import vllm.config.vllm as vllm_config_module
import vllm.model_executor.layers.mamba.abstract as mamba_abstract
from vllm.config.cache import CacheConfig
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
)
from vllm.model_executor.models import ModelRegistry
from vllm.platforms.interface import Platform
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.core import kv_cache_planning, kv_cache_utils
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Qwen35StateMethods:
    """Qwen3_5ForCausalLM's two classmethods the alignment calls (its module needs packages the
    scratch environment lacks), at one GPU and no speculative tokens."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        h = vllm_config.model_config.hf_text_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            1,
            h.linear_num_key_heads,
            h.linear_num_value_heads,
            h.linear_key_head_dim,
            h.linear_value_head_dim,
            h.linear_conv_kernel_dim,
            0,
        )

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        c = vllm_config.cache_config
        return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
            vllm_config.model_config.dtype, c.mamba_cache_dtype, c.mamba_ssm_cache_dtype
        )


def resolve(case: dict) -> dict:
    shape = NS(**case["shape"])
    dtype = DTYPES[case["dtype"]]
    stated = case["block_size"]
    cache = NS(
        cache_dtype="auto",
        block_size=stated if stated is not None else CacheConfig.DEFAULT_BLOCK_SIZE,
        user_specified_block_size=stated is not None,
        mamba_cache_mode=case["mamba_cache_mode"],
        mamba_cache_dtype="auto",
        mamba_ssm_cache_dtype=case.get("ssm_dtype") or "auto",
        mamba_block_size=None,
        mamba_page_size_padded=None,
        kv_cache_dtype_skip_layers=None,
        prefix_match_unit=None,
        num_gpu_blocks_override=None,
        prefix_cache_retention_interval=0,
        get_resolved_kv_cache_layout=lambda: KVCacheLayout.LBHNC,
    )
    model = NS(
        dtype=dtype,
        use_mla=False,
        hf_text_config=shape,
        architecture="Qwen3_5ForCausalLM",
        get_num_kv_heads=lambda parallel: shape.num_key_value_heads,
        get_head_size=lambda: shape.head_dim,
        is_hybrid=True,
        max_model_len=case["max_model_len"],
    )
    config = NS(
        cache_config=cache,
        model_config=model,
        parallel_config=NS(
            tensor_parallel_size=1, decode_context_parallel_size=1, prefill_context_parallel_size=1
        ),
        speculative_config=None,
        scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
        attention_config=NS(hisparse_config=None),
        use_flashinfer_replayssm=False,  # read by 0.34's mamba_state_alignment (1 without it)
    )
    mamba_abstract.get_mamba_prefill_checkpoint_alignment = lambda c: case["checkpoint_alignment"]
    if stated is None:  # Phase 1 of update_block_size_for_backend: the backend's preference
        cache.block_size = FlashAttentionBackend.get_preferred_block_size(cache.block_size)
    Platform._align_hybrid_block_size(config, FlashAttentionBackend)
    if cache.mamba_cache_mode != "align":  # MambaModelConfig: a state block per max_model_len
        cache.mamba_block_size = model.max_model_len
    states = Qwen35StateMethods.get_mamba_state_shape_from_config(config)
    state_dtypes = Qwen35StateMethods.get_mamba_state_dtype_from_config(config)
    specs = {}
    for i, kind in enumerate(shape.layer_types):
        if kind == "full_attention":
            specs[f"layers.{i}"] = FullAttentionSpec(
                block_size=cache.block_size,
                num_kv_heads=shape.num_key_value_heads,
                head_size=shape.head_dim,
                dtype=dtype,
            )
        else:
            specs[f"layers.{i}"] = MambaSpec(
                shapes=states,
                dtypes=state_dtypes,
                block_size=cache.mamba_block_size,
                page_size_padded=cache.mamba_page_size_padded,
                mamba_cache_mode=cache.mamba_cache_mode,
            )
    groups = kv_cache_planning.get_kv_cache_groups(config, specs)
    kv = kv_cache_planning.get_kv_cache_config_from_groups(config, groups, case["budget"])
    return {
        "block_size": cache.block_size,
        "mamba_page_size_padded": cache.mamba_page_size_padded,
        "page_size_bytes": groups[0].kv_cache_spec.page_size_bytes,
        "num_blocks": kv.num_blocks,
        "max_concurrency": kv_cache_utils.get_max_concurrency_for_kv_cache_config(config, kv),
    }


def main() -> None:
    # set_current_vllm_config wants a real VllmConfig; the backend reads nothing from it here
    vllm_config_module.set_current_vllm_config = lambda c: contextlib.nullcontext()
    ModelRegistry.resolve_model_cls = lambda *a, **k: (Qwen35StateMethods, "Qwen3_5ForCausalLM")
    # the model's attention layers' backends (a built model's layers say; here FlashAttention)
    Platform._find_non_ssm_backends = classmethod(lambda cls, c: [FlashAttentionBackend])
    print(json.dumps([resolve(case) for case in json.load(sys.stdin)]))


if __name__ == "__main__":
    main()
