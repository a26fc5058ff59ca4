"""The topic pages' live evidence, measured on the loaded model (no Streamlit).

Three studies, each a real engine run (``record.engine.Engine``) on the model the app loaded:

- ``block_size_study``: the same requests at block sizes 4 / 16 / 64: each request's block table
  length and the empty slots of its last block, the prefix hit of a second request, and the bytes
  of one block from the model's config;
- ``hash_study``: every block hash one run computed, and the birthday probability that any two of
  them collide at 256 (sha256), 128 (xxh3-128) and 64 bits (nano-vllm's xxh64);
- ``ttft_study``: time to first token of one prompt without a prefix hit and with one, measured
  step by step, rounds interleaved, the best of each kept.

And one model-free study, ``hash_keys_study``: one prompt (the model's tokenizer) sent as seven
variants that differ only in what vLLM hashes beside the token ids (a LoRA adapter, an image's
placeholder range, prompt embeddings, a cache salt), each variant's block hashes and extra keys,
and the prefix hits kvcore's own KVCacheManager gives a second request of each variant.

The caller runs them one at a time on a model shared by every session (the UI holds the engine
lock), so nothing here locks.
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from kvcore.core.kv_cache_manager import KVCacheManager
from kvcore.core.kv_cache_utils import get_request_block_hasher
from kvcore.kv_cache_interface import KVCacheConfig, full_attention
from kvcore.lora.request import LoRARequest
from kvcore.model.memory import bytes_per_block, model_dims
from kvcore.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from kvcore.request import Request
from kvcore.utils.hashing import get_hash_fn_by_name
from kvcore.utils.math_utils import cdiv
from paged_kv_lab.run.engine import Engine
from paged_kv_lab.run.scenario import load_scenario

BLOCK_SIZES = (4, 16, 64)

# Two chat requests: SmolLM2's chat template gives them the same system prompt, the only prefix
# they share; B arrives when A has finished, so A's blocks are cached and free.
BLOCK_SIZE_REQUESTS = (
    {"id": "A", "prompt": "What is a KV cache?", "chat": True, "max_tokens": 6},
    {"id": "B", "prompt": "Name three colors.", "chat": True, "max_tokens": 6, "arrival_step": 9},
)

# A document read twice: the second read hits every full block of the first.
TTFT_PROMPT = (
    "Paged attention stores the keys and values of every token in fixed-size blocks. "
    "A request owns a block table that maps its logical blocks to physical ones, so its "
    "memory need not be contiguous, and a full block can be shared by every request whose "
    "prompt starts with the same tokens. "
) * 3 + "In one sentence: what does a block table map?"


def _run(model, engine: dict, requests: Sequence[dict], name: str) -> Engine:
    scenario = load_scenario(
        {
            "name": name,
            "model": model.name,
            "engine": engine,
            "requests": [dict(r, ignore_eos=True) for r in requests],
        }
    )
    eng = Engine(scenario, model=model)
    eng.run()
    return eng


def _prompt_ids(model, requests: Sequence[dict]) -> list[list[int]]:
    return [model.encode_prompt(r["prompt"], r.get("chat", True)) for r in requests]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# -- block size -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestAtSize:
    """One request's blocks at its largest: ``slots`` = table length × block_size, of which
    ``computed`` hold K/V; the rest of the last block is empty (``empty``)."""

    request_id: str
    num_tokens: int  # prompt + output
    table_len: int
    slots: int
    computed: int

    @property
    def empty(self) -> int:
        return self.slots - self.computed


@dataclass(frozen=True)
class BlockSizeRow:
    """The same requests run at one block size."""

    block_size: int
    requests: tuple[RequestAtSize, ...]
    shared_prefix: int  # tokens A's and B's prompts share
    hit_tokens: int  # B's prefix-cache hit
    bytes_per_block: int  # all layers, K and V, the model's dtype
    bytes_per_layer: int  # one layer's page (vLLM allocates per layer)

    @property
    def hit_blocks(self) -> int:
        return self.hit_tokens // self.block_size


_NOT_YET = RequestAtSize("", 0, 0, -1, 0)  # below any table


def block_size_study(model, sizes: Sequence[int] = BLOCK_SIZES) -> list[BlockSizeRow]:
    ids = _prompt_ids(model, BLOCK_SIZE_REQUESTS)
    shared = common_prefix(*ids)
    longest = max(len(p) for p in ids) + max(r["max_tokens"] for r in BLOCK_SIZE_REQUESTS)
    layers = model_dims(model.config)[0]
    rows = []
    for bs in sizes:
        engine = {
            "block_size": bs,
            "num_gpu_blocks": 2 * cdiv(longest, bs) + 2,
            "max_num_seqs": 2,
            "max_num_batched_tokens": 256,
        }
        eng = _run(model, engine, BLOCK_SIZE_REQUESTS, f"topic-block-size-{bs}")
        largest: dict[str, RequestAtSize] = {}
        for rec in eng.history:
            for rv in rec.snapshot.requests:
                table = rv.block_tables[0] if rv.block_tables else ()
                if table and len(table) * bs >= largest.get(rv.request_id, _NOT_YET).slots:
                    largest[rv.request_id] = RequestAtSize(
                        rv.request_id,
                        rv.num_prompt_tokens + rv.num_output_tokens,
                        len(table),
                        len(table) * bs,
                        rv.num_computed_tokens,
                    )
        hit_b = sum(
            e.num_tokens
            for r in eng.history
            for e in r.events
            if e.kind == "cache_hit" and e.request_id == "B"
        )
        per_block = bytes_per_block(model.config, bs, model.dtype)
        rows.append(
            BlockSizeRow(
                bs,
                tuple(largest[r["id"]] for r in BLOCK_SIZE_REQUESTS),
                shared,
                hit_b,
                per_block,
                per_block // layers,
            )
        )
    return rows


# -- hash collisions ------------------------------------------------------------------------
HASH_BITS = {"sha256": 256, "xxhash": 128, "nano-vllm xxh64": 64}


def collision_probability(n: int, bits: int) -> float:
    """The birthday bound: the chance that some two of ``n`` random ``bits``-bit hashes are equal,
    1 − exp(−n(n−1) / 2^(bits+1))."""
    if n < 2:
        return 0.0
    return -math.expm1(-n * (n - 1) / 2.0 ** (bits + 1))


def hashes_for_probability(p: float, bits: int) -> float:
    """How many distinct hashes make the collision probability about ``p``."""
    return math.sqrt(-math.log1p(-p) * 2.0 ** (bits + 1))


@dataclass(frozen=True)
class HashedBlock:
    step: int
    request_id: str
    block_id: int
    block_hash: str  # hex
    num_tokens: int  # prefix length the hash stands for
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class HashStudy:
    hash_algo: str
    digest_bytes: int
    none_hash_seed: str
    none_hash: str  # hex
    blocks: tuple[HashedBlock, ...]  # every block the run cached, in order

    @property
    def distinct(self) -> int:
        return len({b.block_hash for b in self.blocks})

    def probabilities(self) -> dict[str, float]:
        return {name: collision_probability(self.distinct, b) for name, b in HASH_BITS.items()}


def hash_study(model, scenario: dict, hash_algo: str = "sha256") -> HashStudy:
    """``scenario`` (a lesson's, in the engine's format) run with ``hash_algo``; its hashes."""
    d = dict(scenario, model=model.name, engine=dict(scenario["engine"], hash_algo=hash_algo))
    eng = Engine(load_scenario(d), model=model)
    eng.run()
    blocks = []
    for rec in eng.history:
        views = {b.block_id: b for b in rec.snapshot.blocks}
        for e in rec.events:
            if e.kind != "cached":
                continue
            for bid, h in zip(e.block_ids, e.block_hashes):
                v = views[bid]
                blocks.append(
                    HashedBlock(
                        rec.step,
                        e.request_id or "",
                        bid,
                        h,
                        v.block_hash_num_tokens or 0,
                        tuple(v.token_ids),
                    )
                )
    none_hash = eng.hasher.none_hash
    return HashStudy(
        hash_algo,
        len(none_hash),
        eng.none_hash_seed,
        none_hash.hex(),
        tuple(blocks),
    )


# -- time to first token --------------------------------------------------------------------
@dataclass(frozen=True)
class TTFTRound:
    cold_s: float  # the first step of the prompt on an empty cache
    hit_s: float  # the same prompt's first step once it is cached
    hit_tokens: int


@dataclass(frozen=True)
class TTFTStudy:
    """Time to first token of one prompt, without and with a prefix hit, on the loaded model."""

    prompt_tokens: int
    block_size: int
    rounds: tuple[TTFTRound, ...]
    device: str
    model: str

    # The best round of each: on a shared machine the slow rounds measure the other work.
    @property
    def cold_s(self) -> float:
        return min(r.cold_s for r in self.rounds)

    @property
    def hit_s(self) -> float:
        return min(r.hit_s for r in self.rounds)

    @property
    def hit_tokens(self) -> int:
        return self.rounds[0].hit_tokens

    @property
    def computed_with_hit(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def speedup(self) -> float:
        return self.cold_s / self.hit_s if self.hit_s > 0 else math.inf


def _first_token_seconds(eng: Engine, rid: str) -> tuple[float, Any]:
    """Step the engine until ``rid`` has its first output token; the wall time it took."""
    t0 = time.perf_counter()
    while True:
        rec = eng.step()
        if rec.new_tokens.get(rid):
            return time.perf_counter() - t0, rec


def ttft_study(model, rounds: int = 3, block_size: int = 16) -> TTFTStudy:
    from paged_kv_lab.run.scenario import RequestSpec

    ids = model.encode_prompt(TTFT_PROMPT, True)
    n = len(ids)
    settings = {
        "block_size": block_size,
        "num_gpu_blocks": 2 * cdiv(n + 1, block_size) + 2,
        "max_num_seqs": 1,
        "max_num_batched_tokens": max(256, n),
    }
    # one forward first, so that the first timed one pays no start-up cost
    _run(model, settings, ({"id": "W", "prompt": "Hi", "max_tokens": 1},), "ttft-warmup")
    out = []
    for i in range(rounds):
        eng = Engine(
            load_scenario(
                {"name": f"ttft-{i}", "model": model.name, "engine": settings, "requests": []}
            ),
            model=model,
        )
        timed = []
        for rid in ("cold", "hit"):
            eng.add_request(RequestSpec(id=rid, prompt_token_ids=ids, max_tokens=1))
            secs, rec = _first_token_seconds(eng, rid)
            hit = sum(e.num_tokens for e in rec.events if e.kind == "cache_hit")
            timed.append((secs, hit))
            eng.run()
        out.append(TTFTRound(timed[0][0], timed[1][0], timed[1][1]))
    return TTFTStudy(n, block_size, tuple(out), str(model.device), model.name)


# -- what else is in a block's hash ---------------------------------------------------------
HASH_KEYS_BLOCK_SIZE = 16
# A question about a picture, as a chat: five full blocks of 16 with SmolLM2's template.
HASH_KEYS_PROMPT = (
    "Here is a photo from my trip. Look at it closely and tell me what season it was taken "
    "in, which country it might show, and what the weather was like that day. Then suggest a "
    "title for it in five words or fewer, and explain your choice in one sentence."
)
# The image's placeholder tokens: 24 spans two or three blocks of 16, wherever it starts.
IMAGE_LENGTH = 24
# Stand-ins for what vLLM computes from real content: an image's identifier is the hash of its
# pixels (the multimodal processor's), and a prompt-embedding row is the model's input vector.
IMAGE_ID = hashlib.sha256(b"paged-kv-lab: a photo").hexdigest()
LORAS = {"lora_sql": ("sql", 1, "/adapters/sql"), "lora_chat": ("chat", 2, "/adapters/chat")}
SALT = "tenant-1"
# The variants in the order shown; "embeds_b" differs from "embeds_a" in one row (the middle one).
HASH_VARIANTS = ("plain", "lora_sql", "lora_chat", "image", "embeds_a", "embeds_b", "salt")
# A variant -> the one its third hit column compares it with.
HASH_NEIGHBOUR = {"lora_chat": "lora_sql", "embeds_b": "embeds_a"}


@dataclass(frozen=True)
class KeyedBlock:
    """One full block of a variant: its chained hash (hex) and the extra keys it was made with,
    exactly as ``generate_block_hash_extra_keys`` returns them (None: no extra keys)."""

    block_hash: str
    extra_keys: Optional[tuple]


@dataclass(frozen=True)
class HashVariant:
    """One variant of the prompt. ``hit_after_*``: the full blocks a second request of this
    variant hits (kvcore's KVCacheManager.get_computed_blocks) when the plain prompt's request,
    one request of this variant, or one of ``neighbour`` ran and freed its blocks before it."""

    variant: str
    blocks: tuple[KeyedBlock, ...]
    hit_after_plain: int
    hit_after_itself: int
    neighbour: Optional[str] = None
    hit_after_neighbour: Optional[int] = None


@dataclass(frozen=True)
class HashKeysStudy:
    """The prompt's variants; the image's placeholder range is [image_offset, image_offset +
    image_length), and the rows of ``embeds_b`` differ from ``embeds_a`` at ``embeds_row``.
    Invariant: every variant has the same token ids and so the same number of full blocks."""

    token_ids: tuple[int, ...]
    block_size: int
    image_offset: int
    image_length: int
    embeds_row: int
    variants: tuple[HashVariant, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.token_ids) // self.block_size

    @property
    def touched(self) -> tuple[int, ...]:
        """The full blocks the image's placeholder range touches."""
        bs, end = self.block_size, self.image_offset + self.image_length
        return tuple(
            i for i in range(self.num_blocks) if i * bs < end and self.image_offset < (i + 1) * bs
        )

    def by_id(self, variant: str) -> HashVariant:
        return next(v for v in self.variants if v.variant == variant)


def max_image_offset(num_tokens: int, image_length: int = IMAGE_LENGTH) -> int:
    """The last offset at which the image's placeholders still end inside the prompt."""
    return max(0, num_tokens - image_length)


def _embeds(token_ids: Sequence[int], changed_row: Optional[int]) -> list[bytes]:
    """One made-up embedding row per token (two float32s: its id and its position); row
    ``changed_row`` negated, as if one token's vector came from elsewhere."""
    rows = []
    for i, t in enumerate(token_ids):
        sign = -1.0 if i == changed_row else 1.0
        rows.append(struct.pack("<2f", sign * t, float(i)))
    return rows


def hash_keys_request(variant: str, rid: str, study_ids, image_offset: int, embeds_row: int):
    """A kvcore Request of ``variant`` (HASH_VARIANTS) on the token ids ``study_ids``, hashed at
    HASH_KEYS_BLOCK_SIZE with sha256 (vLLM's default ``prefix_caching_hash_algo``)."""
    kw: dict[str, Any] = {}
    if variant in LORAS:
        kw["lora_request"] = LoRARequest(*LORAS[variant])
    elif variant == "image":
        kw["mm_features"] = [
            MultiModalFeatureSpec(IMAGE_ID, PlaceholderRange(image_offset, IMAGE_LENGTH))
        ]
    elif variant in ("embeds_a", "embeds_b"):
        kw["prompt_embeds"] = _embeds(study_ids, embeds_row if variant == "embeds_b" else None)
    elif variant == "salt":
        kw["cache_salt"] = SALT
    hasher = get_request_block_hasher(HASH_KEYS_BLOCK_SIZE, get_hash_fn_by_name("sha256"))
    return Request(rid, list(study_ids), 1, block_hasher=hasher, **kw)


def _hits_after(first: Sequence[Any], second: Any, num_blocks: int) -> int:
    """Full blocks ``second`` hits once each request of ``first`` was admitted, ran its prompt
    (so its full blocks are cached) and freed its blocks, on one fresh KVCacheManager."""
    kvm = KVCacheManager(
        KVCacheConfig(
            2 * (num_blocks + 2) * (len(first) + 1), (full_attention(HASH_KEYS_BLOCK_SIZE),)
        )
    )
    for req in first:
        hits, num_hit, _ = kvm.get_computed_blocks(req)
        kvm.allocate_slots(req, req.num_tokens - num_hit, num_hit, hits)
        kvm.free(req)
    _, num_hit, _ = kvm.get_computed_blocks(second)
    return num_hit // HASH_KEYS_BLOCK_SIZE


def hash_keys_study(token_ids: Sequence[int], image_offset: int) -> HashKeysStudy:
    """Every variant of ``token_ids`` with the image's placeholders from ``image_offset``."""
    ids = tuple(token_ids)
    image_offset = min(max(0, image_offset), max_image_offset(len(ids)))
    embeds_row = len(ids) // 2
    bs = HASH_KEYS_BLOCK_SIZE
    num_blocks = len(ids) // bs

    def make(variant: str, rid: str):
        return hash_keys_request(variant, rid, ids, image_offset, embeds_row)

    out = []
    for v in HASH_VARIANTS:
        req = make(v, f"{v}-1")
        blocks = tuple(
            KeyedBlock(h.hex(), req.extra_keys_for_block(i)) for i, h in enumerate(req.block_hashes)
        )
        neighbour = HASH_NEIGHBOUR.get(v)
        out.append(
            HashVariant(
                v,
                blocks,
                _hits_after([make("plain", "plain")], make(v, f"{v}-2"), num_blocks),
                _hits_after([make(v, f"{v}-1")], make(v, f"{v}-2"), num_blocks),
                neighbour,
                None
                if neighbour is None
                else _hits_after([make(neighbour, neighbour)], make(v, f"{v}-2"), num_blocks),
            )
        )
    return HashKeysStudy(ids, bs, image_offset, IMAGE_LENGTH, embeds_row, tuple(out))


def hash_keys_prompt(model) -> tuple[int, ...]:
    """The topic's prompt as the model's tokenizer gives it (a chat)."""
    return tuple(model.encode_prompt(HASH_KEYS_PROMPT, True))


__all__ = [
    "BLOCK_SIZES",
    "HASH_KEYS_BLOCK_SIZE",
    "HASH_VARIANTS",
    "HashKeysStudy",
    "HASH_BITS",
    "BlockSizeRow",
    "HashStudy",
    "TTFTStudy",
    "block_size_study",
    "collision_probability",
    "common_prefix",
    "hash_keys_prompt",
    "hash_keys_request",
    "hash_keys_study",
    "hash_study",
    "hashes_for_probability",
    "max_image_offset",
    "ttft_study",
]
