"""Prompt tokens from a trace's hash ids, so the prefix cache shares exactly what the trace shares.

Trace block ``h`` of a prompt becomes tokens that all carry one value, ``block_token(h) = h + 1``,
a one-to-one function of the id. Two prompts compare tokens at the same position, which lies
in the same trace block position ``j`` of both, so they have equal tokens there exactly when the
trace gives them the same id at that block position. With chained block hashing at any
``block_size`` that divides the trace's block, two requests then share their first k cache blocks
exactly when their first ``k * block_size`` tokens lie in trace blocks with equal ids: the trace's
sharing, no more and no less.

The values fit a signed 32-bit token id for every hash id up to ``MAX_HASH_ID``: vLLM
0.34 keeps a request's token ids in an int32 buffer (``vllm/v1/token_buffer.py``), which refuses a
larger value, as a real vocabulary never needs one. (An earlier pairing of id and position
overflowed it from ids near 65,536 on, and made the replay on vLLM 0.34 crash on such traces.)
kvcore's own lists take any value.

The last trace block is partial when ``input_length`` is not a multiple of the trace block: it
yields only its ``input_length - (n - 1) * trace_block`` tokens. Equal ids there mean equal
content (the trace hashed those tokens), so the cache blocks that are full inside it can be
shared; the partial cache block at its end never is (vLLM caches full blocks only).

Answers are ``PLACEHOLDER_TOKEN`` (0), a value no prompt token takes, so a prompt never hits a
block that holds generated tokens (the trace says nothing about answers being reused).
"""

from __future__ import annotations

from typing import Optional, Sequence

from kvcore.core.kv_cache_utils import RequestBlockHasher
from paged_kv_lab.text.i18n import Text
from paged_kv_lab.workloads.trace_formats import TraceRequest

PLACEHOLDER_TOKEN = 0
MAX_HASH_ID = (1 << 31) - 2  # the largest id whose token fits a signed 32-bit token id
MEMO_BLOCKS = 1 << 18  # SharedBlockHasher's memo starts again past this many blocks


def block_token(hash_id: int) -> int:
    """The token value of trace block ``hash_id`` (>= 1, never the placeholder); a signed 32-bit
    value when ``hash_id <= MAX_HASH_ID``."""
    return hash_id + 1


def prompt_token_ids(request: TraceRequest, trace_block_size: int) -> list[int]:
    """The request's ``input_length`` prompt tokens, trace block by trace block."""
    out: list[int] = []
    last = len(request.hash_ids) - 1
    for j, h in enumerate(request.hash_ids):
        n = trace_block_size if j < last else request.input_length - last * trace_block_size
        out += [block_token(h)] * n
    return out


class SharedBlockHasher(RequestBlockHasher):
    """kvcore's ``RequestBlockHasher`` with a memo of the blocks whose tokens all carry one value.

    Every cache block of a prompt made here is such a block (a cache block lies inside one
    trace block), and the requests of a trace share most of them: a block's hash is a function
    of its parent's hash and its tokens only, so one computed for (parent, value) is the hash of
    every later block with that parent and value. Each block is checked to hold one value before
    the memo is read (never assumed); any other block, and any request with a salt or extra hash
    keys, is hashed by kvcore's own loop. The memo holds at most ``MEMO_BLOCKS`` blocks (it
    starts again when full). The hashes are kvcore's, block for block (tests/lab/
    test_replay.py)."""

    def __init__(self, base: RequestBlockHasher) -> None:
        super().__init__(base.hash_fn, base.block_size, base.none_hash_seed)
        self._memo: dict[tuple[bytes, int], bytes] = {}

    def __getstate__(self) -> dict:
        """A copy (a replay's checkpoint) starts with an empty memo: it holds no state."""
        return {**self.__dict__, "_memo": {}}

    def share_memo(self, other: "SharedBlockHasher") -> None:
        """Read and fill ``other``'s memo from now on (a replay resumed from a checkpoint: the
        one it was taken from made the hashes of the requests it is about to meet). The memo is
        a function of (parent, value) under one hash function and block size; a hasher with
        another keeps its own."""
        if (other.hash_fn, other.block_size, other.none_hash) == (
            self.hash_fn,
            self.block_size,
            self.none_hash,
        ):
            self._memo = other._memo

    def new_block_hashes(
        self,
        block_hashes: Sequence[bytes],
        token_ids: Sequence[int],
        cache_salt: Optional[str],
        request=None,
    ) -> list[bytes]:
        if cache_salt or (request is not None and request.has_extra_hash_keys):
            return super().new_block_hashes(block_hashes, token_ids, cache_salt, request)
        bs = self.block_size
        start = len(block_hashes) * bs
        end = len(token_ids) - bs
        if start > end:
            return []
        hash_fn = self.hash_fn
        memo = self._memo
        parent = block_hashes[-1] if block_hashes else self.none_hash
        new = []
        for i in range(start, end + 1, bs):
            block = token_ids[i : i + bs]
            value = block[0]
            if block.count(value) == bs:
                key = (parent, value)
                h = memo.get(key)
                if h is None:
                    if len(memo) >= MEMO_BLOCKS:
                        memo.clear()
                    h = memo[key] = hash_fn((parent, tuple(block), None))
            else:
                h = hash_fn((parent, tuple(block), None))
            new.append(h)
            parent = h
        return new


def check_block_size(block_size: int, trace_block_size: int) -> None:
    """ScenarioError (a ValueError) unless ``block_size`` divides the trace's block (else a cache
    block would straddle two trace blocks and share what the trace does not say is shared)."""
    from paged_kv_lab.run.scenario import ScenarioError

    if block_size < 1 or trace_block_size % block_size:
        divisors = [d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if trace_block_size % d == 0]
        at = {
            "got": block_size,
            "trace": trace_block_size,
            "divisors": ", ".join(map(str, divisors)),
        }
        raise ScenarioError([Text("problem.replay.block_size", at)])
