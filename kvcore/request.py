"""A generation request as the scheduler sees it (vLLM v1: request)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence

from kvcore.core.kv_cache_utils import (
    RequestBlockHasher,
    cache_salt_extra_keys,
    generate_block_hash_extra_keys,
)
from kvcore.lora.request import LoRARequest
from kvcore.multimodal.inputs import MultiModalFeatureSpec

if TYPE_CHECKING:
    from kvcore.engine import EngineCoreRequest

# vLLM's SamplingParams.extra_args["kv_cache_report_mode"]: "incremental" (the default) publishes
# a BlockStored only when a block enters the prefix cache; "full" also publishes the blocks a
# request hits, so an external router learns this request holds them too (as vLLM, any other
# value reads as "incremental").
KV_CACHE_REPORT_INCREMENTAL = "incremental"
KV_CACHE_REPORT_FULL = "full"


class RequestStatus(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    # a CPU-tier (connector) hit is being copied into its GPU blocks; it runs the step after
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH_CAPPED = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    # a KV connector failed to load its K/V and kv_load_failure_policy is "fail"
    FINISHED_ERROR = "finished_error"

    @property
    def finished(self) -> bool:
        return self.value.startswith("finished")


class Request:
    """Token state of one request.

    Invariants: ``all_token_ids`` = prompt + outputs; ``num_computed_tokens`` is the
    number of leading tokens whose K/V is (or is being) written in the pool, so it
    never exceeds ``num_tokens``; ``block_hashes`` holds the chained hash of every
    full block of ``all_token_ids``.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Optional[list[int]],
        max_tokens: int,
        arrival_time: int = 0,
        priority: int = 0,
        cache_salt: Optional[str] = None,
        eos_token_ids: Iterable[int] = (),
        ignore_eos: bool = False,
        block_hasher: Optional[RequestBlockHasher] = None,
        lora_request: Optional[LoRARequest] = None,
        mm_features: Sequence[MultiModalFeatureSpec] = (),
        prompt_embeds: Optional[Sequence[bytes]] = None,
        kv_transfer_params: Optional[dict[str, Any]] = None,
        stop_token_ids: Iterable[int] = (),
        prompt_logprobs: Optional[int] = None,
        skip_reading_prefix_cache: Optional[bool] = None,
        session_id: Optional[str] = None,
        kv_cache_report_mode: str = KV_CACHE_REPORT_INCREMENTAL,
        block_hashes: Optional[list[bytes]] = None,
    ) -> None:
        if max_tokens < 1:
            raise ValueError(f"request {request_id!r}: max_tokens must be >= 1")
        if prompt_token_ids is None:
            if prompt_embeds is None:
                raise ValueError(f"request {request_id!r}: neither token ids nor embeddings")
            # vLLM keeps prompt_token_ids None for an embeddings-only prompt and gives it one
            # token id 0 per row; the zeros stand in for the ids here too (they are what its
            # block hashes hash, beside each block's embedding bytes).
            prompt_token_ids = [0] * len(prompt_embeds)
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.max_tokens = max_tokens
        self.arrival_time = arrival_time
        self.priority = priority
        self.cache_salt = cache_salt or None
        self.eos_token_ids = frozenset(eos_token_ids)
        self.ignore_eos = ignore_eos
        # vLLM's SamplingParams.stop_token_ids: a request stops on one of them, EOS or not, and
        # records it as its stop_reason (None: it stopped otherwise, or runs)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.stop_reason: Optional[int] = None
        # vLLM's SamplingParams.prompt_logprobs: the top logprobs of every prompt token (-1: the
        # whole vocabulary). Only its effect on the cache is modelled: the model runner returns
        # no logprobs.
        self.prompt_logprobs = prompt_logprobs
        if skip_reading_prefix_cache is None:  # as SamplingParams.__post_init__ sets it
            # a prompt token read from the cache gets no logits, hence no prompt logprobs
            skip_reading_prefix_cache = prompt_logprobs is not None
        # vLLM's Request.skip_reading_prefix_cache: no prefix-cache (or connector) hit is read
        # for it; its blocks are still cached for the requests after it.
        self.skip_reading_prefix_cache = skip_reading_prefix_cache
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        # Set at each admission: where a hybrid model's longest single-group hit ends
        # (0 if none); the sliding-window group keeps the blocks ending there.
        self.shared_prefix_boundary = 0
        # Prompt block hashes a frontend computed (vLLM 0.34: ``frontend_block_hashes`` let them
        # through); the hasher goes on from the first block they do not cover. As vLLM's, the
        # request keeps the list it is given (no copy) and appends to it.
        self.block_hashes: list[bytes] = block_hashes or []
        # Draft tokens proposed for the next step (speculative decoding); never in all_token_ids.
        self.spec_token_ids: list[int] = []
        # Set when scheduled: this step ends before the request's last token (it samples nothing)
        self.is_prefill_chunk = False
        # Extra keys of every block hash (generate_block_hash_extra_keys): the adapter, the
        # multimodal items sorted by offset, one embedding row (raw bytes) per prompt token.
        self.lora_request = lora_request
        self.mm_features = sorted(mm_features, key=lambda f: f.mm_position.offset)
        if prompt_embeds is not None and len(prompt_embeds) != len(self.prompt_token_ids):
            raise ValueError(f"request {request_id!r}: one embedding row per prompt token")
        self.prompt_embeds = prompt_embeds
        self._prompt_embeds_per_block_hashes: dict[tuple[int, int], bytes] = {}
        self.has_extra_hash_keys = bool(lora_request or self.mm_features or prompt_embeds)
        self._block_hasher = block_hasher
        # vLLM's SamplingParams.extra_args["kv_transfer_params"]: what a KV connector needs to
        # move this request's K/V between engines (disaggregated prefill); None: nothing moves.
        self.kv_transfer_params = kv_transfer_params
        # The session that sent it: published on its BlockStored events, no part of any hash.
        self.session_id = session_id
        self.kv_cache_report_mode = kv_cache_report_mode
        self.update_block_hashes()

    @classmethod
    def from_engine_core_request(
        cls,
        request: "EngineCoreRequest",
        block_hasher: Optional[RequestBlockHasher],
        block_hashes: Optional[list[bytes]] = None,
    ) -> "Request":
        """The engine core's Request for what a frontend sent (vLLM's name). ``block_hashes``:
        the frontend's prompt hashes that ``frontend_block_hashes`` let through (None: the
        hasher hashes the prompt itself)."""
        return cls(
            request.request_id,
            request.prompt_token_ids,
            request.max_tokens,
            arrival_time=request.arrival_time,
            priority=request.priority,
            cache_salt=request.cache_salt,
            block_hasher=block_hasher,
            lora_request=request.lora_request,
            mm_features=request.mm_features,
            block_hashes=block_hashes,
        )

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def is_finished(self) -> bool:
        return self.status.finished

    def extra_keys_for_block(self, block_index: int) -> Optional[tuple]:
        """The extra keys hash ``block_index`` (at the hasher's block size) was made with."""
        if not self.has_extra_hash_keys or self._block_hasher is None:
            return cache_salt_extra_keys(self.cache_salt, block_index)
        bs = self._block_hasher.block_size
        return self.extra_keys_for_range(block_index * bs, (block_index + 1) * bs)

    def extra_keys_for_range(self, start: int, end: int) -> Optional[tuple]:
        """The extra keys of tokens [start, end) (a cache block wider than a hash block)."""
        return generate_block_hash_extra_keys(self, start, end, 0)[0]

    def append_output_token_ids(self, token_ids: Iterable[int]) -> None:
        token_ids = list(token_ids)
        self.output_token_ids.extend(token_ids)  # as vLLM: two extends, then the new hashes
        self.all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def update_block_hashes(self) -> None:
        """Append the hashes of the full blocks the list does not cover yet (vLLM's name)."""
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def __lt__(self, other: "Request") -> bool:
        return (self.priority, self.arrival_time, self.request_id) < (
            other.priority,
            other.arrival_time,
            other.request_id,
        )

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, "
            f"{self.num_computed_tokens}/{self.num_tokens})"
        )
