"""The extra keys in a block's hash, as vLLM 0.33's generate_block_hash_extra_keys builds them:
a LoRA adapter (every block), the multimodal items a block touches (with their offset from the
block's start), prompt embeddings (a digest of the block's rows) and cache_salt (block 0).
Checked here against vLLM's formula written out independently;
tests/differential/test_hybrid_vs_vllm.py compares them with vLLM's own code (skips without the vLLM
venv)."""

import hashlib
import struct

from kvcore.core.kv_cache_utils import get_request_block_hasher
from kvcore.distributed.kv_events import BlockStored
from kvcore.lora.request import LoRARequest
from kvcore.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from kvcore.request import Request
from kvcore.utils.hashing import get_hash_fn_by_name
from support.kv import VLLM_NONE_HASH_SHA256, admit, make_manager, vllm_sha256

BS = 4
SQL = LoRARequest("sql", 1, "/adapters/sql")


def req(rid, tokens, **kw):
    hasher = get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))
    return Request(rid, list(tokens), 4, block_hasher=hasher, **kw)


def image(ident, offset, length):
    return MultiModalFeatureSpec(ident, PlaceholderRange(offset, length))


def test_hashes_follow_vllms_formula():
    rows = [struct.pack("<2f", t, t / 4) for t in range(8)]
    r = req(
        "a",
        range(8),
        lora_request=SQL,
        mm_features=[image("img", 2, 4)],
        cache_salt="s",
        prompt_embeds=rows,
    )
    lora = ("lora", "sql", "/adapters/sql")
    digest = [hashlib.sha256(b"".join(rows[i : i + 4])).digest() for i in (0, 4)]
    want0 = (lora, ("mm", "img", 2), ("cache_salt", "s"), ("prompt_embeds", digest[0]))
    want1 = (lora, ("mm", "img", -2), ("prompt_embeds", digest[1]))  # the image began before
    h0 = vllm_sha256((VLLM_NONE_HASH_SHA256, (0, 1, 2, 3), want0))
    h1 = vllm_sha256((h0, (4, 5, 6, 7), want1))
    assert r.block_hashes == [h0, h1]
    assert r.extra_keys_for_block(1) == want1


def test_a_base_request_never_hits_an_adapters_blocks_nor_one_adapter_another():
    kvm = make_manager(30, BS)
    prompt = list(range(13))
    admit(kvm, req("sql", prompt, lora_request=SQL))
    _, _, hit_base = admit(kvm, req("base", prompt))
    _, _, hit_other = admit(kvm, req("chat", prompt, lora_request=LoRARequest("chat", 2, "/c")))
    _, _, hit_same = admit(kvm, req("sql2", prompt, lora_request=SQL))
    assert (hit_base, hit_other, hit_same) == (0, 0, 12)


def test_the_same_placeholders_with_another_image_share_only_the_blocks_before_it():
    prompt = [9] * 16
    a = req("a", prompt, mm_features=[image("cat", 6, 4)])
    b = req("b", prompt, mm_features=[image("dog", 6, 4)])
    moved = req("c", prompt, mm_features=[image("cat", 5, 4)])
    assert a.block_hashes[0] == b.block_hashes[0]  # block 0 is before the image
    assert a.block_hashes[1] != b.block_hashes[1]
    assert a.block_hashes[1] != moved.block_hashes[1]  # the same image one token earlier


def test_events_carry_the_adapter_and_the_keys_untagged():
    kvm = make_manager(30, BS)
    admit(kvm, req("a", range(9), lora_request=SQL, mm_features=[image("img", 1, 2)]))
    (ev,) = [e for e in kvm.take_events() if isinstance(e, BlockStored)]
    assert (ev.lora_id, ev.lora_name) == (1, "sql")
    assert ev.extra_keys == [("sql", ("img", 1)), ("sql",)]
